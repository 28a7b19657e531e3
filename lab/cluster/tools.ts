// Locates the Go-built control-plane tools and CSI sidecars in the version-keyed cache and builds
// missing ones by running lab/cluster/build-tools.sh or build-sidecars.sh (the one build recipe
// each, shared with CI and the lab command).
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

export const KUBE_VERSION = "v1.36.1";
export const ETCD_VERSION = "v3.6.16";

export interface ToolPaths {
  etcd: string;
  kubeApiserver: string;
  kubeControllerManager: string;
  kubeScheduler: string;
  kubectl: string;
  /** The node agent and Service proxy of the real-cluster lab's nodes. */
  kubelet: string;
  kubeProxy: string;
}

/**
 * CSI sidecar versions built by build-sidecars.sh: the newest tags the Go module proxy serves
 * (`go list -m -versions github.com/kubernetes-csi/<repo>/vN`). csi-snapshotter,
 * snapshot-controller and the VolumeSnapshot CRDs share `snapshotter`: one repository, one schema.
 * csi-snapshot-metadata and its SnapshotMetadataService CRD share `snapshotMetadata` (module
 * github.com/kubernetes-csi/external-snapshot-metadata and its nested client module, tags
 * v1.0.0 and client/v1.0.0 of one commit); the proxy refuses to list that module's versions
 * (403), so the tag is fetched by name.
 */
export const SIDECAR_VERSIONS = {
  provisioner: "v6.4.0",
  attacher: "v4.13.0",
  resizer: "v2.3.0",
  snapshotter: "v8.7.0",
  snapshotMetadata: "v1.0.0",
} as const;

/** The SnapshotMetadataService CRD (cbt.storage.k8s.io/v1beta1, cluster-scoped) build-sidecars.sh copies. */
export const SNAPSHOT_METADATA_CRD_FILE = "cbt.storage.k8s.io_snapshotmetadataservices.yaml";

/**
 * The CRD files build-sidecars.sh copies from external-snapshotter's client module. The group
 * snapshot ones are included because snapshot-controller v8.7+ (group snapshots GA) otherwise
 * waits 30 s for them at every start.
 */
export const SNAPSHOT_CRD_FILES = [
  "snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
  "snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
  "snapshot.storage.k8s.io_volumesnapshots.yaml",
  "groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml",
  "groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml",
  "groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml",
] as const;

export interface SidecarPaths {
  provisioner: string;
  attacher: string;
  resizer: string;
  snapshotter: string;
  snapshotController: string;
  snapshotMetadata: string;
  /** Directory holding exactly the SNAPSHOT_CRD_FILES. */
  snapshotCrdDir: string;
  /** Directory holding exactly SNAPSHOT_METADATA_CRD_FILE. */
  snapshotMetadataCrdDir: string;
}

/** The cache root; DISTORT_CACHE overrides it so CI or a developer can relocate the cache. */
export function cacheRoot(env: Record<string, string | undefined> = process.env): string {
  return env.DISTORT_CACHE ?? join(homedir(), ".cache", "distort");
}

/** Where build-tools.sh puts each tool; pure path arithmetic, the files may not exist yet. */
export function toolPaths(root = cacheRoot()): ToolPaths {
  const kube = join(root, "kube", KUBE_VERSION);
  return {
    etcd: join(root, "etcd", ETCD_VERSION, "etcd"),
    kubeApiserver: join(kube, "kube-apiserver"),
    kubeControllerManager: join(kube, "kube-controller-manager"),
    kubeScheduler: join(kube, "kube-scheduler"),
    kubectl: join(kube, "kubectl"),
    kubelet: join(kube, "kubelet"),
    kubeProxy: join(kube, "kube-proxy"),
  };
}

/** Runs one of the build scripts beside this file, streaming its progress; throws on a non-zero exit. */
async function runBuild(
  script: string,
  args: string[],
  env: Record<string, string>,
  what: string,
): Promise<void> {
  const proc = Bun.spawn(["bash", join(import.meta.dir, script), ...args], {
    env: { ...process.env, ...env },
    stdout: "inherit",
    stderr: "inherit",
  });
  const code = await proc.exited;
  if (code !== 0) throw new Error(`building ${what} failed (exit ${code}); see the output above`);
}

function missingPaths(paths: Record<string, string>): string[] {
  return Object.entries(paths)
    .filter(([, p]) => !existsSync(p))
    .map(([name, p]) => `${name} at ${p}`);
}

/**
 * Returns the tool paths, building whatever is missing first. The build streams its progress to
 * stderr; a cold build takes minutes, a warm call returns at once. Throws if the build fails.
 */
export async function ensureTools(root = cacheRoot()): Promise<ToolPaths> {
  const paths = toolPaths(root);
  if (missingPaths({ ...paths }).length === 0) return paths;
  await runBuild(
    "build-tools.sh",
    ["all"],
    { DISTORT_CACHE: root, KUBE_VERSION, ETCD_VERSION },
    "control-plane tools",
  );
  const missing = missingPaths({ ...paths });
  if (missing.length > 0) throw new Error(`build finished but ${missing.join(", ")} is missing`);
  return paths;
}

/**
 * Where build-sidecars.sh puts each binary (`<root>/sidecars/<binary>/<version>/<binary>`) and the
 * snapshot CRDs; pure path arithmetic, the files may not exist yet.
 */
export function sidecarPaths(root = cacheRoot()): SidecarPaths {
  const bin = (name: string, version: string) => join(root, "sidecars", name, version, name);
  return {
    provisioner: bin("csi-provisioner", SIDECAR_VERSIONS.provisioner),
    attacher: bin("csi-attacher", SIDECAR_VERSIONS.attacher),
    resizer: bin("csi-resizer", SIDECAR_VERSIONS.resizer),
    snapshotter: bin("csi-snapshotter", SIDECAR_VERSIONS.snapshotter),
    snapshotController: bin("snapshot-controller", SIDECAR_VERSIONS.snapshotter),
    snapshotMetadata: bin("csi-snapshot-metadata", SIDECAR_VERSIONS.snapshotMetadata),
    snapshotCrdDir: join(root, "sidecars", "snapshot-crds", SIDECAR_VERSIONS.snapshotter),
    snapshotMetadataCrdDir: join(
      root,
      "sidecars",
      "snapshot-metadata-crds",
      SIDECAR_VERSIONS.snapshotMetadata,
    ),
  };
}

function sidecarEnv(root: string): Record<string, string> {
  return {
    DISTORT_CACHE: root,
    PROVISIONER_VERSION: SIDECAR_VERSIONS.provisioner,
    ATTACHER_VERSION: SIDECAR_VERSIONS.attacher,
    RESIZER_VERSION: SIDECAR_VERSIONS.resizer,
    SNAPSHOTTER_VERSION: SIDECAR_VERSIONS.snapshotter,
    SNAPSHOT_METADATA_VERSION: SIDECAR_VERSIONS.snapshotMetadata,
  };
}

function snapshotCrdPaths(dir: string): Record<string, string> {
  return Object.fromEntries(SNAPSHOT_CRD_FILES.map((f) => [f, join(dir, f)]));
}

function crdPaths(paths: SidecarPaths): Record<string, string> {
  return {
    ...snapshotCrdPaths(paths.snapshotCrdDir),
    [SNAPSHOT_METADATA_CRD_FILE]: join(paths.snapshotMetadataCrdDir, SNAPSHOT_METADATA_CRD_FILE),
  };
}

/**
 * Returns the sidecar paths, building the missing binaries (and copying the snapshot CRDs) first.
 * Cold, that compiles five Go programs (minutes, progress on stderr); warm, it returns at once.
 * Throws if the build fails or leaves anything missing.
 */
export async function ensureSidecars(root = cacheRoot()): Promise<SidecarPaths> {
  const paths = sidecarPaths(root);
  const all = () => ({ ...paths, ...crdPaths(paths) });
  if (missingPaths(all()).length === 0) return paths;
  await runBuild("build-sidecars.sh", ["all"], sidecarEnv(root), "CSI sidecars");
  const missing = missingPaths(all());
  if (missing.length > 0) throw new Error(`sidecar build finished but ${missing.join(", ")} is missing`);
  return paths;
}

/**
 * Returns the directory holding the VolumeSnapshot CRDs, copying them (and the
 * SnapshotMetadataService CRD) from the Go module proxy when absent (seconds: module downloads,
 * no compilation). Throws if that fails.
 */
export async function ensureSnapshotCrds(root = cacheRoot()): Promise<string> {
  await ensureCrdFiles(root);
  return sidecarPaths(root).snapshotCrdDir;
}

/**
 * Returns the directory holding exactly the SnapshotMetadataService CRD, copying it (and the
 * VolumeSnapshot CRDs) from the Go module proxy when absent. Throws if that fails.
 */
export async function ensureSnapshotMetadataCrd(root = cacheRoot()): Promise<string> {
  await ensureCrdFiles(root);
  return sidecarPaths(root).snapshotMetadataCrdDir;
}

async function ensureCrdFiles(root: string): Promise<void> {
  const want = crdPaths(sidecarPaths(root));
  if (missingPaths(want).length === 0) return;
  await runBuild("build-sidecars.sh", ["crds"], sidecarEnv(root), "snapshot CRDs");
  const missing = missingPaths(want);
  if (missing.length > 0) throw new Error(`CRD copy finished but ${missing.join(", ")} is missing`);
}

/** The network-policy-api release whose ClusterNetworkPolicy the chart's portal policy is written for. */
export const NETWORK_POLICY_API_VERSION = "v0.3.0";
const CLUSTER_NETWORK_POLICY_CRD = "config/crd/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml";

/**
 * Returns the path of the real ClusterNetworkPolicy CRD (sigs.k8s.io/network-policy-api, standard
 * channel), copying it from the Go module proxy when the cache lacks it (seconds, no compilation).
 * Tests install it so the API server itself validates the chart's portal policies.
 */
export async function ensureClusterNetworkPolicyCrd(root = cacheRoot()): Promise<string> {
  const dir = join(root, "crds", "network-policy-api", NETWORK_POLICY_API_VERSION);
  const file = join(dir, CLUSTER_NETWORK_POLICY_CRD.split("/").pop() as string);
  if (existsSync(file)) return file;
  await runBuild(
    "copy-module-files.sh",
    ["sigs.k8s.io/network-policy-api", NETWORK_POLICY_API_VERSION, dir, CLUSTER_NETWORK_POLICY_CRD],
    {},
    "the ClusterNetworkPolicy CRD",
  );
  if (!existsSync(file)) throw new Error(`copy finished but ${file} is missing`);
  return file;
}
