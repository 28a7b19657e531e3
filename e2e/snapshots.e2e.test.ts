// Snapshots and clones end to end through the real snapshot-controller, csi-snapshotter and
// csi-provisioner: a restored claim holds the data as of the snapshot, not what was written later;
// a cloned claim holds its source's data; deleting it all leaves no snapshot behind anywhere.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeSnapshot } from "../api/index.ts";
import { parseVolumeId } from "../csi/controller/volume-id.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";
import { targetRpc } from "./storage-target.ts";
import { createPvc, deletePod, type E2eLab, e2eLab, partitionOf, runWorkload, until } from "./support.ts";

const BYTES = 16 * 1024 * 1024;
const SNAPSHOT_CLASS = "distort-snapshots";
const GROUP = "snapshot.storage.k8s.io";
const VERSION = "v1";

interface VolumeSnapshot {
  metadata: { name: string; namespace: string; uid: string };
  status?: { readyToUse?: boolean; boundVolumeSnapshotContentName?: string; error?: { message?: string } };
}

interface VolumeSnapshotContent {
  metadata: { name: string };
  status?: { snapshotHandle?: string; readyToUse?: boolean };
}

let lab: E2eLab;
let custom: k8s.CustomObjectsApi;
beforeAll(async () => {
  lab = await e2eLab();
  custom = lab.conn.api(k8s.CustomObjectsApi);
}, 120_000);
afterAll(() => lab.stop());

async function readSnapshot(ns: string, name: string): Promise<VolumeSnapshot | undefined> {
  try {
    return (await custom.getNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns,
      plural: "volumesnapshots",
      name,
    })) as VolumeSnapshot;
  } catch (err) {
    if (kubeError(err, "get").kind === "not-found") return undefined;
    throw err;
  }
}

async function readContent(name: string): Promise<VolumeSnapshotContent | undefined> {
  try {
    return (await custom.getClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: "volumesnapshotcontents",
      name,
    })) as VolumeSnapshotContent;
  } catch (err) {
    if (kubeError(err, "get").kind === "not-found") return undefined;
    throw err;
  }
}

/** Creates a VolumeSnapshot of `claim` and waits until it is ready to use. */
async function snapshot(ns: string, name: string, claim: string): Promise<VolumeSnapshot> {
  await custom.createNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    namespace: ns,
    plural: "volumesnapshots",
    body: {
      apiVersion: `${GROUP}/${VERSION}`,
      kind: "VolumeSnapshot",
      metadata: { name },
      spec: { volumeSnapshotClassName: SNAPSHOT_CLASS, source: { persistentVolumeClaimName: claim } },
    },
  });
  return until(
    `VolumeSnapshot ${ns}/${name} ready to use`,
    async () => {
      const s = await readSnapshot(ns, name);
      if (s?.status?.error?.message) throw new Error(`snapshot failed: ${s.status.error.message}`);
      return s?.status?.readyToUse === true && s.status.boundVolumeSnapshotContentName ? s : undefined;
    },
    180_000,
  );
}

/**
 * Throws unless the CSI controller's ServiceAccount (which the csi-snapshotter runs as) may list
 * VolumeSnapshotContents: without the chart's snapshot rules a snapshot never becomes ready, and
 * this says why at once instead of after a long wait.
 */
async function expectSnapshotterRbac(): Promise<void> {
  const sas = await lab.core.listNamespacedServiceAccount({
    namespace: lab.namespace,
    labelSelector: "app.kubernetes.io/component=csi-controller",
  });
  const sa = sas.items[0]?.metadata?.name;
  if (!sa) throw new Error(`no csi-controller ServiceAccount in ${lab.namespace}`);
  const review = await lab.conn.api(k8s.AuthorizationV1Api).createSubjectAccessReview({
    body: {
      spec: {
        user: `system:serviceaccount:${lab.namespace}:${sa}`,
        resourceAttributes: { group: GROUP, resource: "volumesnapshotcontents", verb: "list" },
      },
    },
  });
  if (!review.status?.allowed)
    throw new Error(
      `ServiceAccount ${lab.namespace}/${sa} may not list volumesnapshotcontents, so csi-snapshotter cannot work: the lab applied the chart's RBAC without snapshots.enabled`,
    );
}

/** Aliases (lvstore/lvol) of lvols on any storage node whose name starts with one of `names`. */
async function lvolsOnTarget(names: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const node of lab.storage) {
    const { rpc, close } = targetRpc(node.spdkSocket);
    try {
      for (const b of await rpc.bdevGetBdevs())
        found.push(...b.aliases.filter((a) => names.some((n) => (a.split("/")[1] ?? "").startsWith(n))));
    } finally {
      await close();
    }
  }
  return found;
}

async function deleteIfPresent(del: () => Promise<unknown>): Promise<void> {
  try {
    await del();
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
}

describe("snapshots and clones", () => {
  test("restore holds the data as of the snapshot, a clone its source's; deleting leaves nothing", async () => {
    const [nodeA, nodeB] = lab.consumers;
    if (!nodeA || !nodeB) throw new Error("the lab needs two consumer nodes");
    await expectSnapshotterRbac();
    const ns = await lab.newNamespace("snap");
    const before = `${ns}-before`;
    const after = `${ns}-after`;
    const claims = ["source", "restored", "cloned"];
    const pods = ["write-before", "write-after", "read-restored", "read-cloned"];
    const snaps = new ResourceClient(lab.conn, kinds.NVMeSnapshot);
    const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
    let contentName: string | undefined;
    let nvmeSnapshot: NVMeSnapshot | undefined;
    const partitions: { name: string; namespace: string; pv: string }[] = [];
    const lvols: string[] = [];
    try {
      await createPvc(lab, ns, "source");
      // The writer finishes (and fsyncs) before the snapshot: snapshots are crash-consistent.
      const first = await runWorkload(lab, ns, "write-before", nodeA.name, "source", [
        "write",
        `--bytes=${BYTES}`,
        `--seed=${before}`,
      ]);
      expect(first.ok).toBe(true);
      partitions.push(await partitionOf(lab, ns, "source"));

      const vs = await snapshot(ns, "snap", "source");
      contentName = vs.status?.boundVolumeSnapshotContentName as string;
      const content = await until(`VolumeSnapshotContent ${contentName} with a handle`, async () => {
        const c = await readContent(contentName as string);
        return c?.status?.snapshotHandle ? c : undefined;
      });
      const ref = parseVolumeId(content.status?.snapshotHandle as string);
      if (!ref) throw new Error(`unexpected snapshot handle ${content.status?.snapshotHandle}`);
      nvmeSnapshot = await snaps.get(ref.name, ref.namespace);
      expect(nvmeSnapshot?.metadata.uid).toBe(ref.uid);
      expect(nvmeSnapshot?.status?.readyToUse).toBe(true);
      expect(nvmeSnapshot?.spec.sourcePartitionName).toBe(partitions[0]?.name as string);

      // Later writes to the source must not reach the snapshot.
      const second = await runWorkload(lab, ns, "write-after", nodeA.name, "source", [
        "write",
        `--bytes=${BYTES}`,
        `--seed=${after}`,
      ]);
      expect(second.ok).toBe(true);
      expect(second.sha256).not.toBe(first.sha256);

      await createPvc(lab, ns, "restored", {
        dataSource: { apiGroup: GROUP, kind: "VolumeSnapshot", name: "snap" },
      });
      const restored = await runWorkload(lab, ns, "read-restored", nodeB.name, "restored", [
        "verify",
        `--bytes=${BYTES}`,
        `--seed=${before}`,
      ]);
      expect(restored).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: first.sha256 });
      partitions.push(await partitionOf(lab, ns, "restored"));

      await createPvc(lab, ns, "cloned", {
        dataSource: { apiGroup: "", kind: "PersistentVolumeClaim", name: "source" },
      });
      const cloned = await runWorkload(lab, ns, "read-cloned", nodeB.name, "cloned", [
        "verify",
        `--bytes=${BYTES}`,
        `--seed=${after}`,
      ]);
      expect(cloned).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: second.sha256 });
      partitions.push(await partitionOf(lab, ns, "cloned"));
      // Restore and clone are new volumes, not the source exported twice.
      expect(new Set(partitions.map((p) => p.name)).size).toBe(3);
      for (const p of partitions) {
        const x = await parts.get(p.name, p.namespace);
        if (x?.status?.externalId) lvols.push(x.status.externalId);
      }
      const names = [nvmeSnapshot?.status?.externalId, ...lvols].filter((x): x is string => !!x);
      expect(names).toHaveLength(4);
      // The volumes, the snapshot, and the clone's intermediate snapshot (named after the clone).
      expect((await lvolsOnTarget(names)).length).toBeGreaterThanOrEqual(5);

      // The snapshot goes first, while the restored volume still depends on its lvol: the
      // Kubernetes objects go at once, the NVMeSnapshot only once its clone is gone.
      await custom.deleteNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        namespace: ns,
        plural: "volumesnapshots",
        name: "snap",
      });
      await until(
        `VolumeSnapshotContent ${contentName} deleted`,
        async () => !(await readContent(contentName as string)),
      );
      const held = await snaps.get(ref.name, ref.namespace);
      expect(held?.metadata.uid).toBe(ref.uid);
      expect(held?.metadata.deletionTimestamp).toBeTruthy();
      for (const p of pods) await deletePod(lab, ns, p, 180_000);
      for (const c of claims)
        await lab.core.deleteNamespacedPersistentVolumeClaim({ name: c, namespace: ns });
      await until(
        `NVMeSnapshot ${ref.name} deleted`,
        async () => !(await snaps.get(ref.name, ref.namespace)),
        180_000,
      );
      for (const p of partitions) {
        await until(
          `partition ${p.name} deleted`,
          async () => !(await parts.get(p.name, p.namespace)),
          180_000,
        );
        await until(`PV ${p.pv} deleted`, async () => {
          try {
            await lab.core.readPersistentVolume({ name: p.pv });
            return false;
          } catch (err) {
            if (kubeError(err, "get").kind === "not-found") return true;
            throw err;
          }
        });
      }
      // Nor does the target keep any of their lvols.
      expect(await lvolsOnTarget(names)).toEqual([]);
    } finally {
      await cleanUp(ns, pods, claims, contentName);
    }
  }, 600_000);
});

/** Removes what the test made, whatever step it reached; a no-op for what is gone already. */
async function cleanUp(
  ns: string,
  pods: string[],
  claims: string[],
  contentName: string | undefined,
): Promise<void> {
  for (const p of pods) await deletePod(lab, ns, p, 180_000);
  await deleteIfPresent(() =>
    custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: ns,
      plural: "volumesnapshots",
      name: "snap",
    }),
  );
  for (const c of claims)
    await deleteIfPresent(() => lab.core.deleteNamespacedPersistentVolumeClaim({ name: c, namespace: ns }));
  if (contentName)
    await until("VolumeSnapshotContent gone", async () => !(await readContent(contentName)), 180_000);
  await lab.core.deleteNamespace({ name: ns });
}
