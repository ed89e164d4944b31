#!/usr/bin/env bash
# Issue 38's figure on a 16-core GPU machine (docs/scaling.md, "16 cores"), then the GPU check's tests and a
# short default run, in one call of under 10 minutes: the decoders scale until the learner is the limit, so
#
#   0. the default warm start (`run.py pretrain`), so that no timed step pays for it: the cache key holds
#      torch's version, so a cache carried from a machine with another torch is not used (BC: ~2 min there);
#   1. bench/bench_scaling.py --launchers processes at 1 / 8 / 12 decoding processes (the pool at N = 1 too),
#      decoders on the CPU, learner on CUDA;
#   2. bench/bench_workers.py at 1 / 8 (1: decoding in a thread), the learner on the CPU at LEARNER_THREADS (4)
#      torch threads, each arm profiled (the learner's busy share);
#   3. the GPU tests (`pytest -m gpu`);
#   4. a default run, learner and policy on CUDA (policy.device auto), 8 decoding processes, EVAL_TASKS (30)
#      tasks per split, GRPO_S (60) s;
#
# STEPS (default warm,scaling,cpu,tests,run) picks steps; each step under its own time limit, its log and tables under OUT_DIR and, where $OUT is set (the device
# tool's return folder), copied there as each step ends (a call cut at its limit still returns what ran).
#
#   bench/gpu_wheels.sh                 # on a machine with network: .whl/, what the GPU image lacks
#   bench/gpu_scaling.sh [OUT_DIR]      # carry .whl/ and .rollcut_cache/ (the default warm start, cached)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/gpu_scaling}
PY=${PYTHON:-python3}
ARM_S=${ARM_S:-20}
LEARNER_THREADS=${LEARNER_THREADS:-4}
EVAL_TASKS=${EVAL_TASKS:-30}
GRPO_S=${GRPO_S:-60}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_scaling.log
source bench/gpu_steps.sh
install_wheels
$PY -c "import torch, os, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'CUDA',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', os.cpu_count(), 'CPUs')" \
  2>&1 | tee -a "$LOG"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

want() { [[ ",${STEPS:-warm,scaling,cpu,tests,run}," == *",$1,"* ]]; }

want warm && step "warm start" 300 $PY run.py pretrain --set eval.tasks=10

want scaling && step "scaling, learner on CUDA" 150 $PY bench/bench_scaling.py --launchers processes --decoders 1,8,12 \
  --seconds "$ARM_S" --seeds 0 --out "$OUT_DIR/scaling" --set policy.device=cpu --set learner.device=cuda
want scaling && back "$OUT_DIR/scaling/scaling.md" "$OUT_DIR/scaling/scaling.json"

want cpu && step "workers, learner on $LEARNER_THREADS CPU threads" 100 $PY bench/bench_workers.py --workers 8 --seconds "$ARM_S" \
  --rounds 1 --out "$OUT_DIR/cpu" --set policy.device=cpu --set learner.device=cpu --set "learner.torch_threads=$LEARNER_THREADS"
want cpu && cp "$OUT_DIR/cpu/workers.md" "$OUT_DIR/workers-cpu.md" 2>/dev/null; back "$OUT_DIR/workers-cpu.md"

want tests && step "gpu tests" 100 $PY -m pytest -q -rs -m gpu -p no:cacheprovider --continue-on-collection-errors tests

want run && step "default run" 150 $PY run.py --set "run.out=$OUT_DIR" --set run.name=default --set run.progress=false \
  --set learner.device=cuda --set policy.workers=8 --set "eval.tasks=$EVAL_TASKS" --set "run.max_wall_s=$GRPO_S"
want run && cp "$OUT_DIR/default/summary.md" "$OUT_DIR/default-summary.md" 2>/dev/null; back "$OUT_DIR/default-summary.md"

say "done; failed: ${failed[*]:-none}"
back "$LOG"
[ ${#failed[@]} -eq 0 ]
