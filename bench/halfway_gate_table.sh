#!/usr/bin/env bash
# Calibrate the gates from a policy partway through the learn preset's run (issue 36, item 1; docs/gate.md, "In the
# learn preset's regime"): for each seed, run the learn preset until it keeps its published weights at update
# $UPDATE (run.keep_weights_every), stop it there with SIGTERM (run.py stops as after a Ctrl-C), then replay the
# gates on groups rolled out by those weights. ~25 min a seed on 2 cores (seed 0: 24 min, BC included), then the
# calibration: run it on a quiet machine, never beside a study that times its runs.
#   bash bench/halfway_gate_table.sh                      # seeds 0 1 2, update 12 (half of the cost study's 24)
#   SEEDS="0 1" UPDATE=24 OUT=docs/x.md bash bench/halfway_gate_table.sh
#   SEEDS=0 bash bench/halfway_gate_table.sh --weights-only   # keep seed 0's weights now, calibrate in a later call
set -euo pipefail
case "${1:-}" in
  "") weights_only=false ;;
  --weights-only) weights_only=true ;;
  *) echo "halfway_gate_table.sh: unknown argument ${1} (only --weights-only; SEEDS, UPDATE, CONFIG, OUT in the environment)" >&2; exit 2 ;;
esac
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
SEEDS=${SEEDS:-0 1 2}
UPDATE=${UPDATE:-12}
CONFIG=${CONFIG:-configs/learn.toml}
OUT=${OUT:-docs/gate_table_learn_halfway.md}
[ -x "$PY" ] || { echo "halfway_gate_table.sh: no $PY: set up the repository first (the README's test command)" >&2; exit 2; }
version=$(printf '%04d' "$UPDATE")

for seed in $SEEDS; do
  run=runs/halfway-s$seed
  weights=$run/checkpoints/policy-v$version.pt
  [ -f "$weights" ] && { echo "halfway: seed $seed: $weights kept earlier" >&2; continue; }
  if [ -e "$run" ]; then  # a run stopped before it kept them: set it aside (run.py would start halfway-s<seed>-1)
    n=1; while [ -e "$run.unfinished-$n" ]; do n=$((n+1)); done
    mv "$run" "$run.unfinished-$n"
  fi
  echo "halfway: seed $seed: running $CONFIG until $weights" >&2
  "$PY" run.py --config "$CONFIG" --set run.seed="$seed" --set "run.name=\"halfway-s$seed\"" \
    --set run.keep_weights_every="$UPDATE" --set run.progress=false &
  pid=$!
  # the weights are written atomically (pipeline/run/resume.py): once the file exists it is whole
  while kill -0 "$pid" 2> /dev/null && [ ! -f "$weights" ]; do sleep 5; done
  kill -TERM "$pid" 2> /dev/null || true
  wait "$pid" || true
  [ -f "$weights" ] || { echo "halfway: seed $seed: the run ended before update $UPDATE ($run)" >&2; exit 1; }
done

$weights_only && { echo "halfway: weights kept; calibration not run (--weights-only)" >&2; exit 0; }
# shellcheck disable=SC2086  # SEEDS is a list
"$PY" bench/calibrate_gate.py --config "$CONFIG" --seeds $SEEDS --groups 128 \
  --weights "runs/halfway-s{seed}/checkpoints/policy-v$version.pt" --out "$OUT"
