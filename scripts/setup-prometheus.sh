#!/usr/bin/env bash
# Installs Debian's `prometheus` package (server + promtool) for the alert-rule and dashboard-query tests.
# Idempotent: a no-op when both binaries are already there. The tests start their own server on loopback,
# so the packaged system service is stopped if the install started one.
set -euo pipefail

# awk, not head: head would close the pipe early and fail the pipeline under pipefail (SIGPIPE, 141).
installed() { echo "prometheus $(prometheus --version 2>&1 | awk 'NR==1{print $3}') installed"; }
# TPUFORGE_SETUP_FRESH=1 takes the install path even when installed (tests/scripts/test_setup_scripts.py).
if [ -z "${TPUFORGE_SETUP_FRESH:-}" ] && command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  installed
  exit 0
fi

CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
LOG="$CACHE/setup-prometheus.log"
mkdir -p "$CACHE"
echo "installing Debian package prometheus (log: $LOG)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >>"$LOG" 2>&1 || true
apt-get install -y -qq --no-install-recommends ${TPUFORGE_SETUP_FRESH:+--reinstall} prometheus >>"$LOG" 2>&1 \
  || { echo "apt-get install prometheus failed; see $LOG" >&2; exit 1; }
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
if [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi
installed
