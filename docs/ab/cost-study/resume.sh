#!/usr/bin/env bash
# Resume issue 36's cost study on this machine (docs/ab/cost-study/README.md): a clone at the declared commit
# ($STUDY, default ../study beside the repository), the finished runs and warm starts kept on main restored into
# it, then the declared verdict, which keeps the finished runs and runs the rest. Run keep.sh beside it.
#   setsid nohup bash docs/ab/cost-study/resume.sh >> ../study.out 2>&1 < /dev/null &
set -euo pipefail
MAIN=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
STUDY=${STUDY:-$(dirname "$MAIN")/study}
PY=${PY:-$MAIN/.venv/bin/python}
[ -x "$PY" ] || { echo "resume.sh: no $PY: set up the repository first (the README's test command)" >&2; exit 2; }
if [ ! -d "$STUDY/.git" ]; then
  git clone -q "$MAIN" "$STUDY"
  git -C "$STUDY" checkout -q 7b0025b
fi
AB=$STUDY/runs/verdict-cost-study/ab
mkdir -p "$AB" "$STUDY/.rollcut_cache"
[ -e "$AB/plan.json" ] || cp "$MAIN/docs/ab/cost-study/runs/plan.json" "$AB/plan.json"
# the declared commit keeps a summary a Ctrl-C / SIGTERM wrote ("interrupted") as finished: set such folders aside
for d in "$AB"/*/; do
  name=$(basename "$d")
  case "$name" in *.*|logs|configs) continue;; esac
  if [ -f "$d/summary.json" ] && grep -q '"stop_reason": *"interrupted"' "$d/summary.json"; then
    n=1; while [ -e "$AB/$name.unfinished-$n" ]; do n=$((n+1)); done
    mv "$AB/$name" "$AB/$name.unfinished-$n"
  fi
done
for d in "$MAIN"/docs/ab/cost-study/runs/*/; do
  name=$(basename "$d")
  if [ ! -f "$AB/$name/summary.json" ]; then
    [ -e "$AB/$name" ] && mv "$AB/$name" "$AB/$name.unfinished-restore-$(date +%s)"
    mkdir -p "$AB/$name" && cp -a "$d"/. "$AB/$name/"
  fi
done
for f in "$MAIN"/docs/ab/cost-study/warm-starts/*; do
  [ -e "$STUDY/.rollcut_cache/$(basename "$f")" ] || cp "$f" "$STUDY/.rollcut_cache/"
done
cd "$STUDY"
echo "== study (re)started $(date -u) load: $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
PYTHONPATH=$STUDY "$PY" bench/learn_seeds.py --verdict configs/verdicts/cost-study.toml || rc=$?
echo "== study ended $(date -u) rc=$rc"
