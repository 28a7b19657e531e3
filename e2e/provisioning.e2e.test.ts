// Dynamic provisioning through the real API: Immediate and WaitForFirstConsumer classes bind as
// Kubernetes defines, the volume behind the PV is placed, exported and described as the driver
// reports it, and Pods write and read data back, on a filesystem, a raw block device, and at once.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type * as k8s from "@kubernetes/client-node";
import { kinds, type NVMePartition } from "../api/index.ts";
import { Annotations } from "../csi/controller/fingerprint.ts";
import { FABRIC_LABEL } from "../lab/harness/stack.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import {
  deletePod,
  type E2eLab,
  e2eLab,
  partitionOf,
  runWorkload,
  until,
  waitWorkload,
  workloadPod,
} from "./support.ts";
import {
  blockWorkloadPod,
  createClaim,
  DRIVER,
  multiClaimWorkloadPod,
  SELECTED_NODE,
  teardownNamespace,
  waitEvent,
  waitHeld,
} from "./user-steps.ts";
import { captureVolume } from "./volume-trace.ts";

let lab: E2eLab;
let partitions: ResourceClient<NVMePartition>;
/** Two consumer nodes of the lab. */
let nodeA: string;
let nodeB: string;

beforeAll(async () => {
  lab = await e2eLab();
  partitions = new ResourceClient(lab.conn, kinds.NVMePartition);
  [nodeA, nodeB] = lab.consumers.map((c) => c.name) as [string, string];
}, 120_000);

afterAll(() => lab.stop());

const GiB = 1024 ** 3;

/** The bound claim's PV and the NVMePartition behind it, once the partition is Exported. */
async function boundVolume(
  ns: string,
  claim: string,
): Promise<{ pv: k8s.V1PersistentVolume; part: NVMePartition }> {
  const ref = await partitionOf(lab, ns, claim);
  const part = await until(`NVMePartition ${ref.namespace}/${ref.name} Exported`, async () => {
    const p = await partitions.get(ref.name, ref.namespace);
    return p?.status?.state === "Exported" ? p : undefined;
  });
  return { pv: await lab.core.readPersistentVolume({ name: ref.pv }), part };
}

/** What a dynamically provisioned PV of this driver must say about its partition and claim. */
async function expectVolumeDescribed(
  ns: string,
  claim: string,
  pv: k8s.V1PersistentVolume,
  part: NVMePartition,
  o: { bytes: number; storageClass: string; volumeMode: "Filesystem" | "Block" },
): Promise<void> {
  const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: claim, namespace: ns });
  expect(pv.spec?.claimRef?.uid).toBe(pvc.metadata?.uid);
  expect(pv.spec?.storageClassName).toBe(o.storageClass);
  expect(pv.spec?.volumeMode).toBe(o.volumeMode);
  expect(pv.spec?.persistentVolumeReclaimPolicy).toBe("Delete");
  expect(pv.spec?.capacity?.storage).toBe(`${o.bytes / GiB}Gi`);
  // The CSI volume handle names exactly this incarnation of the partition: <namespace>/<name>/<uid>.
  expect(pv.spec?.csi?.driver).toBe(DRIVER);
  expect(pv.spec?.csi?.volumeHandle).toBe(`${lab.namespace}/${part.metadata.name}/${part.metadata.uid}`);
  if (o.volumeMode === "Filesystem") expect(pv.spec?.csi?.fsType).toBe("ext4");
  const attrs = pv.spec?.csi?.volumeAttributes ?? {};
  expect(attrs["storage.distort.io/nqn"]).toBe(part.status?.nqn ?? "missing");
  expect(attrs["storage.distort.io/transport"]).toBe("tcp");
  expect(attrs["storage.distort.io/portalIP"]).toBe(part.status?.portalIP ?? "missing");
  expect(attrs["storage.distort.io/portalPort"]).toBe(String(part.status?.portalPort));

  // The partition: placed on a lab drive of a storage node, sized as asked, recorded for operators.
  expect(part.spec.sizeBytes).toBe(o.bytes);
  expect(part.status?.allocatedBytes).toBe(o.bytes);
  const node = lab.storage.find((s) => s.name === part.spec.nodeName);
  expect(node).toBeDefined();
  expect(node?.serials).toContain(part.spec.deviceSerial ?? "none");
  expect(part.spec.backend).toBe("spdk");
  expect(part.spec.volumeManager).toBe("spdk-lvol");
  expect(part.status?.transport).toBe("tcp");
  expect(part.metadata.annotations?.[Annotations.pvcName]).toBe(claim);
  expect(part.metadata.annotations?.[Annotations.pvcNamespace]).toBe(ns);

  // Topology as the driver reports it: the consumer nodes ask for the fabric key, and the volume
  // is accessible where its storage node's value of that key is.
  const storageNodes = new ResourceClient(lab.conn, kinds.RDMAStorageNode);
  const sn = (await storageNodes.list({ namespace: lab.namespace })).items.find(
    (n) => n.spec.nodeName === part.spec.nodeName,
  );
  const fabric = sn?.metadata.labels?.[FABRIC_LABEL];
  expect(fabric).toBeDefined();
  expect(pv.spec?.nodeAffinity?.required?.nodeSelectorTerms).toEqual([
    { matchExpressions: [{ key: FABRIC_LABEL, operator: "In", values: [fabric ?? ""] }] },
  ]);
}

test("Immediate: the PVC binds before any Pod, the volume is exported, and data written on one node reads back on the other", async () => {
  const ns = await lab.newNamespace("prov");
  try {
    await createClaim(lab, ns, "data", { storageClass: "distort-lab-immediate", size: "1Gi" });
    const { pv, part } = await boundVolume(ns, "data");
    expect((await lab.core.listNamespacedPod({ namespace: ns })).items).toHaveLength(0);
    const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
    expect(pvc.status?.phase).toBe("Bound");
    expect(pvc.metadata?.annotations?.[SELECTED_NODE]).toBeUndefined();
    expect(pvc.status?.capacity?.storage).toBe("1Gi");
    await expectVolumeDescribed(ns, "data", pv, part, {
      bytes: GiB,
      storageClass: "distort-lab-immediate",
      volumeMode: "Filesystem",
    });

    const args = ["--bytes=16Mi", "--seed=immediate"];
    const written = await runWorkload(lab, ns, "writer", nodeA, "data", ["write", ...args]);
    expect(written.ok).toBe(true);
    await deletePod(lab, ns, "writer");
    const read = await runWorkload(lab, ns, "reader", nodeB, "data", ["verify", ...args]);
    expect(read).toMatchObject({ ok: true, bytes: 16 * 1024 * 1024, sha256: written.sha256 });
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 600_000);

test("WaitForFirstConsumer: the PVC waits for a Pod, follows the scheduler's node, then binds and serves data", async () => {
  const ns = await lab.newNamespace("prov");
  try {
    const created = await createClaim(lab, ns, "data", { size: "1Gi" });
    await waitEvent(lab, ns, {
      kind: "PersistentVolumeClaim",
      name: "data",
      uid: created.metadata?.uid ?? "",
      reason: "WaitForFirstConsumer",
    });
    const waiting = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
    expect(waiting.status?.phase).toBe("Pending");
    expect(waiting.spec?.volumeName).toBeUndefined();
    expect(waiting.metadata?.annotations?.[SELECTED_NODE]).toBeUndefined();
    // Nothing is carved before a consumer exists.
    const mine = (p: NVMePartition) => p.metadata.annotations?.[Annotations.pvcNamespace] === ns;
    expect((await partitions.list({ namespace: lab.namespace })).items.filter(mine)).toHaveLength(0);

    const args = ["--bytes=16Mi", "--seed=late-binding"];
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: workloadPod("writer", nodeB, "data", ["write-verify", ...args]),
    });
    const selected = await until("the scheduler's selected-node annotation on the PVC", async () => {
      const c = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
      return c.metadata?.annotations?.[SELECTED_NODE];
    });
    expect(selected).toBe(nodeB);
    const { pv, part } = await boundVolume(ns, "data");
    await expectVolumeDescribed(ns, "data", pv, part, {
      bytes: GiB,
      storageClass: "distort-lab",
      volumeMode: "Filesystem",
    });
    const written = await waitWorkload(lab, ns, "writer");
    expect(written).toMatchObject({ ok: true, mode: "write-verify" });
    await deletePod(lab, ns, "writer");
    const read = await runWorkload(lab, ns, "reader", nodeA, "data", ["verify", ...args]);
    expect(read).toMatchObject({ ok: true, sha256: written.sha256 });
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 600_000);

test("a Block-mode PVC is handed to the Pod as a raw device that keeps its bytes across nodes", async () => {
  const ns = await lab.newNamespace("prov");
  try {
    await createClaim(lab, ns, "raw", { size: "1Gi", volumeMode: "Block" });
    const args = ["--bytes=8Mi", "--seed=raw-block"];
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: blockWorkloadPod("writer", nodeA, "raw", ["write", ...args]),
    });
    const written = await waitWorkload(lab, ns, "writer");
    expect(written.ok).toBe(true);
    const { pv, part } = await boundVolume(ns, "raw");
    await expectVolumeDescribed(ns, "raw", pv, part, {
      bytes: GiB,
      storageClass: "distort-lab",
      volumeMode: "Block",
    });
    await deletePod(lab, ns, "writer");
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: blockWorkloadPod("reader", nodeB, "raw", ["verify", ...args]),
    });
    const read = await waitWorkload(lab, ns, "reader");
    expect(read).toMatchObject({ ok: true, sha256: written.sha256 });
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 600_000);

test("one Pod with two PVCs gets both attached and mounted, and two Pods on two nodes run at once", async () => {
  const ns = await lab.newNamespace("prov");
  try {
    await Promise.all(["a", "b", "c", "d"].map((c) => createClaim(lab, ns, c, { size: "1Gi" })));
    // Two claims in one Pod on the first node, while other Pods use their own claims on both nodes.
    await lab.core.createNamespacedPod({
      namespace: ns,
      body: multiClaimWorkloadPod(
        "pair",
        nodeA,
        ["a", "b"],
        ["write-verify", "--bytes=8Mi", "--seed=pair", "--then-hold"],
      ),
    });
    await Promise.all([
      lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod("left", nodeA, "c", ["write-verify", "--bytes=16Mi", "--seed=left"]),
      }),
      lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod("right", nodeB, "d", ["write-verify", "--bytes=16Mi", "--seed=right"]),
      }),
    ]);
    const [pair, left, right] = await Promise.all([
      waitHeld(lab, ns, "pair"),
      waitWorkload(lab, ns, "left"),
      waitWorkload(lab, ns, "right"),
    ]);
    expect(pair.ok).toBe(true);
    expect(left.ok).toBe(true);
    expect(right.ok).toBe(true);
    // Both of the pair's volumes are attached to the first node and mounted for the Pod, each its own export.
    const [ta, tb] = await Promise.all([
      captureVolume(lab, ns, "a", nodeA),
      captureVolume(lab, ns, "b", nodeA),
    ]);
    const pod = await lab.core.readNamespacedPod({ name: "pair", namespace: ns });
    for (const t of [ta, tb])
      expect(t.mounts.some((m) => m.includes(`/pods/${pod.metadata?.uid}/`))).toBe(true);
    expect(ta.nqn).not.toBe(tb.nqn);
    expect(ta.loopDevice).not.toBe(tb.loopDevice);
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 600_000);
