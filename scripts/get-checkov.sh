#!/usr/bin/env bash
# Puts checkov in its own virtual environment in the tpuforge cache, outside the repository, and prints the
# path of its `checkov` command. Its own environment because checkov pins packaging<24, networkx<2.7 and
# python-dateutil<3, which pytest and the kubernetes client in the project's environment do not accept.
# The version comes from the `scan` extra in pyproject.toml. Idempotent: prints the cached path at once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
REQ="$("$PY" -c "import sys, tomllib; d = tomllib.load(open(sys.argv[1], 'rb')); \
print(next(r for r in d['project']['optional-dependencies']['scan'] if r.startswith('checkov')))" \
  "$ROOT/pyproject.toml")"
VERSION="${REQ#checkov==}"
CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
VENV="$CACHE/checkov-$VERSION"
CHECKOV="$VENV/bin/checkov"

if [ -x "$CHECKOV" ] && [ -f "$VENV/.complete" ]; then
  echo "$CHECKOV"
  exit 0
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# pip warns once per package about configured index folders that do not exist here: keep the log readable.
"$VENV/bin/pip" install -q "$REQ" 2> >(grep -v "is neither a file nor a directory" >&2) >&2
"$CHECKOV" --version >/dev/null
touch "$VENV/.complete"
echo "$CHECKOV"
