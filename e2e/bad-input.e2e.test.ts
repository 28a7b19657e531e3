// Bad input through the real API ends in something a user can read with kubectl that names the
// problem: provisioner Events for bad StorageClass parameters and impossible sizes, placement and
// claim conditions, and API-server rejections of invalid NVMePartition specs and edits.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { API_VERSION, kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { Annotations } from "../csi/controller/fingerprint.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { type E2eLab, e2eLab, partitionOf, until } from "./support.ts";
import { createClaim, DRIVER, deleteClaim, teardownNamespace, waitEvent } from "./user-steps.ts";

let lab: E2eLab;
let partitions: ResourceClient<NVMePartition>;
let custom: k8s.CustomObjectsApi;

beforeAll(async () => {
  lab = await e2eLab();
  partitions = new ResourceClient(lab.conn, kinds.NVMePartition);
  custom = lab.conn.api(k8s.CustomObjectsApi);
}, 120_000);

afterAll(() => lab.stop());

const { group, version, plural } = kinds.NVMePartition;

/** The NVMePartitions the driver made for claims of namespace `ns`. */
async function partitionsOfNamespace(ns: string): Promise<NVMePartition[]> {
  return (await partitions.list({ namespace: lab.namespace })).items.filter(
    (p) => p.metadata.annotations?.[Annotations.pvcNamespace] === ns,
  );
}

/** A StorageClass of this driver with Immediate binding, so provisioning starts without a Pod. */
async function createClass(name: string, parameters: Record<string, string>): Promise<void> {
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name },
      provisioner: DRIVER,
      parameters,
      reclaimPolicy: "Delete",
      volumeBindingMode: "Immediate",
    },
  });
}

/** The API server's answer to creating `body`: its HTTP status and message (throws if it accepts it). */
async function rejection(ns: string, body: object): Promise<{ code: number; message: string }> {
  try {
    await custom.createNamespacedCustomObject({
      group,
      version,
      namespace: ns,
      plural,
      body,
    });
  } catch (err) {
    if (!(err instanceof k8s.ApiException)) throw err;
    const status = (typeof err.body === "string" ? JSON.parse(err.body) : err.body) as { message?: string };
    return { code: err.code, message: status.message ?? "" };
  }
  throw new Error(`the API server accepted ${JSON.stringify(body)}`);
}

/** The API server's answer to a merge patch of an NVMePartition (throws if it accepts it). */
async function patchRejection(name: string, patch: object): Promise<{ code: number; message: string }> {
  try {
    await custom.patchNamespacedCustomObject(
      {
        group,
        version,
        namespace: lab.namespace,
        plural,
        name,
        body: patch,
      },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  } catch (err) {
    if (!(err instanceof k8s.ApiException)) throw err;
    const status = (typeof err.body === "string" ? JSON.parse(err.body) : err.body) as { message?: string };
    return { code: err.code, message: status.message ?? "" };
  }
  throw new Error(`the API server accepted the patch ${JSON.stringify(patch)} of ${name}`);
}

const lvolTcp = { backend: "spdk", volumeManager: "spdk-lvol", transport: "tcp" };

const badClasses: { what: string; parameters: Record<string, string>; says: string }[] = [
  {
    what: "an unknown transport",
    parameters: { ...lvolTcp, transport: "carrier-pigeon" },
    says: "transport must be rdma or tcp",
  },
  {
    what: "an unknown parameter key",
    parameters: { ...lvolTcp, copies: "3" },
    says: 'unknown parameter "copies"',
  },
  {
    what: "replicas on the kernel backend",
    parameters: { backend: "kernel", replicas: "2" },
    says: "replicas 2 requires backend spdk",
  },
  {
    what: "the spdk-lvol volume manager on the kernel backend",
    parameters: { ...lvolTcp, backend: "kernel" },
    says: "volumeManager spdk-lvol requires backend spdk",
  },
  {
    what: "a portal port out of range",
    parameters: { ...lvolTcp, portalPort: "99999" },
    says: "portalPort must be <= 65535",
  },
];

for (const c of badClasses) {
  test(`a StorageClass with ${c.what} fails provisioning with an Event that says so`, async () => {
    const ns = await lab.newNamespace("bad");
    const sc = `e2e-bad-${randomBytes(3).toString("hex")}`;
    try {
      await createClass(sc, c.parameters);
      const pvc = await createClaim(lab, ns, "data", { storageClass: sc });
      const event = await waitEvent(lab, ns, {
        kind: "PersistentVolumeClaim",
        name: "data",
        uid: pvc.metadata?.uid ?? "",
        reason: "ProvisioningFailed",
      });
      expect(event.type).toBe("Warning");
      expect(event.message).toContain("InvalidArgument");
      expect(event.message).toContain(c.says);
      const now = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
      expect(now.status?.phase).toBe("Pending");
      // Refused before anything was made: no partition exists for the claim.
      expect(await partitionsOfNamespace(ns)).toEqual([]);
    } finally {
      await teardownNamespace(lab, ns);
      await lab.storageApi.deleteStorageClass({ name: sc }).catch(() => {});
    }
  }, 300_000);
}

/** The unplaceable partition of the impossible-size test, left for the next test to look at. */
let impossible: { name: string; uid: string } | undefined;

test("a size no drive can hold fails provisioning with a capacity Event, and the partition says why it is not scheduled", async () => {
  const ns = await lab.newNamespace("bad");
  try {
    const pvc = await createClaim(lab, ns, "huge", { storageClass: "distort-lab-immediate", size: "100Ti" });
    const event = await waitEvent(lab, ns, {
      kind: "PersistentVolumeClaim",
      name: "huge",
      uid: pvc.metadata?.uid ?? "",
      reason: "ProvisioningFailed",
      matches: (m) => m.includes("ResourceExhausted"),
    });
    expect(event.type).toBe("Warning");
    expect(event.message).toContain("InsufficientCapacity");
    expect(event.message).toContain("100 TiB");

    const [part] = await until("the NVMePartition of the claim", async () => {
      const mine = await partitionsOfNamespace(ns);
      return mine.length > 0 ? mine : undefined;
    });
    if (!part?.metadata.uid) throw new Error("no partition");
    impossible = { name: part.metadata.name, uid: part.metadata.uid };
    expect(part.spec.sizeBytes).toBe(100 * 1024 ** 4);
    expect(part.spec.nodeName).toBeUndefined();
    expect(part.status?.state).toBe("Pending");
    const scheduled = part.status?.conditions?.find((x) => x.type === "Scheduled");
    expect(scheduled).toMatchObject({ status: "False", reason: "InsufficientCapacity" });
    expect(scheduled?.message).toContain("100 TiB");
    expect(scheduled?.message).toContain("without room");
    const placement = await waitEvent(lab, lab.namespace, {
      kind: "NVMePartition",
      name: part.metadata.name,
      uid: part.metadata.uid,
      reason: "FailedPlacement",
    });
    expect(placement.type).toBe("Warning");
    expect(placement.message).toContain("100 TiB");

    // The claim stays Pending and never gets a PV.
    const now = await lab.core.readNamespacedPersistentVolumeClaim({ name: "huge", namespace: ns });
    expect(now.status?.phase).toBe("Pending");
    expect(now.spec?.volumeName).toBeUndefined();
    await deleteClaim(lab, ns, "huge");
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 300_000);

// Once its claim is deleted, the external-provisioner forgets a claim it could not provision and never
// calls DeleteVolume; the CSI controller's orphan sweep deletes the partition instead (the lab runs
// it with a short grace period) and says so in an Event.
test("a PVC deleted while its size cannot be placed leaves no NVMePartition behind", async () => {
  const orphan = impossible;
  if (!orphan) throw new Error("the impossible-size test made no partition");
  try {
    await until(
      `NVMePartition ${orphan.name} gone after its claim was deleted`,
      async () => (await partitions.get(orphan.name, lab.namespace))?.metadata.uid !== orphan.uid,
      60_000,
    );
    const event = await waitEvent(lab, lab.namespace, {
      kind: "NVMePartition",
      name: orphan.name,
      uid: orphan.uid,
      reason: "OrphanCollected",
    });
    expect(event.type).toBe("Normal");
    expect(event.message).toContain("PersistentVolumeClaim");
    expect(event.message).toContain("/huge");
  } finally {
    // Only when the assertions failed is it still there; the lab stays clean for the suites after this one.
    await partitions.delete(orphan.name, lab.namespace, { uid: orphan.uid }).catch(() => false);
    await until(
      `NVMePartition ${orphan.name} deleted`,
      async () => (await partitions.get(orphan.name, lab.namespace))?.metadata.uid !== orphan.uid,
    );
  }
}, 300_000);

test("a size off the allocation unit is rounded up, and the PV, claim and partition all say the rounded size", async () => {
  const ns = await lab.newNamespace("bad");
  try {
    // 1G = 10^9 bytes, not a multiple of 4 MiB: rounded up to 239 units = 956Mi.
    await createClaim(lab, ns, "odd", { storageClass: "distort-lab-immediate", size: "1G" });
    const ref = await partitionOf(lab, ns, "odd");
    const rounded = 239 * 4 * 1024 * 1024;
    const pv = await lab.core.readPersistentVolume({ name: ref.pv });
    expect(pv.spec?.capacity?.storage).toBe("956Mi");
    const pvc = await until("the claim's status capacity", async () => {
      const c = await lab.core.readNamespacedPersistentVolumeClaim({ name: "odd", namespace: ns });
      return c.status?.capacity?.storage ? c : undefined;
    });
    expect(pvc.status?.capacity?.storage).toBe("956Mi");
    expect(pvc.spec?.resources?.requests?.storage).toBe("1G");
    const part = await until("the partition exported", async () => {
      const p = await partitions.get(ref.name, ref.namespace);
      return p?.status?.state === "Exported" ? p : undefined;
    });
    expect(part.spec.sizeBytes).toBe(rounded);
    expect(part.status?.allocatedBytes).toBe(rounded);

    // Edits the API server refuses on a live partition, with the rule's message.
    const shrink = await patchRejection(ref.name, { spec: { sizeBytes: rounded - 4 * 1024 * 1024 } });
    expect(shrink.code).toBe(422);
    expect(shrink.message).toContain("spec.sizeBytes may not shrink");
    const other = lab.storage.find((s) => s.name !== part.spec.nodeName)?.name ?? "elsewhere";
    const move = await patchRejection(ref.name, { spec: { nodeName: other } });
    expect(move.code).toBe(422);
    expect(move.message).toContain("spec.nodeName is immutable once set");
    const after = await partitions.get(ref.name, ref.namespace);
    expect(after?.spec.sizeBytes).toBe(rounded);
    expect(after?.spec.nodeName).toBe(part.spec.nodeName);
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 300_000);

test("an NVMeDeviceClaim for a serial no drive has stays Pending with a condition and Event naming the serial", async () => {
  const ns = await lab.newNamespace("bad");
  const claims = new ResourceClient(lab.conn, kinds.NVMeDeviceClaim);
  try {
    const serial = `NOSUCH${randomBytes(3).toString("hex").toUpperCase()}`;
    const made = await claims.create({
      apiVersion: API_VERSION,
      kind: "NVMeDeviceClaim",
      metadata: { name: "ghost", namespace: ns },
      spec: { serial },
    });
    const claim = await until("the claim's Bound condition", async () => {
      const c = await claims.get("ghost", ns);
      return c?.status?.conditions?.some((x) => x.type === "Bound") ? c : undefined;
    });
    expect(claim.status?.phase).toBe("Pending");
    expect(claim.status?.deviceName).toBeUndefined();
    expect(claim.status?.conditions?.find((x) => x.type === "Bound")).toMatchObject({
      status: "False",
      reason: "DeviceNotFound",
      message: `no NVMeDevice with serial ${serial}`,
    });
    const event = await waitEvent(lab, ns, {
      kind: "NVMeDeviceClaim",
      name: "ghost",
      uid: made.metadata.uid,
      reason: "DeviceNotFound",
    });
    expect(event.type).toBe("Warning");
    expect(event.message).toContain(serial);
    // Nothing was bound, so deleting it is not held up.
    await claims.delete("ghost", ns);
    await until("the claim gone", async () => !(await claims.get("ghost", ns)));
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 300_000);

test("a second NVMeDeviceClaim for a drive already claimed is refused with a condition naming the owner", async () => {
  const ns = await lab.newNamespace("bad");
  const claims = new ResourceClient(lab.conn, kinds.NVMeDeviceClaim);
  const devices = new ResourceClient(lab.conn, kinds.NVMeDevice);
  try {
    const serial = lab.storage[0]?.serials[0] ?? "";
    const owned = (await devices.list()).items.find((d: NVMeDevice) => d.spec.serial === serial);
    const owner = owned?.status?.claimRef;
    if (!owned || !owner) throw new Error(`drive ${serial} is not claimed in the lab`);
    const made = await claims.create({
      apiVersion: API_VERSION,
      kind: "NVMeDeviceClaim",
      metadata: { name: "dup", namespace: ns },
      spec: { serial },
    });
    const claim = await until("the claim's Bound condition", async () => {
      const c = await claims.get("dup", ns);
      return c?.status?.conditions?.some((x) => x.type === "Bound") ? c : undefined;
    });
    expect(claim.status?.phase).toBe("Pending");
    const bound = claim.status?.conditions?.find((x) => x.type === "Bound");
    expect(bound).toMatchObject({ status: "False", reason: "DeviceClaimedByOther" });
    expect(bound?.message).toBe(
      `device ${owned.metadata.name} is already claimed by ${owner.namespace}/${owner.name}`,
    );
    const event = await waitEvent(lab, ns, {
      kind: "NVMeDeviceClaim",
      name: "dup",
      uid: made.metadata.uid,
      reason: "DeviceClaimedByOther",
    });
    expect(event.message).toContain(`${owner.namespace}/${owner.name}`);
    // The drive still belongs to its first claim, and stays so after the refused one is deleted.
    await claims.delete("dup", ns);
    await until("the refused claim gone", async () => !(await claims.get("dup", ns)));
    const after = await devices.get(owned.metadata.name);
    expect(after?.status?.phase).toBe("Claimed");
    expect(after?.status?.claimRef).toEqual(owner);
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 300_000);

const badPartitions: { what: string; spec: Record<string, unknown>; says: string[] }[] = [
  {
    what: "spdk-lvol on the kernel backend",
    spec: { sizeBytes: 1073741824, backend: "kernel", volumeManager: "spdk-lvol" },
    says: ["spec.volumeManager", "spec.volumeManager spdk-lvol requires spec.backend spdk"],
  },
  {
    what: "a node without a device",
    spec: { sizeBytes: 1073741824, nodeName: "storage-a" },
    says: ["spec.deviceSerial", "spec.nodeName and spec.deviceSerial must be set together"],
  },
  {
    what: "a size of zero",
    spec: { sizeBytes: 0 },
    says: ["spec.sizeBytes", "should be greater than or equal to 1"],
  },
  {
    what: "an empty reactor mask",
    spec: { sizeBytes: 1073741824, targetOptions: { coreMask: "0x0" } },
    says: ["spec.targetOptions.coreMask", '"0x0"'],
  },
  {
    what: "an unknown backend",
    spec: { sizeBytes: 1073741824, backend: "floppy" },
    says: ["spec.backend", 'Unsupported value: "floppy"'],
  },
];

test("NVMePartitions made by hand with invalid specs are rejected by the API server, naming the field and rule", async () => {
  const ns = await lab.newNamespace("bad");
  try {
    for (const [i, c] of badPartitions.entries()) {
      const name = `bad-${i}`;
      const r = await rejection(ns, {
        apiVersion: API_VERSION,
        kind: "NVMePartition",
        metadata: { name, namespace: ns },
        spec: c.spec,
      });
      expect({ what: c.what, code: r.code }).toEqual({ what: c.what, code: 422 });
      for (const text of c.says) expect(`${c.what}: ${r.message}`).toContain(text);
      expect(await partitions.get(name, ns)).toBeUndefined();
    }
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 300_000);
