#!/usr/bin/env bash
# The GPU check (issue 39), on one GPU machine that has torch and no network, inside 8 minutes:
#
#   1. the GPU tests (`pytest -m gpu`): the policy, its warm start and the learner on CUDA, weights crossing
#      devices, CUDA-event attribution, a tiny run on CUDA;
#   2. a default run with the learner on CUDA and 8 decoding processes (policy.device is auto: CUDA too),
#      its held-out measures cut to EVAL_TASKS tasks per split and its GRPO phase to GRPO_S seconds;
#   3. bench/bench_workers.py at 1 / 4 / 8 / 12 decoding workers, ARM_S seconds each, learner on CUDA;
#
# each step under its own time limit, each one's profile table and PNG under OUT_DIR; where $OUT is set (the
# device tool's return folder) the files worth reading are copied there too (at most 8).
#
#   bench/gpu_wheels.sh             # on a machine with network: .whl/, what the GPU image lacks
#   bench/gpu_check.sh [OUT_DIR]    # on the GPU machine, .whl/ carried along (default OUT_DIR runs/gpu_check)
#
# Exit status: 0 when every step passed, else 1 (the log says which did not).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/gpu_check}
PY=${PYTHON:-python3}
EVAL_TASKS=${EVAL_TASKS:-50}
GRPO_S=${GRPO_S:-100}
ARM_S=${ARM_S:-20}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
source bench/gpu_steps.sh

# 0. What the image lacks, from the carried wheels; stop here, naming them, if something is still missing.
install_wheels
$PY - <<'PY' 2>&1 | tee -a "$LOG"
import importlib.util, os, sys
needed = ("torch", "numpy", "trio", "zmq", "msgspec", "rapidfuzz", "structlog", "pytest", "pytest_trio", "hypothesis", "matplotlib")
missing = [m for m in needed if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing packages: {', '.join(missing)} (bench/gpu_wheels.sh downloads them into .whl/)")
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.cuda.is_available()}"
      f" ({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}), {os.cpu_count()} CPUs")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device: this check is for a GPU machine")
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv 2>&1 | tee -a "$LOG"

export PYTHONUNBUFFERED=1 WANDB_MODE=offline MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

# 1. The GPU tests (the others are deselected; a test module whose extra is absent does not stop them).
step "gpu tests" 110 $PY -m pytest -q -rs -m gpu -p no:cacheprovider --continue-on-collection-errors tests

# 2. The default run, learner on CUDA, 8 decoding processes.
step "default run" 200 $PY run.py --set "run.out=$OUT_DIR" --set run.name=default --set run.progress=false \
  --set learner.device=cuda --set policy.workers=8 --set "eval.tasks=$EVAL_TASKS" --set "run.max_wall_s=$GRPO_S"
[ -f "$OUT_DIR/default/summary.md" ] && cat "$OUT_DIR/default/summary.md" >> "$LOG"

# 3. Decoding workers 1 / 4 / 8 / 12 side by side, each arm profiled (the default run's warm start is cached).
step "bench_workers" 150 $PY bench/bench_workers.py --workers 1,4,8,12 --seconds "$ARM_S" --rounds 1 \
  --out "$OUT_DIR/workers" --set learner.device=cuda

say "done; failed: ${failed[*]:-none}"
if [ -n "${OUT:-}" ]; then  # the device tool brings back at most 8 files
  cp "$LOG" "$OUT/gpu_check.log"
  [ -f "$OUT_DIR/default/summary.md" ] && cp "$OUT_DIR/default/summary.md" "$OUT/default-summary.md"
  [ -f "$OUT_DIR/default/profile.png" ] && cp "$OUT_DIR/default/profile.png" "$OUT/default-profile.png"
  [ -f "$OUT_DIR/workers/workers.md" ] && cp "$OUT_DIR/workers/workers.md" "$OUT/workers.md"
  for n in 1 4 8 12; do
    [ -f "$OUT_DIR/workers/w$n/profile.png" ] && cp "$OUT_DIR/workers/w$n/profile.png" "$OUT/workers-$n-profile.png"
  done
fi
[ ${#failed[@]} -eq 0 ]
