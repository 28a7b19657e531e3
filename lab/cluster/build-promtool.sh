#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus/cmd/promtool) from the Go module proxy into the
# version-keyed tool cache, stamped so `promtool --version` names the release. Idempotent.
# Usage: lab/cluster/build-promtool.sh   (env: DISTORT_CACHE, PROMETHEUS_VERSION)
set -euo pipefail

# Prometheus 3.x is published to the module proxy as v0.3MM.P (3.16.0 is v0.316.0).
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
CACHE=${DISTORT_CACHE:-$HOME/.cache/distort}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[build-promtool %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

out="$CACHE/promtool/$PROMETHEUS_VERSION"
if [ -x "$out/promtool" ]; then log "promtool $PROMETHEUS_VERSION cached at $out"; exit 0; fi

# v0.316.0 -> 3.16.0, the version the release itself prints.
minor=$(echo "$PROMETHEUS_VERSION" | cut -d. -f2)
patch=$(echo "$PROMETHEUS_VERSION" | cut -d. -f3)
release="${minor:0:1}.$((10#${minor:1})).$patch"
ld="-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=HEAD"

w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
t0=$SECONDS
log "building promtool $PROMETHEUS_VERSION (release $release) into $out"
(
  cd "$w"
  go mod init local/promtoolbin >/dev/null 2>&1
  log "resolving and downloading modules"
  go get -tool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  log "modules ready after $((SECONDS - t0))s; compiling"
  mkdir -p "$out"
  # Build beside the cache entry and rename, so an interrupted build never leaves a half binary.
  go build -trimpath -ldflags "$ld" -o "$out/.promtool.partial.$$" github.com/prometheus/prometheus/cmd/promtool
  mv "$out/.promtool.partial.$$" "$out/promtool"
)
if ! "$out/promtool" --version 2>&1 | grep -q "version $release"; then
  log "built promtool does not report version $release (version stamping failed)"
  rm -f "$out/promtool"
  exit 1
fi
log "promtool $PROMETHEUS_VERSION built in $((SECONDS - t0))s"
