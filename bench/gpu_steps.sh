# Sourced by bench/gpu_check.sh and bench/gpu_scaling.sh (set LOG and PY first): their steps, each under a
# time limit and logged, the files worth reading copied to the device tool's $OUT as they are made, and the
# wheels carried in .whl/ (bench/gpu_wheels.sh) installed where the GPU image lacks them.
failed=()
started=$(date +%s)
: > "$LOG"

say() { echo "== $* (at $(( $(date +%s) - started )) s, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$LOG"; }
back() { [ -n "${OUT:-}" ] && for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT/"; done; return 0; }
step() {  # step NAME LIMIT_S COMMAND...: under a time limit (SIGINT first: a run writes its checkpoint)
  local name=$1 limit=$2; shift 2
  say "$name (limit ${limit} s)"
  timeout -s INT -k 20 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  say "$name: exit $rc"
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
  back "$LOG"
}
install_wheels() {  # the carried wheels, into /tmp/rollcut-site (first on PYTHONPATH)
  local wheels=${WHEELS:-.whl}
  if compgen -G "$wheels/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rollcut-site "$wheels"/*.whl \
      2>&1 | tee -a "$LOG" || { say "installing $wheels/ failed"; exit 1; }
    export PYTHONPATH=/tmp/rollcut-site${PYTHONPATH:+:$PYTHONPATH}
  fi
}
