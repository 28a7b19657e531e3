// Partition -> CSI: volume context, health, and CreateVolume's verdict on each partition state.
import { expect, test } from "bun:test";
import * as v from "valibot";
import type { NVMePartition } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import { VolumeContextKeys, VolumeContextSchema } from "../../lib/volume-context.ts";
import type { VolumeRecord } from "./fingerprint.ts";
import {
  capacityOf,
  createVerdict,
  replicatedPortalsOf,
  volumeContextOf,
  volumeHealth,
} from "./volume-view.ts";

const T = "2026-01-01T00:00:00Z";
const cond = (
  type: string,
  status: "True" | "False" | "Unknown",
  reason: string,
  message = "",
  observedGeneration = 1,
) => ({
  type,
  status,
  reason,
  message,
  lastTransitionTime: T,
  observedGeneration,
});

function part(
  status: NVMePartition["status"],
  extra: Partial<NVMePartition["metadata"]> = {},
  nodeName?: string,
): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: "pvc-1", namespace: "ns", uid: "u1", generation: 1, ...extra },
    spec: {
      sizeBytes: 5 * 1024 * 1024,
      backend: "spdk",
      volumeManager: "partition",
      ...(nodeName ? { nodeName, deviceSerial: "S1" } : {}),
    },
    ...(status ? { status } : {}),
  };
}
const exported = part(
  {
    state: "Exported",
    nqn: "nqn.2026-02.io.distort:volume-vol-1",
    portalIP: "10.0.0.1",
    portalPort: 4420,
    transport: "tcp",
    allocatedBytes: 8 * 1024 * 1024,
    conditions: [cond("Ready", "True", "Exported")],
  },
  {},
  "n1",
);
const record: VolumeRecord = {
  v: 1,
  sizeBytes: 8 << 20,
  params: {
    backend: "spdk",
    volumeManager: "partition",
    transport: "tcp",
    ctrlLossTmo: 60,
    reconnectDelay: 2,
  },
  capabilities: [],
};

test("volume context of an exported partition, with recorded reconnect settings", () => {
  expect(volumeContextOf(exported, record)).toEqual({
    [VolumeContextKeys.nqn]: "nqn.2026-02.io.distort:volume-vol-1",
    [VolumeContextKeys.portalIP]: "10.0.0.1",
    [VolumeContextKeys.portalPort]: "4420",
    [VolumeContextKeys.transport]: "tcp",
    [VolumeContextKeys.ctrlLossTmo]: "60",
    [VolumeContextKeys.reconnectDelay]: "2",
  });
  expect(volumeContextOf(part({ state: "Provisioning", conditions: [] }), record)).toBeUndefined();
  expect(capacityOf(exported)).toBe(8 * 1024 * 1024);
  expect(capacityOf(part(undefined))).toBe(8 * 1024 * 1024);
});

const verdicts: [string, NVMePartition | undefined, "wait" | "done" | string][] = [
  ["not in the cache yet", undefined, "wait"],
  ["pending", part({ state: "Pending", conditions: [] }), "wait"],
  [
    "node stale: keep waiting",
    part({ state: "Pending", conditions: [cond("Scheduled", "False", "NodeStale")] }),
    "wait",
  ],
  [
    "no room",
    part({ state: "Pending", conditions: [cond("Scheduled", "False", "InsufficientCapacity", "0/3 fit")] }),
    "exhausted",
  ],
  [
    "no room, but judged on an older generation",
    part({ state: "Pending", conditions: [cond("Scheduled", "False", "NoClaimedDevice", "", 0)] }),
    "wait",
  ],
  [
    "provisioning",
    part({ state: "Provisioning", conditions: [cond("Ready", "Unknown", "Provisioning")] }, {}, "n1"),
    "wait",
  ],
  [
    "failed",
    part(
      { state: "Failed", conditions: [cond("Ready", "False", "BackendConflict", "locked to kernel")] },
      {},
      "n1",
    ),
    "unavailable",
  ],
  ["exported", exported, "done"],
  ["replaced", part({ state: "Exported", conditions: [] }, { uid: "u2" }), "busy"],
  ["being deleted", part({ state: "Pending", conditions: [] }, { deletionTimestamp: T }), "busy"],
];
for (const [name, p, want] of verdicts) {
  test(`CreateVolume verdict: ${name}`, () => {
    let got: string;
    try {
      const r = createVerdict(p, "u1");
      got = r ? "done" : "wait";
    } catch (e) {
      expect(e).toBeInstanceOf(StorageError);
      got = (e as StorageError).kind;
    }
    expect(got).toBe(want);
  });
}

test("health: exported and Ready is healthy; everything else inaccessible with a reason", () => {
  expect(volumeHealth(exported)).toEqual([]);
  expect(volumeHealth(part({ state: "Pending", conditions: [] }))[0]).toMatchObject({
    status: "INACCESSIBLE",
    reason: "NotExported",
  });
  expect(
    volumeHealth(part({ state: "Failed", conditions: [cond("Ready", "False", "ClaimMismatch")] }))[0]?.reason,
  ).toBe("ClaimMismatch");
  expect(
    volumeHealth({ ...exported, metadata: { ...exported.metadata, deletionTimestamp: T } })[0]?.reason,
  ).toBe("Deleting");
});

test("volume context lists every listener the agent read back once there are several, IPv6 in brackets", () => {
  const two = part(
    {
      ...(exported.status as NonNullable<NVMePartition["status"]>),
      portals: [
        { address: "10.0.0.1", port: 4420, anaState: "optimized" },
        { address: "fd00:100::7", port: 4420, anaState: "optimized" },
      ],
    },
    {},
    "n1",
  );
  const ctx = volumeContextOf(two, undefined);
  expect(ctx?.[VolumeContextKeys.portals]).toBe("10.0.0.1:4420,[fd00:100::7]:4420");
  // The node reads back the same two paths: the primary and one more.
  const parsed = v.parse(VolumeContextSchema, ctx);
  expect(parsed[VolumeContextKeys.portals]).toEqual([
    { address: "10.0.0.1", port: 4420 },
    { address: "fd00:100::7", port: 4420 },
  ]);
  // One listener (or none reported, from an older agent): no list, the primary portal alone.
  const one = part(
    {
      ...(exported.status as NonNullable<NVMePartition["status"]>),
      portals: [{ address: "10.0.0.1", port: 4420 }],
    },
    {},
    "n1",
  );
  expect(volumeContextOf(one, undefined)?.[VolumeContextKeys.portals]).toBeUndefined();
  expect(volumeContextOf(exported, undefined)?.[VolumeContextKeys.portals]).toBeUndefined();
});

test("replicatedPortalsOf: the serving portal first, then each exported copy's node at the volume's port, each once", () => {
  const exported = {
    state: "Exported" as const,
    conditions: [],
    nqn: "nqn.2026-02.io.distort:volume-x",
    portalIP: "10.0.0.1",
    portalPort: 4420,
  };
  const vol = { ...part(exported), spec: { ...part(exported).spec, replicas: 2 } };
  const copy = (
    name: string,
    status: NVMePartition["status"],
    uid = "u1",
    deleting = false,
  ): NVMePartition => ({
    ...part(status, { name, uid: `${name}-uid`, ...(deleting ? { deletionTimestamp: T } : {}) }),
    spec: { ...part(status).spec, replicaOf: { name: "pvc-1", uid } },
  });
  const copies = [
    copy("pvc-1-r1", {
      ...exported,
      portalIP: "10.0.0.2",
      portalPort: 4420,
      portals: [
        { address: "10.0.0.2", port: 4420 },
        { address: "10.0.1.2", port: 4420 },
      ],
    }),
    copy("pvc-1-r0", { ...exported, portalIP: "10.0.0.1", portalPort: 4420 }),
    copy("pvc-1-r2", { ...exported, portalIP: "10.0.0.3", portalPort: 4420 }, "other-volume"),
    copy("pvc-1-r3", { ...exported, portalIP: "10.0.0.4", portalPort: 4420 }, "u1", true),
    copy("pvc-1-r4", { state: "Provisioning", conditions: [] }),
  ];
  expect(replicatedPortalsOf(vol, copies)).toEqual([
    { address: "10.0.0.1", port: 4420 },
    { address: "10.0.0.2", port: 4420 },
    { address: "10.0.1.2", port: 4420 },
  ]);
  // One copy, or not served yet: nothing to add.
  expect(replicatedPortalsOf(part(exported), copies)).toEqual([]);
  expect(replicatedPortalsOf({ ...vol, status: { state: "Placed", conditions: [] } }, copies)).toEqual([]);
});
