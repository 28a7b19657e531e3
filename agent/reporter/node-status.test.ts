// RDMAStorageNode status: endpoint fields, claimed-capacity totals, export count, heartbeat, and
// the four conditions with their reasons for every combination of source health.
import { expect, test } from "bun:test";
import * as v from "valibot";
import { exampleNVMeDevice } from "../../api/examples.ts";
import type { NVMeDevice } from "../../api/nvme-device.ts";
import { type RDMAStorageNodeStatus, RDMAStorageNodeStatusSchema } from "../../api/rdma-storage-node.ts";
import type { SourceHealth } from "../discovery/inventory.ts";
import type { EndpointResult } from "../discovery/rdma-endpoint.ts";
import { claimedCapacity, type NodeObservation, nextNodeStatus } from "./node-status.ts";

const GiB = 1024 ** 3;
const now = new Date("2026-03-01T12:00:30Z");
const ok: SourceHealth = { state: "ok", reason: "Scanned", message: "2 local controller(s), 2 advertised" };
const endpoint: EndpointResult = {
  ok: true,
  endpoint: {
    ip: "192.168.100.10",
    transport: "rdma",
    linkSpeedMbps: 100_000,
    device: "mlx5_0",
    port: 1,
    netdev: "ens1f0",
  },
};
const obs = (extra: Partial<NodeObservation> = {}): NodeObservation => ({
  endpoint,
  inventory: { kernel: ok, spdk: ok, complete: true },
  capacity: { totalBytes: 10 * GiB, freeBytes: 4 * GiB, devices: 1 },
  exportCount: 3,
  ...extra,
});

const dev = (
  name: string,
  node: string,
  phase: "Available" | "Claimed" | "Unavailable",
  alloc: number,
  free?: number,
): NVMeDevice => {
  const d = exampleNVMeDevice();
  return {
    ...d,
    metadata: { name },
    spec: { ...d.spec, nodeName: node, allocatableBytes: alloc },
    status: {
      phase,
      ...(phase === "Available" ? {} : { claimRef: { namespace: "ns", name, uid: `uid-${name}` } }),
      ...(free === undefined ? {} : { freeBytes: free }),
      reservations: [],
      conditions: [],
    },
  };
};

test("claimed capacity: only Claimed devices of this node; unaccounted free counts as 0", () => {
  const c = claimedCapacity(
    [
      dev("a", "n1", "Claimed", 100 * GiB, 60 * GiB),
      dev("b", "n1", "Claimed", 50 * GiB), // manager has not written freeBytes yet
      dev("c", "n1", "Available", 70 * GiB, 70 * GiB),
      dev("d", "n1", "Unavailable", 80 * GiB, 80 * GiB), // claim kept, hardware gone
      dev("e", "n2", "Claimed", 90 * GiB, 90 * GiB),
      dev("f", "n1", "Claimed", 10 * GiB, 20 * GiB), // free above allocatable after a shrink
    ],
    "n1",
  );
  expect(c).toEqual({ totalBytes: 160 * GiB, freeBytes: 70 * GiB, devices: 3 });
});

const cond = (s: RDMAStorageNodeStatus, type: string) => {
  const c = s.conditions.find((x) => x.type === type);
  return c ? [c.status, c.reason] : undefined;
};

interface Row {
  name: string;
  obs: NodeObservation;
  ready: [string, string];
  kernel: [string, string];
  spdk: [string, string];
  inventory: [string, string];
}

const degraded = (reason: string): SourceHealth => ({
  state: "degraded",
  reason,
  message: "Nvme1: no namespace 1",
});
const failed = (reason: string): SourceHealth => ({ state: "failed", reason, message: "connection refused" });

const rows: Row[] = [
  {
    name: "everything fine",
    obs: obs(),
    ready: ["True", "RdmaEndpointReady"],
    kernel: ["True", "Scanned"],
    spdk: ["True", "Scanned"],
    inventory: ["True", "InventoryComplete"],
  },
  {
    name: "no SPDK on the node is still complete",
    obs: obs({
      inventory: { kernel: ok, spdk: { state: "ok", reason: "NotConfigured", message: "" }, complete: true },
    }),
    ready: ["True", "RdmaEndpointReady"],
    kernel: ["True", "Scanned"],
    spdk: ["True", "NotConfigured"],
    inventory: ["True", "InventoryComplete"],
  },
  {
    name: "SPDK degraded",
    obs: obs({ inventory: { kernel: ok, spdk: degraded("Namespace1Missing"), complete: false } }),
    ready: ["True", "RdmaEndpointReady"],
    kernel: ["True", "Scanned"],
    spdk: ["False", "Namespace1Missing"],
    inventory: ["False", "SpdkInventoryNotReady"],
  },
  {
    name: "kernel failed",
    obs: obs({ inventory: { kernel: failed("MountCheckFailed"), spdk: ok, complete: false } }),
    ready: ["True", "RdmaEndpointReady"],
    kernel: ["False", "MountCheckFailed"],
    spdk: ["True", "Scanned"],
    inventory: ["False", "KernelInventoryNotReady"],
  },
  {
    name: "both sources down, no endpoint",
    obs: obs({
      inventory: { kernel: failed("SysfsUnreadable"), spdk: failed("RpcFailed"), complete: false },
      endpoint: { ok: false, reason: "NoActiveRdmaPort", message: "mlx5_0/1 DOWN" },
    }),
    ready: ["False", "NoActiveRdmaPort"],
    kernel: ["False", "SysfsUnreadable"],
    spdk: ["False", "RpcFailed"],
    inventory: ["False", "SourcesNotReady"],
  },
  {
    name: "sources ok but the scan is flagged incomplete",
    obs: obs({ inventory: { kernel: ok, spdk: ok, complete: false } }),
    ready: ["True", "RdmaEndpointReady"],
    kernel: ["True", "Scanned"],
    spdk: ["True", "Scanned"],
    inventory: ["False", "InventoryIncomplete"],
  },
];

test.each(rows)("conditions: $name", (row) => {
  const s = nextNodeStatus(undefined, 2, row.obs, now);
  expect(cond(s, "Ready")).toEqual(row.ready);
  expect(cond(s, "KernelInventoryReady")).toEqual(row.kernel);
  expect(cond(s, "SpdkInventoryReady")).toEqual(row.spdk);
  expect(cond(s, "NVMeInventoryReady")).toEqual(row.inventory);
  for (const c of s.conditions) expect(c.observedGeneration).toBe(2);
  expect(v.safeParse(RDMAStorageNodeStatusSchema, s).success).toBe(true);
});

test("fields: endpoint, totals, exports, heartbeat", () => {
  const s = nextNodeStatus(undefined, 1, obs(), now);
  expect(s).toMatchObject({
    rdmaIP: "192.168.100.10",
    transport: "rdma",
    linkSpeedMbps: 100_000,
    totalBytes: 10 * GiB,
    freeBytes: 4 * GiB,
    exportCount: 3,
    lastHeartbeatTime: "2026-03-01T12:00:30.000Z",
    observedGeneration: 1,
  });
});

test("losing the endpoint drops the stale portal; an unreadable export count keeps the last one", () => {
  const before = nextNodeStatus(undefined, 1, obs(), now);
  const after = nextNodeStatus(
    before,
    1,
    obs({ endpoint: { ok: false, reason: "NoUsableAddress", message: "" }, exportCount: undefined }),
    new Date("2026-03-01T12:01:00Z"),
  );
  expect(after.rdmaIP).toBeUndefined();
  expect(after.transport).toBeUndefined();
  expect(after.linkSpeedMbps).toBeUndefined();
  expect(after.exportCount).toBe(3);
  expect(after.lastHeartbeatTime).toBe("2026-03-01T12:01:00.000Z");
  // Ready flipped, so its transition time moved; the inventory conditions did not.
  const t = (s: RDMAStorageNodeStatus, type: string) =>
    s.conditions.find((c) => c.type === type)?.lastTransitionTime;
  expect(t(after, "Ready")).toBe("2026-03-01T12:01:00Z");
  expect(t(after, "NVMeInventoryReady")).toBe("2026-03-01T12:00:30Z");
});

test("conditions written by others (the manager's stale-heartbeat Ready aside) are kept", () => {
  const before: RDMAStorageNodeStatus = {
    conditions: [
      {
        type: "Draining",
        status: "True",
        reason: "Operator",
        message: "",
        lastTransitionTime: "2026-01-01T00:00:00Z",
      },
    ],
  };
  const after = nextNodeStatus(before, 1, obs(), now);
  expect(after.conditions.map((c) => c.type)).toEqual([
    "Draining",
    "Ready",
    "KernelInventoryReady",
    "SpdkInventoryReady",
    "NVMeInventoryReady",
  ]);
});

test("the SPDK version is recorded, and kept by a pass that could not read it", () => {
  const before = nextNodeStatus(
    undefined,
    1,
    obs({ inventory: { kernel: ok, spdk: ok, complete: true, spdkVersion: "v25.05.1" } }),
    now,
  );
  expect(before.spdkVersion).toBe("v25.05.1");
  expect(nextNodeStatus(before, 1, obs(), now).spdkVersion).toBe("v25.05.1");
  expect(nextNodeStatus(undefined, 1, obs(), now).spdkVersion).toBeUndefined();
});

test("an SPDK target below the minimum makes SpdkInventoryReady False with the reason, and no placement", () => {
  const tooOld = {
    state: "failed" as const,
    reason: "SpdkVersionUnsupported",
    message: "the target runs SPDK v24.09.0",
  };
  const s = nextNodeStatus(
    undefined,
    1,
    obs({ inventory: { kernel: ok, spdk: tooOld, complete: false, spdkVersion: "v24.09.0" } }),
    now,
  );
  expect(s.spdkVersion).toBe("v24.09.0");
  expect(s.conditions.find((c) => c.type === "SpdkInventoryReady")).toMatchObject({
    status: "False",
    reason: "SpdkVersionUnsupported",
  });
  expect(s.conditions.find((c) => c.type === "NVMeInventoryReady")?.status).toBe("False");
});

test("quantities for kubectl get, and the transports the node's exports really use", () => {
  const s = nextNodeStatus(undefined, 1, obs({ servedTransports: ["tcp", "tcp", "rdma"] }), now);
  expect(s).toMatchObject({ total: "10Gi", free: "4Gi", transport: "rdma", servedTransports: "rdma,tcp" });
  // A listener found over RDMA while every volume is served over TCP: Serves says tcp.
  const tcpOnly = nextNodeStatus(s, 1, obs({ servedTransports: ["tcp"] }), now);
  expect(tcpOnly.servedTransports).toBe("tcp");
  // Unread this pass: the previous value stays; no exports: empty.
  expect(nextNodeStatus(tcpOnly, 1, obs(), now).servedTransports).toBe("tcp");
  expect(nextNodeStatus(tcpOnly, 1, obs({ servedTransports: [] }), now).servedTransports).toBe("");
});

test("a configured portal address claims no listener transport; what the node serves is servedTransports", () => {
  const configured: EndpointResult = {
    ok: true,
    endpoint: { ip: "198.18.0.11", device: "configured", port: 1, netdev: "configured" },
  };
  const s = nextNodeStatus(
    undefined,
    2,
    obs({ endpoint: configured, servedTransports: ["tcp", "tcp"] }),
    now,
  );
  expect(v.safeParse(RDMAStorageNodeStatusSchema, s).success).toBe(true);
  expect(s.rdmaIP).toBe("198.18.0.11");
  expect("transport" in s).toBe(false);
  expect(s.servedTransports).toBe("tcp");
  const ready = s.conditions?.find((c) => c.type === "Ready");
  expect([ready?.status, ready?.reason, ready?.message]).toEqual([
    "True",
    "PortalConfigured",
    "198.18.0.11 (configured portal address)",
  ]);
});
