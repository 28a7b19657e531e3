#!/usr/bin/env bash
# Builds the Go-built control-plane tools (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and the node tools (kubelet, kube-proxy) from the Go module proxy into a cache keyed by version. Idempotent: a
# tool already in the cache is kept, and only the missing kube binaries are compiled.
# Usage: lab/cluster/build-tools.sh [etcd|kube|all]   (env: DISTORT_CACHE, KUBE_VERSION, ETCD_VERSION)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.1}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${DISTORT_CACHE:-$HOME/.cache/distort}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
# kube-scheduler is here because WaitForFirstConsumer volumes bind only once a scheduler has picked a
# node (it writes volume.kubernetes.io/selected-node); the lab runs the real one.
# kubelet and kube-proxy run the real-cluster lab's nodes.
KUBE_BINS=${KUBE_BINS:-kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy}
what=${1:-all}

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

build_etcd() {
  local out="$CACHE/etcd/$ETCD_VERSION"
  if [ -x "$out/etcd" ]; then log "etcd $ETCD_VERSION cached at $out"; return 0; fi
  local w; w=$(mktemp -d); local t0=$SECONDS
  log "building etcd $ETCD_VERSION (module download + compile)"
  (
    cd "$w"
    go mod init local/etcdbin >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; rm -rf "$w"
  log "etcd $ETCD_VERSION built in $((SECONDS - t0))s"
}

build_kube() {
  local out="$CACHE/kube/$KUBE_VERSION"
  local missing=()
  for b in $KUBE_BINS; do [ -x "$out/$b" ] || missing+=("$b"); done
  if [ ${#missing[@]} -eq 0 ]; then log "kube $KUBE_VERSION cached at $out"; return 0; fi
  local w; w=$(mktemp -d); local t0=$SECONDS
  local sv="v0.${KUBE_VERSION#v1.}" minor; minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  log "building ${missing[*]} $KUBE_VERSION (staging modules at $sv)"
  (
    cd "$w"
    go mod init local/kubebin >/dev/null 2>&1
    local kmod
    kmod=$(go list -m -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -f "$kmod" ] || { log "cannot read go.mod of k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
    local n=0
    for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$kmod"); do
      go mod edit -replace="$m=$m@$sv"; n=$((n + 1))
    done
    log "re-pointed $n staging modules"
    local gov; gov=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$kmod")
    go mod edit -go="$gov" -godebug="default=go$(echo "$gov" | cut -d. -f1,2)"
    local pkgs=()
    for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b@$KUBE_VERSION"); done
    go get -tool "${pkgs[@]}"
    local ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    mkdir -p "$out"
    for b in "${missing[@]}"; do
      local tb=$SECONDS
      log "compiling $b"
      # Build beside the cache entry and rename, so an interrupted build never leaves a half binary;
      # the partial name carries this shell's pid, so two builds racing for one entry each rename their own.
      go build -trimpath -ldflags "$ld" -o "$out/.$b.partial.$$" "k8s.io/kubernetes/cmd/$b"
      mv "$out/.$b.partial.$$" "$out/$b"
      log "$b compiled in $((SECONDS - tb))s"
    done
  )
  rm -rf "$w"
  log "kube $KUBE_VERSION built in $((SECONDS - t0))s"
}

case "$what" in
  etcd) build_etcd ;;
  kube) build_kube ;;
  all) build_etcd; build_kube ;;
  *) echo "usage: $0 [etcd|kube|all]" >&2; exit 2 ;;
esac
