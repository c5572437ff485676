#!/usr/bin/env bash
# Installs Debian's `iverilog` package (Icarus Verilog: iverilog + vvp), the Verilog checker's simulator, for
# the functional-evaluation tests and the demo's pass@k. Idempotent: a no-op when both binaries are there.
set -euo pipefail

# awk, not head: head would close the pipe early and fail the pipeline under pipefail (SIGPIPE, 141).
installed() { echo "iverilog $(iverilog -V 2>&1 | awk 'NR==1{print $4}') installed"; }
# TPUFORGE_SETUP_FRESH=1 takes the install path even when installed (tests/scripts/test_setup_scripts.py).
if [ -z "${TPUFORGE_SETUP_FRESH:-}" ] && command -v iverilog >/dev/null 2>&1 && command -v vvp >/dev/null 2>&1; then
  installed
  exit 0
fi

CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
LOG="$CACHE/setup-iverilog.log"
mkdir -p "$CACHE"
echo "installing Debian package iverilog (log: $LOG)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >>"$LOG" 2>&1 || true
apt-get install -y -qq --no-install-recommends ${TPUFORGE_SETUP_FRESH:+--reinstall} iverilog >>"$LOG" 2>&1 \
  || { echo "apt-get install iverilog failed; see $LOG" >&2; exit 1; }
installed
