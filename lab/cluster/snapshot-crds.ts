// Installs the VolumeSnapshot and VolumeGroupSnapshot CRDs (external-snapshotter's) and the
// SnapshotMetadataService CRD (external-snapshot-metadata's), cached by build-sidecars.sh, into a
// cluster: what a distribution bundles and the snapshot sidecars watch.

import type { KubeConnection } from "../../lib/kube/connection.ts";
import { installCrds } from "./crds.ts";
import { cacheRoot, ensureSnapshotCrds, ensureSnapshotMetadataCrd } from "./tools.ts";

/**
 * Creates or replaces the VolumeSnapshot{Class,Content,} and VolumeGroupSnapshot{Class,Content,}
 * CRDs and waits until each is Established and its endpoint serves; returns the CRD names.
 * Idempotent: a second call replaces the CRDs with identical ones. The YAMLs come from the tool
 * cache, fetched from the Go module proxy first when missing (no compilation). Throws on an API
 * error, a failed fetch, or after timeoutMs.
 */
export async function installSnapshotCrds(
  conn: KubeConnection,
  root = cacheRoot(),
  timeoutMs = 30_000,
): Promise<string[]> {
  // crds.ts writes raw JSON (client-node's typed model would drop schema keys), the same need here.
  return installCrds(conn, await ensureSnapshotCrds(root), timeoutMs);
}

/**
 * Creates or replaces the SnapshotMetadataService CRD (cbt.storage.k8s.io, cluster-scoped) and
 * waits until it is Established: the chart's SnapshotMetadataService object needs it before
 * `helm install`. Idempotent; the YAML comes from the tool cache (fetched from the Go module
 * proxy when missing). Throws on an API error, a failed fetch, or after timeoutMs.
 */
export async function installSnapshotMetadataCrd(
  conn: KubeConnection,
  root = cacheRoot(),
  timeoutMs = 30_000,
): Promise<string[]> {
  return installCrds(conn, await ensureSnapshotMetadataCrd(root), timeoutMs);
}
