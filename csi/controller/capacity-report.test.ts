// GetCapacity arithmetic over devices and storage nodes.
import { expect, test } from "bun:test";
import type { NVMeDevice, RDMAStorageNode } from "../../api/index.ts";
import { availableCapacity, deviceFreeBytes } from "./capacity-report.ts";

const GiB = 1024 ** 3;
const T = "2026-01-01T00:00:00Z";

function device(
  name: string,
  node: string,
  free: number | undefined,
  extra: Partial<NonNullable<NVMeDevice["status"]>> = {},
): NVMeDevice {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDevice",
    metadata: { name },
    spec: {
      nodeName: node,
      pciAddress: "0000:01:00.0",
      serial: name,
      model: "m",
      allocatableBytes: 100 * GiB,
      numaNode: 0,
    },
    status: {
      phase: "Claimed",
      claimRef: { namespace: "ns", name: "c", uid: "u" },
      ...(free === undefined ? {} : { freeBytes: free }),
      reservations: [],
      conditions: [],
      ...extra,
    },
  };
}
function node(name: string, labels: Record<string, string>, ready = true, inventory = true): RDMAStorageNode {
  const c = (type: string, ok: boolean) => ({
    type,
    status: ok ? ("True" as const) : ("False" as const),
    reason: "R",
    message: "",
    lastTransitionTime: T,
  });
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name, namespace: "ns", labels },
    spec: { nodeName: name },
    status: { lastHeartbeatTime: T, conditions: [c("Ready", ready), c("NVMeInventoryReady", inventory)] },
  };
}

const devices = [
  device("d1", "n1", 10 * GiB),
  device("d2", "n1", 30 * GiB + 1),
  device("d3", "n2", 50 * GiB),
  device("d4", "n3", 70 * GiB), // node not ready
  device("d5", "n1", 90 * GiB, { phase: "Available", claimRef: undefined }),
  device("d6", "n2", 5 * GiB, { activeBackend: "kernel" }),
  device("d7", "n4", 80 * GiB), // no storage node record
];
const nodes = [node("n1", { zone: "a" }), node("n2", { zone: "b" }), node("n3", { zone: "a" }, false)];

const rows: [string, Parameters<typeof availableCapacity>[2], number, number][] = [
  ["spdk everywhere", { backend: "spdk" }, 50 * GiB, 90 * GiB + 1],
  ["kernel everywhere (d6 counts, nothing locked to spdk)", { backend: "kernel" }, 50 * GiB, 95 * GiB + 1],
  // 40 GiB free in zone a, but no device there holds more than 30 GiB (+1 byte, below a unit).
  [
    "zone a: one device's room, not the sum",
    { backend: "spdk", segments: { zone: "a" } },
    30 * GiB,
    40 * GiB + 1,
  ],
  ["zone b", { backend: "spdk", segments: { zone: "b" } }, 50 * GiB, 50 * GiB],
  ["unknown zone", { backend: "spdk", segments: { zone: "z" } }, 0, 0],
];
for (const [name, q, largest, total] of rows) {
  test(name, () => {
    expect(availableCapacity(devices, nodes, q)).toEqual({
      largestVolumeBytes: largest,
      totalFreeBytes: total,
    });
  });
}

test("less than one allocation unit free on every device is no room at all", () => {
  const d = device("d", "n1", 4 * 1024 * 1024 - 1);
  expect(availableCapacity([d], [node("n1", {})], { backend: "spdk" }).largestVolumeBytes).toBe(0);
});

test("without the manager's figure, free is allocatable minus the ledger", () => {
  const d = device("d", "n1", undefined, {
    reservations: [{ uid: "p", namespace: "ns", name: "p", bytes: 40 * GiB }],
  });
  expect(deviceFreeBytes(d)).toBe(60 * GiB);
  expect(availableCapacity([d], [node("n1", {}, true, false)], { backend: "spdk" }).largestVolumeBytes).toBe(
    0,
  );
});
