#!/usr/bin/env bash
# Issue 38's figure on a 16-core GPU machine (docs/scaling.md, "16 cores"), then the GPU check's tests and a
# short default run, in one call of under 10 minutes: the decoders scale until the learner is the limit, so
#
#   0. the default warm start (`run.py pretrain`), so that no timed step pays for it: the cache key holds
#      torch's version, so a cache carried from a machine with another torch is not used (BC: ~2 min there);
#   1. bench/bench_scaling.py --launchers processes at 1 / 8 / 12 decoding processes (the pool at N = 1 too),
#      decoders on the CPU, learner on CUDA, gate and learner stages in the coordinator ("scaling") and in
#      processes of their own (transport.mode = processes, "stages"); "slots": the latter at 1 / 8 with
#      SLOTS_WIDE (128) rollout slots; "spy": a py-spy profile of the coordinator (8 decoders, stages in
#      processes) when py-spy is installed (carry its wheel in SPY_WHEELS);
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
#   bench/gpu_scaling.sh [OUT_DIR]      # carry .whl/ and .rollcut_cache/ (the default warm start, cached),
#                                       # or CACHE_FROM=DIR: *.pt copied into .rollcut_cache/ first
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/gpu_scaling}
PY=${PYTHON:-python3}
ARM_S=${ARM_S:-20}
LEARNER_THREADS=${LEARNER_THREADS:-4}
EVAL_TASKS=${EVAL_TASKS:-30}
GRPO_S=${GRPO_S:-60}
LEARNER_DEVICE=${LEARNER_DEVICE:-cuda}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_scaling.log
source bench/gpu_steps.sh
install_wheels
$PY -c "import torch, os, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'CUDA',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', os.cpu_count(), 'CPUs')" \
  2>&1 | tee -a "$LOG"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

want() { [[ ",${STEPS:-warm,scaling,cpu,tests,run}," == *",$1,"* ]]; }

if [ -n "${CACHE_FROM:-}" ]; then mkdir -p .rollcut_cache && cp "$CACHE_FROM"/*.pt .rollcut_cache/; fi
want warm && step "warm start" 300 $PY run.py pretrain --set eval.tasks=10

want scaling && step "scaling, learner on $LEARNER_DEVICE" 150 $PY bench/bench_scaling.py --launchers processes --decoders "${DECODERS:-1,8,12}" \
  --seconds "$ARM_S" --seeds 0 --out "$OUT_DIR/scaling" --set policy.device=cpu --set "learner.device=$LEARNER_DEVICE"
want scaling && back "$OUT_DIR/scaling/scaling.md" "$OUT_DIR/scaling/scaling.json"

scaling_as() {  # scaling_as NAME DECODERS OVERRIDE...: the same bench, its files renamed NAME-scaling.*
  step "scaling, $1" 240 $PY bench/bench_scaling.py --launchers processes --decoders "$2" --seconds "$ARM_S" --seeds 0 \
    --out "$OUT_DIR/$1" --set policy.device=cpu --set "learner.device=$LEARNER_DEVICE" "${@:3}"
  for f in md json; do cp "$OUT_DIR/$1/scaling.$f" "$OUT_DIR/$1-scaling.$f" 2>/dev/null; back "$OUT_DIR/$1-scaling.$f"; done
}
want stages && scaling_as stages "${DECODERS:-1,8,12}" --set transport.mode=processes
want slots && scaling_as slots "${SLOT_DECODERS:-1,8}" --set transport.mode=processes --set "rollout.slots=${SLOTS_WIDE:-128}"
if want spy && [ -n "${SPY_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/rollcut-spy "$SPY_WHEELS"/py_spy-*.whl 2>&1 | tee -a "$LOG"
  step "py-spy, 8 decoders, stages in processes" 100 /tmp/rollcut-spy/bin/py-spy record -r 200 --threads -f raw --nonblocking \
    -o "$OUT_DIR/spy.raw" -- $PY run.py --set "run.out=$OUT_DIR" --set run.name=spy --set run.progress=false --set eval.tasks=0 \
    --set "learner.device=$LEARNER_DEVICE" --set policy.device=cpu --set "policy.workers=${SPY_DECODERS:-8}" --set transport.mode=processes \
    --set run.updates=100000 --set "run.max_wall_s=$ARM_S"
  back "$OUT_DIR/spy.raw" "$OUT_DIR/spy/summary.md"
fi

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
