// Storage-node freshness, table-driven: when Ready is expired, what the node's devices say, and
// when the reconciler looks again.
import { describe, expect, test } from "bun:test";
import type { NVMeDevice, RDMAStorageNode } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { cond, device, storageNode, T0 } from "../testdata/fixtures.ts";
import { decideNode } from "./node-core.ts";

const WINDOW = 60_000;

function view(nodes: RDMAStorageNode[], devices: NVMeDevice[] = []): Inventory {
  const inv = new Inventory();
  for (const n of nodes) inv.setNode(n);
  for (const d of devices) inv.setDevice(d);
  return inv;
}

describe("decideNode", () => {
  const cases: {
    name: string;
    nodes: RDMAStorageNode[];
    now: number;
    expire: boolean;
    device: { status: "True" | "False"; reason: string };
    requeue?: number;
  }[] = [
    {
      name: "fresh node: nothing expired, look again when it would go stale",
      nodes: [storageNode("node-a", { heartbeat: T0 })],
      now: T0 + 10_000,
      expire: false,
      device: { status: "True", reason: "NodeReady" },
      requeue: WINDOW - 10_000 + 1,
    },
    {
      name: "exactly at the window edge it is still fresh",
      nodes: [storageNode("node-a", { heartbeat: T0 })],
      now: T0 + WINDOW,
      expire: false,
      device: { status: "True", reason: "NodeReady" },
      requeue: 1,
    },
    {
      name: "stale node: Ready expires",
      nodes: [storageNode("node-a", { heartbeat: T0 })],
      now: T0 + WINDOW + 1,
      expire: true,
      device: { status: "False", reason: "HeartbeatStale" },
    },
    {
      name: "never reported: Ready expires",
      nodes: [storageNode("node-a", { heartbeat: undefined })],
      now: T0,
      expire: true,
      device: { status: "False", reason: "NoHeartbeat" },
    },
    {
      name: "already expired: not written again",
      nodes: [
        (() => {
          const n = storageNode("node-a", { heartbeat: T0 });
          n.status!.conditions = [cond("Ready", "False", "HeartbeatStale")];
          return n;
        })(),
      ],
      now: T0 + 10 * WINDOW,
      expire: false,
      device: { status: "False", reason: "HeartbeatStale" },
    },
    {
      name: "fresh but not usable: devices say why, Ready left to the agent",
      nodes: [storageNode("node-a", { heartbeat: T0, inventory: false })],
      now: T0,
      expire: false,
      device: { status: "False", reason: "InventoryNotReady" },
      requeue: WINDOW + 1,
    },
    {
      name: "no record: devices report NodeMissing",
      nodes: [],
      now: T0,
      expire: false,
      device: { status: "False", reason: "NodeMissing" },
    },
    {
      name: "two records: the fresh one counts for devices, the stale one expires",
      nodes: [
        storageNode("node-a", { heartbeat: T0 - 10 * WINDOW, name: "old" }),
        storageNode("node-a", { heartbeat: T0, name: "new" }),
      ],
      now: T0 + 1000,
      expire: true,
      device: { status: "True", reason: "NodeReady" },
      requeue: WINDOW - 1000 + 1,
    },
  ];
  test.each(cases)("$name", (c) => {
    const out = decideNode("node-a", view(c.nodes, [device("d1", { node: "node-a" })]), c.now, WINDOW);
    expect(out.nodePatches.length > 0).toBe(c.expire);
    for (const np of out.nodePatches) {
      expect(np.patch.conditions?.[0]).toMatchObject({
        type: "Ready",
        status: "False",
        reason: "HeartbeatStale",
      });
    }
    expect(out.events.length).toBe(out.nodePatches.length);
    expect(out.devicePatches).toHaveLength(1);
    expect(out.devicePatches[0]?.patch.conditions?.[0]).toMatchObject({
      type: "StorageNodeReady",
      ...c.device,
    });
    expect(out.requeueAfterMs).toBe(c.requeue);
  });

  test("a device already showing the verdict is not patched", () => {
    const n = storageNode("node-a", { heartbeat: T0 });
    const first = decideNode("node-a", view([n], [device("d1", { phase: "Available" })]), T0, WINDOW);
    const patched = device("d1", { phase: "Available" });
    const c = first.devicePatches[0]!.patch.conditions![0]!;
    patched.status!.conditions = [{ ...c, lastTransitionTime: "2026-02-01T10:00:00Z" }];
    expect(decideNode("node-a", view([n], [patched]), T0, WINDOW).devicePatches).toEqual([]);
  });

  test("the stale message names the last heartbeat and the window", () => {
    const out = decideNode(
      "node-a",
      view([storageNode("node-a", { heartbeat: T0 })]),
      T0 + 2 * WINDOW,
      WINDOW,
    );
    expect(out.nodePatches[0]?.patch.conditions?.[0]?.message).toBe(
      "no heartbeat since 2026-02-01T10:00:00.000Z (staleness window 60 s)",
    );
  });
});
