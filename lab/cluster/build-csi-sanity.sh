#!/usr/bin/env bash
# Builds csi-sanity (github.com/kubernetes-csi/csi-test/v5) from the Go module proxy into the
# version-keyed tool cache. Idempotent: a cached binary is kept.
set -euo pipefail
CSI_TEST_VERSION=${CSI_TEST_VERSION:-v5.6.0}
CACHE=${DISTORT_CACHE:-$HOME/.cache/distort}
out="$CACHE/csi-sanity/$CSI_TEST_VERSION"
if [ -x "$out/csi-sanity" ]; then echo "csi-sanity $CSI_TEST_VERSION cached at $out" >&2; exit 0; fi
export GOTOOLCHAIN=local CGO_ENABLED=0
t0=$SECONDS
echo "building csi-sanity $CSI_TEST_VERSION" >&2
mkdir -p "$out"
GOBIN="$out.partial" go install -trimpath -ldflags "-s -w -X main.version=$CSI_TEST_VERSION" \
  "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
mv "$out.partial/csi-sanity" "$out/csi-sanity"; rm -rf "$out.partial"
echo "csi-sanity $CSI_TEST_VERSION built in $((SECONDS - t0))s" >&2
