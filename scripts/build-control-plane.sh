#!/usr/bin/env bash
# Builds kube-apiserver and kube-controller-manager v1.20.2 from Debian's `kubernetes` source package with
# Debian's Go, once per machine, into a cache outside the repository. Installs etcd and fake-gcs prerequisites
# from Debian. Idempotent: exits at once when the binaries are already cached.
set -euo pipefail

K8S_VERSION=v1.20.2
DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
OUT="$CACHE/k8s-$K8S_VERSION"
LOG="$CACHE/build-control-plane.log"

need_apt=()
for pkg in golang-1.19-go golang-1.19-src etcd-server rsync golang-github-modern-go-reflect2-dev \
           golang-github-json-iterator-go-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ] && [ ${#need_apt[@]} -eq 0 ]; then
  echo "control plane $K8S_VERSION cached in $OUT"
  exit 0
fi

mkdir -p "$CACHE"
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >>"$LOG" 2>&1 || true
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >>"$LOG" 2>&1 \
    || { echo "apt-get install failed; see $LOG" >&2; exit 1; }
  # etcd-server's package may start a system etcd on 2379; the sandbox runs its own. Stop only that service
  # (by its unit, or its init script's pidfile), never other etcd processes such as a running sandbox's.
  if [ -d /run/systemd/system ]; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/etcd ]; then
    /etc/init.d/etcd stop >/dev/null 2>&1 || true
  fi
fi
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ]; then
  echo "control plane $K8S_VERSION cached in $OUT"
  exit 0
fi

SRC="$CACHE/src"
mkdir -p "$SRC/lists/partial" "$SRC/parts"
# A private deb-src list (same mirrors as the system's deb lines) so the system's apt setup is untouched.
uris=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
if [ -z "$uris" ]; then
  uris=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' || true)
fi
: >"$SRC/sources.list"
for u in $uris; do
  case "$u" in
    *security*) echo "deb-src $u bookworm-security main" >>"$SRC/sources.list" ;;
    *) echo "deb-src $u bookworm main" >>"$SRC/sources.list" ;;
  esac
done
APT_OPTS=(-o "Dir::Etc::SourceList=$SRC/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$SRC/lists")
echo "fetching the kubernetes $DEB_VERSION source package (log: $LOG)"
apt-get "${APT_OPTS[@]}" update >>"$LOG" 2>&1
(cd "$SRC" && apt-get "${APT_OPTS[@]}" source --download-only "kubernetes=$DEB_VERSION" >>"$LOG" 2>&1) \
  || { echo "apt-get source failed; see $LOG" >&2; exit 1; }

TREE="$SRC/kubernetes"
rm -rf "$TREE"
dscs=("$SRC"/kubernetes_*.dsc)
dsc=${dscs[0]}
dpkg-source --no-check -x "$dsc" "$TREE" >>"$LOG" 2>&1

# The vendored reflect2 1.0.1 / json-iterator 1.1.10 fault under Go >= 1.18: use Debian's newer copies.
for d in github.com/modern-go/reflect2 github.com/json-iterator/go; do
  rm -rf "$TREE/vendor/$d"
  cp -r "/usr/share/gocode/src/$d" "$TREE/vendor/$d"
done

echo "building kube-apiserver and kube-controller-manager $K8S_VERSION (several minutes; log: $LOG)"
export PATH="/usr/lib/go-1.19/bin:$PATH" GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0 \
  KUBE_GIT_VERSION=$K8S_VERSION KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
(cd "$TREE" && make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >>"$LOG" 2>&1) \
  || { echo "control-plane build failed; see $LOG" >&2; exit 1; }

mkdir -p "$OUT.tmp"
cp "$TREE/_output/bin/kube-apiserver" "$TREE/_output/bin/kube-controller-manager" "$OUT.tmp/"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
rm -rf "$TREE"
echo "control plane $K8S_VERSION built into $OUT"
