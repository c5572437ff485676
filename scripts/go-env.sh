# Sourced by the sandbox's Go builds (build-control-plane.sh, build-prometheus-adapter.sh) once CACHE is set:
# GO, the toolchain scripts/get-go.sh picks, and Go's module, build and path caches under CACHE, shared by
# every build, with modules writable (so the cache can be removed) and no cgo. Prints which Go builds $1.
GO=$(bash "$(dirname "${BASH_SOURCE[0]}")/get-go.sh")
export GOROOT
GOROOT=$("$GO" env GOROOT)
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS=-modcacherw CGO_ENABLED=0 \
  GOTOOLCHAIN=local GOPATH="$CACHE/go/path"
echo "building $1 with $("$GO" version) (log: $LOG)"
