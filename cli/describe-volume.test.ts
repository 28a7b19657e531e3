import { expect, test } from "bun:test";
import type { NVMeDevice } from "../api/nvme-device.ts";
import type { NVMePartition } from "../api/nvme-partition.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { Condition } from "../lib/kube/conditions.ts";
import { buildVolumeChain, renderVolumeChain, type VolumeChainInput } from "./describe-volume.ts";

const UID = "6d1f7c1e-0000-4000-8000-000000000002";
const t = "2026-12-02T00:00:00Z";
const c = (type: string, status: "True" | "False", reason: string, message = ""): Condition => ({
  type,
  status,
  reason,
  message,
  lastTransitionTime: t,
});

const pvc = {
  metadata: { name: "data", namespace: "app" },
  spec: { volumeName: "pvc-1", storageClassName: "distort" },
  status: { phase: "Bound", capacity: { storage: "1Gi" } },
};
const pv = {
  metadata: { name: "pvc-1" },
  spec: { csi: { driver: "storage.distort.io", volumeHandle: `distort-system/pvc-1/${UID}` } },
  status: { phase: "Bound" },
};
const partition = {
  apiVersion: "storage.distort.io/v1alpha1",
  kind: "NVMePartition",
  metadata: { name: "pvc-1", namespace: "distort-system", uid: UID },
  spec: {
    sizeBytes: 1024 ** 3,
    nodeName: "n1",
    deviceSerial: "S1",
    backend: "spdk",
    volumeManager: "spdk-lvol",
  },
  status: {
    state: "Exported",
    nqn: "nqn.2026-02.io.distort:volume-vol-1",
    transport: "tcp",
    portalIP: "10.0.0.1",
    portalPort: 4420,
    conditions: [c("Ready", "True", "Exported")],
  },
} as unknown as NVMePartition;
const device = {
  metadata: { name: "d1" },
  spec: { nodeName: "n1", serial: "S1", allocatableBytes: 34015805440, pciAddress: "0000:3b:00.0" },
  status: {
    phase: "Claimed",
    conditions: [c("Overcommitted", "True", "PlacedExceedsAllocatable", "too much")],
  },
} as unknown as NVMeDevice;
const attachment = (annotations: Record<string, string> = {}, ready = true): NVMeVolumeAttachment =>
  ({
    metadata: { name: "pvc-1-x", namespace: "distort-system", annotations },
    spec: { partitionName: "pvc-1", partitionUID: UID, nodeId: "n2", hostNQN: "nqn.h", attachmentId: "a1" },
    status: {
      observedAttachmentId: "a1",
      conditions: [c("AccessReady", ready ? "True" : "False", ready ? "HostAllowed" : "Pending")],
    },
  }) as unknown as NVMeVolumeAttachment;

const input = (extra: Partial<VolumeChainInput> = {}): VolumeChainInput => ({
  pvc,
  pv,
  partition,
  attachments: [attachment()],
  volumeAttachments: [],
  ...extra,
});

test("a whole chain with an overcommitted drive: the device's condition is the problem", () => {
  const chain = buildVolumeChain(input({ device }));
  expect(chain.links.map((l) => l.kind)).toEqual([
    "PersistentVolumeClaim",
    "PersistentVolume",
    "NVMePartition",
    "NVMeDevice",
    "NVMeVolumeAttachment",
  ]);
  expect(chain.subsystem).toEqual({
    nqn: "nqn.2026-02.io.distort:volume-vol-1",
    transport: "tcp",
    portal: "10.0.0.1:4420",
    hosts: [{ hostNQN: "nqn.h", node: "n2", attachment: "pvc-1-x", enforced: true }],
  });
  expect(chain.problems).toEqual([
    "NVMeDevice d1: Overcommitted=True PlacedExceedsAllocatable: too much",
    "no RDMAStorageNode for node n1: its agent has not reported",
  ]);
  expect(chain.healthy).toBe(false);
  const text = renderVolumeChain(chain);
  expect(text).toContain("  ! Overcommitted=True PlacedExceedsAllocatable: too much\n");
  expect(text).toContain("allocatable=31.7 GiB");
  expect(text).toContain("Problems:\n  - NVMeDevice d1");
});

test("broken links are named: unbound claim, foreign driver, recreated partition, missing partition", () => {
  expect(
    buildVolumeChain({
      pvc: { metadata: pvc.metadata, spec: {}, status: { phase: "Pending" } },
      attachments: [],
      volumeAttachments: [],
    }).problems,
  ).toEqual(["claim app/data is not bound to a volume yet (phase Pending)"]);
  const foreign = { ...pv, spec: { csi: { driver: "ebs.csi.aws.com", volumeHandle: "vol-1" } } };
  expect(buildVolumeChain(input({ pv: foreign, partition: undefined, attachments: [] })).problems).toEqual([
    "volume pvc-1 is not a DISTORT volume (driver ebs.csi.aws.com)",
  ]);
  const recreated = { ...partition, metadata: { ...partition.metadata, uid: "other" } } as NVMePartition;
  expect(buildVolumeChain(input({ partition: recreated, device })).problems[0]).toContain("it was recreated");
  expect(buildVolumeChain(input({ partition: undefined, attachments: [] })).problems).toEqual([
    "NVMePartition distort-system/pvc-1 does not exist",
  ]);
  expect(buildVolumeChain(input({ pv: undefined, partition: undefined, attachments: [] })).problems).toEqual([
    "PersistentVolume pvc-1 does not exist",
  ]);
});

test("a fenced, not yet admitted attachment is reported as both", () => {
  const chain = buildVolumeChain(
    input({ attachments: [attachment({ "storage.distort.io/fenced": "true" }, false)] }),
  );
  expect(chain.subsystem?.hosts[0]?.enforced).toBe(false);
  expect(chain.problems).toContain(
    "NVMeVolumeAttachment pvc-1-x: node n2 is fenced; the next publish on another node takes the volume over",
  );
  expect(chain.problems).toContain("NVMeVolumeAttachment pvc-1-x: AccessReady=False Pending");
});

test("a replicated volume lists its copies; a stale one is a problem that says why", () => {
  const replicated = {
    ...partition,
    spec: { ...partition.spec, deviceSerial: undefined, replicas: 2 },
    status: {
      ...partition.status,
      dataGeneration: 3,
      replicas: [
        { name: "pvc-1-r0", nodeName: "n1", state: "Online", generation: 3 },
        { name: "pvc-1-r1", nodeName: "n2", state: "Stale", generation: 2, message: "left out at failover" },
      ],
    },
  } as unknown as NVMePartition;
  const chain = buildVolumeChain(input({ partition: replicated }));
  const link = chain.links.find((l) => l.kind === "NVMePartition");
  expect(link?.fields).toMatchObject({
    copies: 2,
    dataGeneration: 3,
    replicas: "pvc-1-r0@n1:Online/g3 pvc-1-r1@n2:Stale/g2",
  });
  expect(chain.problems).toContain("copy pvc-1-r1 on n2 is Stale at generation 2 of 3: left out at failover");
  expect(chain.healthy).toBe(false);
  expect(renderVolumeChain(chain)).toContain("pvc-1-r1@n2:Stale/g2");
  expect(link?.fields.rebuildSlot).toBeNull();
});

test("a replicated volume's rebuild slot: queued with the manager's reason, or granted", () => {
  const slot = { replica: "pvc-1-r1", uid: "u1", node: "n1", requestedAt: "2026-02-01T10:00:00.000Z" };
  const withSlot = (rebuildSlot: object) =>
    ({
      ...partition,
      spec: { ...partition.spec, deviceSerial: undefined, replicas: 2 },
      status: { ...partition.status, dataGeneration: 3, replicas: [], rebuildSlot },
    }) as unknown as NVMePartition;
  const fields = (p: NVMePartition) =>
    buildVolumeChain(input({ partition: p })).links.find((l) => l.kind === "NVMePartition")?.fields;
  expect(fields(withSlot({ ...slot, message: "cluster rebuild cap 4 reached" }))?.rebuildSlot).toBe(
    "pvc-1-r1 for n1: queued since 2026-02-01T10:00:00.000Z (cluster rebuild cap 4 reached)",
  );
  expect(fields(withSlot({ ...slot, grantedAt: "2026-02-01T10:00:05.000Z" }))?.rebuildSlot).toBe(
    "pvc-1-r1 for n1: granted 2026-02-01T10:00:05.000Z",
  );
});
