// Changed-block tracking as a backup application sees it: Kubernetes' SnapshotMetadata API, served
// by the chart's csi-snapshot-metadata sidecar from the driver's CSI SnapshotMetadata service, over
// TLS with a ServiceAccount token of the registered audience. A thin Block volume is written with
// O_DIRECT in whole and partial clusters between two VolumeSnapshots; the allocated clusters of each
// snapshot and the delta between them are exactly the clusters written, however the streams are
// paged or resumed, and a claim restored from the second snapshot reads back what was written.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { kubeError } from "../lib/kube/resource.ts";
import { ALLOCATION_UNIT } from "../lib/units.ts";
import {
  BlockMetadataType,
  blocksOf,
  type MetadataStream,
  readSnapshotMetadataService,
  resolveServiceAddress,
  SnapshotMetadataClient,
  SnapshotMetadataError,
  type SnapshotMetadataServiceInfo,
  serviceAccountToken,
  snapshotHandle,
} from "./snapshot-metadata-client.ts";
import { deletePod, type E2eLab, e2eLab, FinalError, until } from "./support.ts";
import { blockWorkloadPod, createVolumeSnapshot, DRIVER, teardownNamespace } from "./user-steps.ts";

const GROUP = "snapshot.storage.k8s.io";
const DEVICE = "/dev/xvda";
/** The lvstore cluster: the granularity the driver reports (FIXED_LENGTH blocks of this size). */
const CLUSTER = ALLOCATION_UNIT;
const C = BigInt(CLUSTER);
const SIZE = "64Mi";
const KiB = 1024;
/** The clusters whose content the suite checks after the restore: every one written. */
const WRITTEN = [0, 1, 2, 3, 5, 9];
/** The backup application's identity in the test namespace. */
const BACKUP_SA = "backup";
/** gRPC status codes the suite tells apart. */
const UNAVAILABLE = 14;
const PERMISSION_DENIED = 7;
const UNAUTHENTICATED = 16;

let lab: E2eLab;
let custom: k8s.CustomObjectsApi;
let ns: string;
let node: string;
let storageClass: string;
let service: SnapshotMetadataServiceInfo;
let client: SnapshotMetadataClient | undefined;
/** sha256 of each written cluster as read back after the second round of writes (the content at B). */
let atB: Record<number, string> = {};
/** sha256 of cluster 2 as read back after the first round (the content at A). */
let cluster2AtA = "";

beforeAll(async () => {
  lab = await e2eLab();
  custom = lab.conn.api(k8s.CustomObjectsApi);
  const first = lab.consumers[0];
  if (!first) throw new Error("the lab has no consumer node");
  node = first.name;
  ns = await lab.newNamespace("changed-blocks");
  // The lab's default class, thin: a snapshot then owns only the clusters written before it.
  storageClass = `changed-blocks-${randomBytes(3).toString("hex")}`;
  const base = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name: storageClass },
      provisioner: base.provisioner,
      parameters: { ...base.parameters, thinProvisioning: "true" },
      reclaimPolicy: "Delete",
      volumeBindingMode: "WaitForFirstConsumer",
    },
  });
  // A backup application may get VolumeSnapshots in the namespace it backs up: the one permission
  // the sidecar's SubjectAccessReview asks about.
  await lab.core.createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: BACKUP_SA } } });
  const rbac = lab.conn.api(k8s.RbacAuthorizationV1Api);
  await rbac.createNamespacedRole({
    namespace: ns,
    body: {
      metadata: { name: BACKUP_SA },
      rules: [{ apiGroups: [GROUP], resources: ["volumesnapshots"], verbs: ["get", "list"] }],
    },
  });
  await rbac.createNamespacedRoleBinding({
    namespace: ns,
    body: {
      metadata: { name: BACKUP_SA },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: BACKUP_SA },
      subjects: [{ kind: "ServiceAccount", name: BACKUP_SA, namespace: ns }],
    },
  });
  service = await readSnapshotMetadataService(lab.conn, DRIVER);
  // The sidecar's endpoint is ready once the driver listed SNAPSHOT_METADATA_SERVICE.
  const dial = await until(
    `a ready endpoint behind ${service.address}`,
    () => resolveServiceAddress(lab.conn, service.address),
    120_000,
  );
  client = new SnapshotMetadataClient(service, dial);
}, 240_000);

afterAll(async () => {
  client?.close();
  if (ns) {
    for (const p of (await lab.core.listNamespacedPod({ namespace: ns })).items)
      await deletePod(lab, ns, p.metadata?.name ?? "", 180_000);
    // Snapshots before their source claim, so no volume waits on a snapshot that outlives it.
    for (const s of ["b", "a"]) await deleteSnapshot(s);
    await teardownNamespace(lab, ns);
  }
  if (storageClass) await lab.storageApi.deleteStorageClass({ name: storageClass }).catch(() => undefined);
  await lab.stop();
}, 600_000);

async function deleteSnapshot(name: string): Promise<void> {
  const ref = { group: GROUP, version: "v1", namespace: ns, plural: "volumesnapshots", name };
  try {
    await custom.deleteNamespacedCustomObject(ref);
  } catch (err) {
    if (kubeError(err, "delete").kind === "not-found") return;
    throw err;
  }
  await until(
    `VolumeSnapshot ${ns}/${name} gone`,
    async () => !(await custom.getNamespacedCustomObject(ref).catch(() => undefined)),
    180_000,
  );
}

/** A Block claim of the thin class, optionally restored from VolumeSnapshot `from`. */
async function claim(name: string, from?: string): Promise<void> {
  await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName: storageClass,
        volumeMode: "Block",
        resources: { requests: { storage: SIZE } },
        ...(from ? { dataSource: { apiGroup: GROUP, kind: "VolumeSnapshot", name: from } } : {}),
      },
    },
  });
}

/** Shell: `count` bytes of fresh random data at byte `offset`, written with O_DIRECT and fsynced. */
const write = (offset: number, count: number) => {
  const bs = count % CLUSTER === 0 ? CLUSTER : 4 * KiB;
  return `dd if=/dev/urandom of=${DEVICE} bs=${bs} seek=${offset / bs} count=${count / bs} iflag=fullblock oflag=direct conv=fsync 2>/dev/null || { echo "write at ${offset} failed"; exit 1; }`;
};

/** Shell printing "cluster <i> <sha256>" of each cluster as read with O_DIRECT (no page cache). */
const hashClusters = (clusters: readonly number[]) =>
  clusters
    .map(
      (i) =>
        `echo "cluster ${i} $(dd if=${DEVICE} bs=${CLUSTER} skip=${i} count=1 iflag=direct,fullblock 2>/dev/null | sha256sum | cut -c1-64)"`,
    )
    .join("; ");

/** Runs `script` under busybox sh in a Pod on `node` holding claim `pvc` as a raw device; returns its log. */
async function runScript(pod: string, pvc: string, script: string): Promise<string> {
  const body = blockWorkloadPod(pod, node, pvc, ["hold"]);
  const c = body.spec?.containers[0] as k8s.V1Container;
  c.command = ["/bin/sh", "-c", `set -u; ${script}`];
  delete c.args;
  await lab.core.createNamespacedPod({ namespace: ns, body });
  const log = () => lab.core.readNamespacedPodLog({ name: pod, namespace: ns }).catch(() => "");
  const out = await until(
    `Pod ${ns}/${pod} to succeed`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name: pod, namespace: ns });
      if (p.status?.phase === "Failed") throw new FinalError(`Pod ${pod} failed: ${await log()}`);
      return p.status?.phase === "Succeeded" ? await log() : undefined;
    },
    240_000,
  );
  // The claim is ReadWriteOnce: let go of it before the next Pod or snapshot of it.
  await deletePod(lab, ns, pod, 180_000);
  return out;
}

function hashes(log: string): Record<number, string> {
  const out: Record<number, string> = {};
  for (const m of log.matchAll(/^cluster ([0-9]+) ([0-9a-f]{64})$/gm)) out[Number(m[1])] = m[2] as string;
  return out;
}

function blocks(s: MetadataStream): number[] {
  // A stream may carry no message at all when nothing is left to report.
  if (s.messages > 0) expect(s.blockMetadataType).toBe(BlockMetadataType.FIXED_LENGTH);
  for (const r of s.ranges) expect(r.size).toBe(C);
  return blocksOf(s.ranges, C);
}

const mustClient = () => {
  if (!client) throw new Error("no snapshot metadata client (beforeAll failed)");
  return client;
};

/**
 * `call` once the snapshots' metadata can be served: UNAVAILABLE (a snapshot not ready to the
 * sidecar yet, or its changed-block record not read by the storage agent yet) is retried for up to
 * two minutes; any other error fails at once.
 */
async function whenServed<T>(what: string, call: () => Promise<T>): Promise<T> {
  return until(
    what,
    async () => {
      try {
        return await call();
      } catch (err) {
        if (err instanceof SnapshotMetadataError && err.code === UNAVAILABLE) throw err;
        throw new FinalError(String(err));
      }
    },
    120_000,
  );
}

/** A fresh token of the backup ServiceAccount for the service's audience (each test mints its own). */
const backupToken = () => serviceAccountToken(lab.conn, ns, BACKUP_SA, service.audience);

describe("changed blocks of a thin Block volume between two snapshots", () => {
  test("writes, snapshot A, more writes, snapshot B", async () => {
    await claim("data");
    const round1 = await runScript(
      "write-a",
      "data",
      [write(0, 4 * CLUSTER), hashClusters([2]), "echo done"].join("; "),
    );
    expect(round1).toContain("done");
    cluster2AtA = hashes(round1)[2] ?? "";
    expect(cluster2AtA).toMatch(/^[0-9a-f]{64}$/);
    await createVolumeSnapshot(lab, ns, "a", "data");

    const round2 = await runScript(
      "write-b",
      "data",
      [
        // 4 KiB inside cluster 2 (1 MiB into it), 4 KiB in cluster 5, cluster 9 whole.
        write(2 * CLUSTER + 1024 * KiB, 4 * KiB),
        write(5 * CLUSTER + 12 * KiB, 4 * KiB),
        write(9 * CLUSTER, CLUSTER),
        hashClusters(WRITTEN),
        "echo done",
      ].join("; "),
    );
    expect(round2).toContain("done");
    atB = hashes(round2);
    expect(
      Object.keys(atB)
        .map(Number)
        .sort((a, b) => a - b),
    ).toEqual(WRITTEN);
    expect(atB[2]).not.toBe(cluster2AtA);
    await createVolumeSnapshot(lab, ns, "b", "data");
  }, 900_000);

  test("GetMetadataAllocated: A holds clusters 0-3, B also 5 and 9, in clusters of 4 MiB", async () => {
    const token = await backupToken();
    const a = await whenServed("GetMetadataAllocated(a)", () =>
      mustClient().getMetadataAllocated({ token, namespace: ns, snapshotName: "a" }),
    );
    expect(a.volumeCapacityBytes).toBe(64n * 1024n * 1024n);
    expect(blocks(a)).toEqual([0, 1, 2, 3]);
    const b = await whenServed("GetMetadataAllocated(b)", () =>
      mustClient().getMetadataAllocated({ token, namespace: ns, snapshotName: "b" }),
    );
    expect(blocks(b)).toEqual([0, 1, 2, 3, 5, 9]);
  }, 120_000);

  test("GetMetadataDelta A -> B: exactly clusters 2, 5 and 9", async () => {
    const token = await backupToken();
    const baseSnapshotId = await snapshotHandle(lab.conn, ns, "a");
    const d = await mustClient().getMetadataDelta({
      token,
      namespace: ns,
      baseSnapshotId,
      targetSnapshotName: "b",
    });
    expect(blocks(d)).toEqual([2, 5, 9]);
  }, 120_000);

  test("max_results pages and starting_offset resumes give the same sets", async () => {
    const token = await backupToken();
    const c = mustClient();
    const baseSnapshotId = await snapshotHandle(lab.conn, ns, "a");
    const paged = await c.getMetadataAllocated({ token, namespace: ns, snapshotName: "b", maxResults: 1 });
    expect(paged.largestMessage).toBeLessThanOrEqual(1);
    expect(blocks(paged)).toEqual([0, 1, 2, 3, 5, 9]);
    const pagedDelta = await c.getMetadataDelta({
      token,
      namespace: ns,
      baseSnapshotId,
      targetSnapshotName: "b",
      maxResults: 2,
    });
    expect(pagedDelta.largestMessage).toBeLessThanOrEqual(2);
    expect(blocks(pagedDelta)).toEqual([2, 5, 9]);

    // A resume right after each cluster returns exactly the clusters after it; one from inside a
    // cluster still returns that cluster (no range may end at or before the starting offset).
    const all = [0, 1, 2, 3, 5, 9];
    for (const [i, k] of all.entries()) {
      const from = await c.getMetadataAllocated({
        token,
        namespace: ns,
        snapshotName: "b",
        startingOffset: BigInt(k + 1) * C,
      });
      expect({ after: k, got: blocks(from) }).toEqual({ after: k, got: all.slice(i + 1) });
    }
    const inside = await c.getMetadataAllocated({
      token,
      namespace: ns,
      snapshotName: "b",
      startingOffset: 2n * C + 4096n,
      maxResults: 1,
    });
    expect(blocks(inside)).toEqual([2, 3, 5, 9]);
    const deltaFrom = await c.getMetadataDelta({
      token,
      namespace: ns,
      baseSnapshotId,
      targetSnapshotName: "b",
      startingOffset: 3n * C,
    });
    expect(blocks(deltaFrom)).toEqual([5, 9]);
  }, 300_000);

  test("a claim restored from B reads back every written cluster as it was at B", async () => {
    await claim("restored", "b");
    const got = hashes(await runScript("read-b", "restored", `${hashClusters(WRITTEN)}; echo done`));
    expect(got).toEqual(atB);
    expect(got[2]).not.toBe(cluster2AtA);
  }, 600_000);

  test("a token of another audience, or of an identity that may not read the snapshots, is refused", async () => {
    const c = mustClient();
    const wrong = await serviceAccountToken(lab.conn, ns, BACKUP_SA, `${service.audience}-other`);
    await expect(
      c.getMetadataAllocated({ token: wrong, namespace: ns, snapshotName: "b" }),
    ).rejects.toMatchObject({
      code: UNAUTHENTICATED,
    });
    await lab.core.createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: "nobody" } } });
    const nobody = await serviceAccountToken(lab.conn, ns, "nobody", service.audience);
    await expect(
      c.getMetadataAllocated({ token: nobody, namespace: ns, snapshotName: "b" }),
    ).rejects.toMatchObject({
      code: PERMISSION_DENIED,
    });
  }, 120_000);
});
