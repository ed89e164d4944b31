#!/usr/bin/env bash
# Rebuild the early gate's verdict report (issue 57; configs/verdicts/early-gate.toml, its result beside it) from the
# records kept here (runs/: each run's summary, metrics, events, config, commits and off-clock curve, 25 runs,
# seeds 130-134), with no new runs:
#   report/vs-gate-off/    the declared baseline (the ungated default), its A/A arm gate-off-aa
#   report/vs-sync-grpo/   the same runs against sync-grpo (the goal's time to target, gate-early against it)
#   bash docs/ab/early-gate/report.sh
set -euo pipefail
MAIN=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
PY=${PY:-$MAIN/.venv/bin/python}
HERE=$MAIN/docs/ab/early-gate
[ -x "$PY" ] || { echo "report.sh: no $PY: set up the repository first (the README's test command)" >&2; exit 2; }
for baseline in gate-off sync-grpo; do
  work=$(mktemp -d)/verdict-early-gate/ab  # the report is titled after the folder above ab/
  mkdir -p "$work"
  cp -r "$HERE"/runs/* "$work/"
  (cd "$MAIN" && "$PY" run.py ab report "$work" --baseline "$baseline" > /dev/null)
  mkdir -p "$HERE/report/vs-$baseline"
  cp "$work"/report.md "$work"/report.json "$work"/*.png "$HERE/report/vs-$baseline/"
  rm -rf "$(dirname "$(dirname "$work")")"
  echo "report.sh: $HERE/report/vs-$baseline" >&2
done
