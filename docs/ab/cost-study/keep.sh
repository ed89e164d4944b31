#!/usr/bin/env bash
# Beside resume.sh, every 60 s: commit each newly finished run's records (and the machine it ran on) and each new
# warm start onto main, so a wiped machine loses no finished run.
#   setsid nohup bash docs/ab/cost-study/keep.sh >> ../keep.out 2>&1 < /dev/null &
MAIN=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
STUDY=${STUDY:-$(dirname "$MAIN")/study}
AB=$STUDY/runs/verdict-cost-study/ab
KEEP=$MAIN/docs/ab/cost-study
while true; do
  for d in "$AB"/*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    case "$name" in *.*) continue;; esac
    [ -f "$d/summary.json" ] || continue
    grep -q '"stop_reason": *"interrupted"' "$d/summary.json" && continue
    [ -f "$KEEP/runs/$name/summary.json" ] && continue
    mkdir -p "$KEEP/runs/$name"
    for f in summary.json config.toml metrics.jsonl profile_table.json; do
      [ -f "$d/$f" ] && cp "$d/$f" "$KEEP/runs/$name/"
    done
    # the machine it ran on (a run in flight at a stop is lost, so a kept run ran whole on this machine)
    printf '{"machine_id": "%s", "boot_id": "%s", "cpu": "%s", "cores": %s, "booted": "%s"}\n' \
      "$(cat /etc/machine-id)" "$(cat /proc/sys/kernel/random/boot_id)" \
      "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" "$(nproc)" "$(uptime -s)" > "$KEEP/runs/$name/machine.json"
    git -C "$MAIN" add "docs/ab/cost-study/runs/$name"
    git -C "$MAIN" commit -q -m "cost study (issue 36): $name finished; its records kept so a wiped machine loses no finished run" -- "docs/ab/cost-study/runs/$name" && echo "$(date -u) kept $name"
  done
  for f in "$STUDY"/.rollcut_cache/*; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    [ -f "$KEEP/warm-starts/$b" ] && continue
    # a warm start is written whole before it is used; wait until it has not changed for a minute
    [ $(( $(date +%s) - $(stat -c %Y "$f") )) -lt 60 ] && continue
    cp "$f" "$KEEP/warm-starts/$b"
    git -C "$MAIN" add "docs/ab/cost-study/warm-starts/$b"
    git -C "$MAIN" commit -q -m "cost study (issue 36): keep $b (a seed's warm start or before-measure cache), so a wiped machine resumes the seed from the same starting point" -- "docs/ab/cost-study/warm-starts/$b" && echo "$(date -u) kept $b"
  done
  sleep 60
done
