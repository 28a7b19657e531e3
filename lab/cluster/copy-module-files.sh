#!/usr/bin/env bash
# Copies files out of one Go module version (fetched through the Go module proxy, no compilation)
# into a cache directory, each renamed into place only when whole.
# Usage: lab/cluster/copy-module-files.sh MODULE VERSION OUT_DIR PATH_IN_MODULE...   (idempotent)
set -euo pipefail
mod=$1 ver=$2 out=$3
shift 3
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
log() { printf '[copy-module-files %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
dir=$(go mod download -json "$mod@$ver" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$dir" ] || { log "cannot download $mod@$ver"; exit 1; }
mkdir -p "$out"
for f in "$@"; do
  name=$(basename "$f")
  [ -s "$dir/$f" ] || { log "missing $f in $mod@$ver"; exit 1; }
  cp "$dir/$f" "$out/.$name.partial"
  chmod u+w "$out/.$name.partial"
  mv "$out/.$name.partial" "$out/$name"
done
# The module's licence travels with what was copied out of it.
for l in LICENSE LICENSE.txt; do
  if [ -s "$dir/$l" ]; then cp "$dir/$l" "$out/.LICENSE.partial" && chmod u+w "$out/.LICENSE.partial" && mv "$out/.LICENSE.partial" "$out/LICENSE"; fi
done
log "$mod@$ver: $# file(s) in $out"
