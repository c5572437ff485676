#!/usr/bin/env bash
# Builds the Prometheus adapter (sigs.k8s.io/prometheus-adapter, PROMETHEUS_ADAPTER_VERSION in
# control-plane-versions.env) once per machine into a cache outside the repository: the sandbox runs it as the
# aggregated custom metrics API (custom.metrics.k8s.io) in front of its Prometheus, so that a
# HorizontalPodAutoscaler reads vLLM's queue per pod. Only the adapter's binary is built, from a small module of
# its own that requires the release (its Kubernetes libraries never meet the control plane's), with the same Go
# toolchain (scripts/get-go.sh) and the same Go module and build caches as scripts/build-control-plane.sh.
# Idempotent: exits at once when the binary is cached. `--print-dir` prints the directory and exits.
set -euo pipefail

# shellcheck source=control-plane-versions.env
source "$(dirname "${BASH_SOURCE[0]}")/control-plane-versions.env"

CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
OUT="$CACHE/prometheus-adapter-$PROMETHEUS_ADAPTER_VERSION-build-$PROMETHEUS_ADAPTER_BUILD"
if [ "${1:-}" = "--print-dir" ]; then echo "$OUT"; exit 0; fi
if [ -x "$OUT/prometheus-adapter" ]; then
  echo "prometheus-adapter cached in $OUT"
  exit 0
fi
LOG="$CACHE/build-prometheus-adapter.log"
mkdir -p "$CACHE"
: >"$LOG"

# shellcheck source=go-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-env.sh" "prometheus-adapter $PROMETHEUS_ADAPTER_VERSION"

SRC="$CACHE/go/src/prometheus-adapter"
TMP="$OUT.tmp"
rm -rf "$TMP" "$SRC"
mkdir -p "$SRC" "$TMP"
{ echo "module tpuforge.dev/sandbox-build/prometheus-adapter"; echo; echo "go 1.26"; echo
  echo "require sigs.k8s.io/prometheus-adapter $PROMETHEUS_ADAPTER_VERSION"; } >"$SRC/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/prometheus-adapter/cmd/adapter"\n' >"$SRC/tools.go"
(cd "$SRC" && "$GO" mod tidy) >>"$LOG" 2>&1 || { echo "go mod tidy for prometheus-adapter failed; see $LOG" >&2; exit 1; }
(cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$TMP/prometheus-adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter) \
  >>"$LOG" 2>&1 || { echo "building prometheus-adapter failed; see $LOG" >&2; exit 1; }
cp "$GOMODCACHE/sigs.k8s.io/prometheus-adapter@$PROMETHEUS_ADAPTER_VERSION/LICENSE" "$TMP/LICENSE"
chmod -R u+w "$TMP"
rm -rf "$OUT" && mv "$TMP" "$OUT"
rm -rf "$SRC"
echo "prometheus-adapter built into $OUT"
