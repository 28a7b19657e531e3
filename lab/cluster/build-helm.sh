#!/usr/bin/env bash
# Builds helm from the Go module proxy into the version-keyed tool cache, stamped so `helm version`
# and `helm template`'s default KubeVersion tell the truth. Idempotent: a cached helm is kept.
# Usage: lab/cluster/build-helm.sh   (env: DISTORT_CACHE, HELM_VERSION, KUBE_VERSION)
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
KUBE_VERSION=${KUBE_VERSION:-v1.36.1}
CACHE=${DISTORT_CACHE:-$HOME/.cache/distort}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[build-helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

out="$CACHE/helm/$HELM_VERSION"
if [ -x "$out/helm" ]; then log "helm $HELM_VERSION cached at $out"; exit 0; fi

case "$HELM_VERSION" in
  v3.*) mod=helm.sh/helm/v3 ;;
  v4.*) mod=helm.sh/helm/v4 ;;
  *) log "HELM_VERSION must be v3.x.y or v4.x.y, got $HELM_VERSION"; exit 2 ;;
esac
# Unstamped, helm reports "v3.22"-style versions and renders for KubeVersion v1.20.0, which makes
# a chart's kubeVersion constraint (>=1.33) fail `helm template` without --kube-version.
kmajor=1
kminor=$(echo "$KUBE_VERSION" | cut -d. -f2)
ld="-s -w -X $mod/internal/version.version=$HELM_VERSION -X $mod/internal/version.gitTreeState=clean"
# The same pair lives in the lint rules (deprecated-API checks) and must agree.
for p in pkg/chartutil pkg/lint/rules; do
  [ "$mod" = helm.sh/helm/v4 ] && [ "$p" = pkg/chartutil ] && p=pkg/chart/common
  ld="$ld -X $mod/$p.k8sVersionMajor=$kmajor -X $mod/$p.k8sVersionMinor=$kminor"
done

w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
t0=$SECONDS
log "building helm $HELM_VERSION ($mod, default KubeVersion v$kmajor.$kminor.0) into $out"
(
  cd "$w"
  go mod init local/helmbin >/dev/null 2>&1
  # helm's go.mod has no replace directives, so a wrapper module resolves exactly its requirements.
  log "resolving and downloading modules"
  go get -tool "$mod/cmd/helm@$HELM_VERSION"
  log "modules ready after $((SECONDS - t0))s; compiling"
  mkdir -p "$out"
  # Build beside the cache entry and rename, so an interrupted build never leaves a half binary;
  # the partial name carries this shell's pid, so two builds racing for one entry each rename their own.
  go build -trimpath -ldflags "$ld" -o "$out/.helm.partial.$$" "$mod/cmd/helm"
  mv "$out/.helm.partial.$$" "$out/helm"
)
got=$("$out/helm" version --template '{{.Version}}')
if [ "$got" != "$HELM_VERSION" ]; then
  log "built helm reports $got, expected $HELM_VERSION (version stamping failed)"
  rm -f "$out/helm"
  exit 1
fi
log "helm $HELM_VERSION built in $((SECONDS - t0))s ($("$out/helm" version --short))"
