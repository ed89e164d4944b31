#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a GPU machine that has torch but no network (and none of
# rollcut's other dependencies): downloaded here, into .whl/ (git-ignored), for CPython 3.12 on x86-64
# Linux, at the versions this checkout's .venv runs. Carry .whl/ to the machine with the checkout;
# gpu_check.sh installs it with `pip install --no-index --no-deps --target` (docs/profiling.md, "GPU check").
#
#   bench/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12 (the GPU image's python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VERSION=${1:-3.12}
# rollcut's dependencies beyond torch and numpy, with what they need that the GPU image lacks
NAMES="trio outcome sniffio pyzmq msgspec rapidfuzz structlog pytest-trio"
PINS=$($PY - $NAMES <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
PY
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $PINS
ls -1 .whl
du -sh .whl
