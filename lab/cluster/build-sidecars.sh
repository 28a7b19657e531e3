#!/usr/bin/env bash
# Builds the CSI sidecars (provisioner, attacher, resizer, snapshotter, snapshot-metadata) and
# snapshot-controller from the Go module proxy, and copies the (group) snapshot CRDs and the
# SnapshotMetadataService CRD, into the version-keyed tool cache.
# Usage: lab/cluster/build-sidecars.sh [all|bins|crds]   (env: DISTORT_CACHE, *_VERSION; idempotent)
set -euo pipefail

# Newest tags the Go module proxy serves (`go list -m -versions <module>`); tools.ts pins the same.
PROVISIONER_VERSION=${PROVISIONER_VERSION:-v6.4.0}
ATTACHER_VERSION=${ATTACHER_VERSION:-v4.13.0}
RESIZER_VERSION=${RESIZER_VERSION:-v2.3.0}
# One version for csi-snapshotter, snapshot-controller and the CRDs: they come from one repository
# and the controller must understand the CRD schema it watches.
SNAPSHOTTER_VERSION=${SNAPSHOTTER_VERSION:-v8.7.0}
# csi-snapshot-metadata and its SnapshotMetadataService CRD (the nested client module, tagged
# client/<version> at the same commit). The proxy answers `go list -m -versions` for this module
# with 403, so the tag is fetched by name (`go mod download <module>@<version>`).
SNAPSHOT_METADATA_VERSION=${SNAPSHOT_METADATA_VERSION:-v1.0.0}
SNAPSHOT_METADATA_CRD=cbt.storage.k8s.io_snapshotmetadataservices.yaml
CACHE=${DISTORT_CACHE:-$HOME/.cache/distort}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

CSI=github.com/kubernetes-csi
# The VolumeGroupSnapshot CRDs come along: from v8.7.0 the group snapshot feature is GA and on, and
# without its CRDs snapshot-controller spends --retry-crd-interval-max (30 s) looking for them at
# every start before it serves plain VolumeSnapshots. tools.ts lists the same files.
SNAPSHOT_CRDS="snapshot.storage.k8s.io_volumesnapshotclasses.yaml
snapshot.storage.k8s.io_volumesnapshotcontents.yaml
snapshot.storage.k8s.io_volumesnapshots.yaml
groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml
groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml
groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml"
what=${1:-all}

# Scratch space for module copies; removed however the script ends, interrupted or not.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

log() { printf '[build-sidecars %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Module directory in the module cache (downloads the module zip when absent).
module_dir() {
  local dir
  dir=$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$dir" ] || { log "cannot download $1@$2"; return 1; }
  printf '%s\n' "$dir"
}

# build_module MODULE VERSION BINARY... — builds each cmd/<BINARY> of MODULE@VERSION that the
# cache lacks into $CACHE/sidecars/<BINARY>/<VERSION>/<BINARY>.
#
# The sidecars' go.mod files carry replace directives (k8s.io staging modules, snapshotter's
# client/v8 => ./client), which `go install pkg@version` refuses and a wrapper module would ignore.
# Building inside a copy of the module itself keeps upstream's exact go.mod/go.sum (the dependency
# set upstream tested, including its godebug defaults); only replaces that point into the
# repository are re-pointed at the published module of the same tag, since a module zip never
# contains nested modules.
build_module() {
  local mod=$1 ver=$2; shift 2
  local missing=() b
  for b in "$@"; do
    if [ -x "$CACHE/sidecars/$b/$ver/$b" ]; then
      log "$b $ver cached at $CACHE/sidecars/$b/$ver"
    else
      missing+=("$b")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local t0=$SECONDS src w
  log "preparing $mod@$ver for ${missing[*]}"
  src=$(module_dir "$mod" "$ver")
  w=$(mktemp -d -p "$WORK")
  # The module cache is read-only; the copy must be writable for go.mod/go.sum edits.
  cp -r "$src" "$w/src"
  chmod -R u+w "$w/src"
  (
    cd "$w/src"
    local local_mods m n=0
    local_mods=$(sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\{0,1\}\([^[:space:]]\+\)\([[:space:]]\+v[^[:space:]]*\)\{0,1\}[[:space:]]*=>[[:space:]]*\./.*#\2#p' go.mod)
    for m in $local_mods; do
      go mod edit -dropreplace="$m" -require="$m@$ver"
      n=$((n + 1))
    done
    [ $n -gt 0 ] && log "re-pointed $n in-repository replace(s) at $ver: $local_mods"
    # Resolve and download first so the per-binary timings below measure compilation alone.
    local pkgs=()
    for b in "${missing[@]}"; do pkgs+=("./cmd/$b"); done
    go list -deps "${pkgs[@]}" >/dev/null
    log "modules ready after $((SECONDS - t0))s"
    for b in "${missing[@]}"; do
      local tb=$SECONDS out="$CACHE/sidecars/$b/$ver"
      log "compiling $b $ver"
      mkdir -p "$out"
      # Build beside the cache entry and rename, so an interrupted build never leaves a half binary;
      # the partial name carries this shell's pid, so two builds racing for one entry (two test
      # runs on one cache) never write, check or rename each other's file.
      local part="$out/.$b.partial.$$"
      go build -trimpath -ldflags "-s -w -X main.version=$ver" -o "$part" "./cmd/$b"
      # Every sidecar prints "<argv0> <version>" for --version; a mismatch means stamping failed.
      if ! "$part" --version 2>&1 | grep -qF "$ver"; then
        log "$b does not report $ver from --version (version stamping failed)"
        rm -f "$part"
        exit 1
      fi
      mv "$part" "$out/$b"
      log "$b $ver compiled in $((SECONDS - tb))s"
    done
  )
  rm -rf "$w"
  log "$mod@$ver done in $((SECONDS - t0))s"
}

# The CRDs live in the nested client/v8 module (config/crd/), whose tag matches the snapshotter's.
copy_snapshot_crds() {
  local ver=$SNAPSHOTTER_VERSION out="$CACHE/sidecars/snapshot-crds/$SNAPSHOTTER_VERSION" f
  local have=1
  for f in $SNAPSHOT_CRDS; do [ -s "$out/$f" ] || have=0; done
  if [ $have -eq 1 ]; then log "snapshot CRDs $ver cached at $out"; return 0; fi
  local dir
  dir=$(module_dir "$CSI/external-snapshotter/client/v8" "$ver")
  mkdir -p "$out"
  for f in $SNAPSHOT_CRDS; do
    [ -s "$dir/config/crd/$f" ] || { log "missing $f in $dir/config/crd"; return 1; }
    cp "$dir/config/crd/$f" "$out/.$f.partial"
    chmod u+w "$out/.$f.partial"
    mv "$out/.$f.partial" "$out/$f"
  done
  log "snapshot CRDs $ver copied to $out"
}

# The SnapshotMetadataService CRD lives in the nested client module (config/crd/).
copy_snapshot_metadata_crd() {
  local ver=$SNAPSHOT_METADATA_VERSION out="$CACHE/sidecars/snapshot-metadata-crds/$SNAPSHOT_METADATA_VERSION"
  local f=$SNAPSHOT_METADATA_CRD dir
  if [ -s "$out/$f" ]; then log "SnapshotMetadataService CRD $ver cached at $out"; return 0; fi
  dir=$(module_dir "$CSI/external-snapshot-metadata/client" "$ver")
  [ -s "$dir/config/crd/$f" ] || { log "missing $f in $dir/config/crd"; return 1; }
  mkdir -p "$out"
  cp "$dir/config/crd/$f" "$out/.$f.partial"
  chmod u+w "$out/.$f.partial"
  mv "$out/.$f.partial" "$out/$f"
  log "SnapshotMetadataService CRD $ver copied to $out"
}

build_bins() {
  build_module "$CSI/external-provisioner/v6" "$PROVISIONER_VERSION" csi-provisioner
  build_module "$CSI/external-attacher/v4" "$ATTACHER_VERSION" csi-attacher
  build_module "$CSI/external-resizer/v2" "$RESIZER_VERSION" csi-resizer
  build_module "$CSI/external-snapshotter/v8" "$SNAPSHOTTER_VERSION" csi-snapshotter snapshot-controller
  build_module "$CSI/external-snapshot-metadata" "$SNAPSHOT_METADATA_VERSION" csi-snapshot-metadata
}

t_all=$SECONDS
case "$what" in
  bins) build_bins ;;
  crds) copy_snapshot_crds; copy_snapshot_metadata_crd ;;
  all) build_bins; copy_snapshot_crds; copy_snapshot_metadata_crd ;;
  *) echo "usage: $0 [all|bins|crds]" >&2; exit 2 ;;
esac
log "done in $((SECONDS - t_all))s under $CACHE/sidecars"
