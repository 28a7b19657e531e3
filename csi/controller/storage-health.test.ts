// A placed volume's health from its storage node's heartbeat and Ready, and its drive's phase.
import { expect, test } from "bun:test";
import type { NVMeDevice, NVMePartition, RDMAStorageNode } from "../../api/index.ts";
import { storageHealth } from "./storage-health.ts";

const NOW = Date.parse("2026-06-01T12:00:00Z");
const iso = (msAgo: number) => new Date(NOW - msAgo).toISOString().replace(/\.\d+Z$/, "Z");

const part = (placed = true): NVMePartition => ({
  apiVersion: "storage.distort.io/v1alpha1",
  kind: "NVMePartition",
  metadata: { name: "pvc-1", namespace: "ns", uid: "u" },
  spec: {
    sizeBytes: 4 * 1024 * 1024,
    backend: "spdk",
    volumeManager: "spdk-lvol",
    ...(placed ? { nodeName: "s1", deviceSerial: "SN1" } : {}),
  },
});
const node = (msAgo: number | undefined, ready = true, ns = "ns"): RDMAStorageNode => ({
  apiVersion: "storage.distort.io/v1alpha1",
  kind: "RDMAStorageNode",
  metadata: { name: "s1", namespace: ns },
  spec: { nodeName: "s1" },
  status: {
    ...(msAgo === undefined ? {} : { lastHeartbeatTime: iso(msAgo) }),
    conditions: [
      {
        type: "Ready",
        status: ready ? "True" : "False",
        reason: "R",
        message: "m",
        lastTransitionTime: iso(0),
      },
    ],
  },
});
const drive = (phase: "Claimed" | "Unavailable" = "Claimed", serial = "SN1"): NVMeDevice => ({
  apiVersion: "storage.distort.io/v1alpha1",
  kind: "NVMeDevice",
  metadata: { name: `s1-${serial}` },
  spec: { nodeName: "s1", pciAddress: "0000:01:00.0", serial, model: "m", allocatableBytes: 1, numaNode: 0 },
  status: { phase, claimRef: { namespace: "ns", name: "c", uid: "c" }, reservations: [], conditions: [] },
});
const view = (storageNodes: RDMAStorageNode[], devices: NVMeDevice[]) => ({
  storageNodes,
  devices,
  nowMs: NOW,
  stalenessMs: 90_000,
});
const reasons = (p: NVMePartition, nodes: RDMAStorageNode[], devices: NVMeDevice[]) =>
  storageHealth(p, view(nodes, devices)).map((i) => i.reason);

const rows: [string, NVMePartition, RDMAStorageNode[], NVMeDevice[], string[]][] = [
  ["fresh heartbeat, drive claimed", part(), [node(10_000)], [drive()], []],
  ["heartbeat just inside the bound", part(), [node(90_000)], [drive()], []],
  [
    "heartbeat past the bound, Ready still True (the agent is gone)",
    part(),
    [node(90_001)],
    [drive()],
    ["StorageNodeStale"],
  ],
  ["never a heartbeat", part(), [node(undefined)], [drive()], ["StorageNodeStale"]],
  ["no storage node record", part(), [], [drive()], ["StorageNodeMissing"]],
  ["fresh but Ready=False", part(), [node(1000, false)], [drive()], ["StorageNodeNotReady"]],
  ["the freshest of two records counts", part(), [node(600_000, true, "old"), node(1000)], [drive()], []],
  ["drive gone from the inventory", part(), [node(1000)], [drive("Unavailable")], ["DriveUnavailable"]],
  ["no NVMeDevice for the serial", part(), [node(1000)], [drive("Claimed", "OTHER")], ["DriveMissing"]],
  ["both dead", part(), [node(600_000)], [drive("Unavailable")], ["StorageNodeStale", "DriveUnavailable"]],
  ["not placed yet: the partition's state speaks", part(false), [], [], []],
];
for (const [name, p, nodes, devices, want] of rows)
  test(name, () => {
    expect(reasons(p, nodes, devices)).toEqual(want);
  });

test("every issue is INACCESSIBLE and names the node or the drive", () => {
  const issues = storageHealth(part(), view([node(600_000)], [drive("Unavailable")]));
  expect(issues.map((i) => i.status)).toEqual(["INACCESSIBLE", "INACCESSIBLE"]);
  expect(issues[0]?.message).toContain("600 s ago (bound 90 s)");
  expect(issues[1]?.message).toContain("SN1");
});
