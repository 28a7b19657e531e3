// Drain decisions on plain objects: the replica core replacing a draining copy before it is
// retired (never fewer current copies), then deleting it once the serving node lowered it; and
// the Drained condition of a draining node or drive.
import { describe, expect, test } from "bun:test";
import type { RDMAStorageNode, ReplicaStatus } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { servingNodeLost, servingReleased } from "../replicas/failover.ts";
import { decideReplicas, REPLICAS_FINALIZER } from "../replicas/replica-core.ts";
import { device, GiB, partition, storageNode, T0 } from "../testdata/fixtures.ts";
import { copyDrain, decideDrained, drainLeft } from "./drain-core.ts";

const NS = "distort-system";
const NOW = T0 + 10_000;
const CFG = { stalenessMs: 60_000 };

function volume(replicas: ReplicaStatus[], o: { want?: number; gen?: number; node?: string } = {}) {
  const v = partition(NS, "vol", { uid: "uid-vol", size: 2 * GiB });
  v.spec.replicas = o.want ?? 2;
  v.spec.nodeName = o.node ?? "node-b";
  v.metadata.finalizers = [REPLICAS_FINALIZER];
  v.status = { state: "Exported", conditions: [], dataGeneration: o.gen ?? 3, replicas };
  return v;
}

function replica(i: number, node: string, state: "Exported" | "Pending" = "Exported") {
  const r = partition(NS, `vol-r${i}`, { uid: `uid-r${i}`, node, serial: `SER-${node}`, state });
  r.spec.replicaOf = { name: "vol", uid: "uid-vol" };
  return r;
}

const online = (i: number, node: string, gen = 3, extra: Partial<ReplicaStatus> = {}): ReplicaStatus => ({
  name: `vol-r${i}`,
  uid: `uid-r${i}`,
  nodeName: node,
  deviceSerial: `SER-${node}`,
  state: "Online",
  generation: gen,
  ...extra,
});

function view(drain: { nodes?: string[]; devices?: string[] } = {}) {
  const inv = new Inventory();
  for (const n of ["node-a", "node-b", "node-c", "node-d"]) {
    const sn = storageNode(n, { heartbeat: T0 });
    if (drain.nodes?.includes(n)) sn.spec.drain = true;
    inv.setNode(sn);
    const d = device(`dev-${n}`, { node: n, serial: `SER-${n}` });
    if (drain.devices?.includes(n)) d.spec.drain = true;
    inv.setDevice(d);
  }
  return inv;
}

describe("copyDrain", () => {
  test("names the node drain, then the drive drain, else nothing", () => {
    expect(copyDrain(replica(0, "node-a"), view({ nodes: ["node-a"] }))).toBe("drain of node node-a");
    expect(copyDrain(replica(0, "node-a"), view({ devices: ["node-a"] }))).toBe("drain of device dev-node-a");
    expect(copyDrain(replica(0, "node-a"), view({ devices: ["node-b"] }))).toBeUndefined();
  });
});

describe("decideReplicas under a drain", () => {
  const copies = [replica(0, "node-a"), replica(1, "node-b")];

  test("a draining copy gets a replacement first (replicas+1) and is not retired yet", () => {
    const v = volume([online(0, "node-a"), online(1, "node-b")]);
    const out = decideReplicas(v, copies, view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.create.map((c) => c.name)).toEqual(["vol-r2"]);
    expect(out.delete).toEqual([]);
    expect(out.status?.set.replicas?.find((e) => e.name === "vol-r0")?.retiring).toBeUndefined();
    expect(out.events.map((e) => e.reason)).toContain("ReplicaReplacing");
  });

  test("while the replacement is not current, nothing is retired and nothing more is created", () => {
    const v = volume([
      online(0, "node-a"),
      online(1, "node-b"),
      { name: "vol-r2", uid: "uid-r2", nodeName: "node-c", state: "Rebuilding", generation: 0 },
    ]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.create).toEqual([]);
    expect(out.delete).toEqual([]);
    expect(out.status?.set.replicas?.some((e) => e.retiring)).toBe(false);
  });

  test("once the replacement is current, the draining copy is marked retiring (the copy stays)", () => {
    const v = volume([online(0, "node-a"), online(1, "node-b"), online(2, "node-c")]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.create).toEqual([]);
    expect(out.delete).toEqual([]);
    expect(out.unadmit).toEqual([]);
    const e = out.status?.set.replicas?.find((x) => x.name === "vol-r0");
    expect(e?.retiring).toBe("drain of node node-a");
    expect(e?.state).toBe("Online");
    // Still admitted to the serving node: the serving node lowers it, not the manager.
    expect(out.admit.map((a) => a.copy)).toContain("vol-r0");
  });

  test("a retired copy the serving node lowered is unadmitted and deleted, with ReplicaMoved", () => {
    const v = volume(
      [
        online(0, "node-a", 3, { state: "Stale", retiring: "drain of node node-a", message: "retired" }),
        online(1, "node-b", 4),
        online(2, "node-c", 4),
      ],
      { gen: 4 },
    );
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.delete.map((d) => d.name)).toEqual(["vol-r0"]);
    expect(out.unadmit.map((d) => d.copy)).toEqual(["vol-r0"]);
    expect(out.create).toEqual([]);
    expect(out.admit.map((a) => a.copy)).not.toContain("vol-r0");
    expect(out.events.map((e) => e.reason)).toContain("ReplicaMoved");
  });

  test("a copy being deleted is admitted to nobody, and its admission keeps being withdrawn", () => {
    const v = volume(
      [
        online(0, "node-a", 3, { state: "Faulted", message: "replica partition is being deleted" }),
        online(1, "node-b", 4),
        online(2, "node-c", 4),
      ],
      { gen: 4 },
    );
    const going = replica(0, "node-a");
    going.metadata.deletionTimestamp = "2026-02-01T10:00:00Z";
    const out = decideReplicas(
      v,
      [going, copies[1]!, replica(2, "node-c")],
      view({ nodes: ["node-a"] }),
      NOW,
      CFG,
    );
    expect(out.admit.map((a) => a.copy)).not.toContain("vol-r0");
    expect(out.unadmit.map((u) => u.copy)).toEqual(["vol-r0"]);
  });

  test("never fewer current copies: with the other copy Faulted, the draining one is not retired", () => {
    const v = volume([
      online(0, "node-a"),
      online(1, "node-b", 2, { state: "Faulted" }),
      online(2, "node-c"),
    ]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.status?.set.replicas?.find((x) => x.name === "vol-r0")?.retiring).toBeUndefined();
    expect(out.delete.map((d) => d.name)).toEqual([]);
  });

  test("two draining copies: one retired at a time, each only with spec.replicas others current", () => {
    const v = volume([online(0, "node-a"), online(1, "node-b"), online(2, "node-c")]);
    const out = decideReplicas(
      v,
      [...copies, replica(2, "node-c")],
      view({ nodes: ["node-a", "node-b"] }),
      NOW,
      CFG,
    );
    const retiring = out.status?.set.replicas?.filter((x) => x.retiring).map((x) => x.name);
    expect(retiring).toEqual(["vol-r0"]);
    expect(out.create).toEqual([]);
  });

  test("a draining copy that is not current is deleted at once (it holds nothing needed)", () => {
    const v = volume([online(0, "node-a", 1, { state: "Stale" }), online(1, "node-b"), online(2, "node-c")]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.delete.map((d) => d.name)).toEqual(["vol-r0"]);
  });

  test("a drain stopped before the serving node acted drops the retiring mark", () => {
    const v = volume([
      online(0, "node-a", 3, { retiring: "drain of node node-a" }),
      online(1, "node-b"),
      online(2, "node-c"),
    ]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view(), NOW, CFG);
    expect(out.status?.set.replicas?.find((x) => x.name === "vol-r0")?.retiring).toBeUndefined();
    expect(out.delete).toEqual([]);
  });

  test("a drain stopped while its replacement is not current: the replacement is the surplus, deleted", () => {
    const v = volume([
      online(0, "node-a"),
      online(1, "node-b"),
      { name: "vol-r2", uid: "uid-r2", nodeName: "node-c", state: "Rebuilding", generation: 0 },
    ]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view(), NOW, CFG);
    expect(out.delete.map((d) => [d.name, d.why])).toEqual([
      ["vol-r2", "not current (surplus: 3 copies for spec.replicas 2): holds nothing the volume needs"],
    ]);
    expect(out.unadmit.map((u) => u.copy)).toContain("vol-r2");
    expect(out.create).toEqual([]);
  });

  test("a drain stopped once its replacement is current: the newest copy off the serving node is retired, then deleted", () => {
    const v = volume([online(0, "node-a"), online(1, "node-b"), online(2, "node-c")]);
    const out = decideReplicas(v, [...copies, replica(2, "node-c")], view(), NOW, CFG);
    expect(out.delete).toEqual([]);
    expect(out.create).toEqual([]);
    expect(out.status?.set.replicas?.map((e) => [e.name, e.retiring])).toEqual([
      ["vol-r0", undefined],
      ["vol-r1", undefined],
      ["vol-r2", "surplus: 3 copies for spec.replicas 2"],
    ]);
    // The serving node lowered it: then it goes.
    const lowered = volume(
      [
        online(0, "node-a", 4),
        online(1, "node-b", 4),
        online(2, "node-c", 3, { state: "Stale", retiring: "surplus: 3 copies for spec.replicas 2" }),
      ],
      { gen: 4 },
    );
    const next = decideReplicas(lowered, [...copies, replica(2, "node-c")], view(), NOW, CFG);
    expect(next.delete.map((d) => d.name)).toEqual(["vol-r2"]);
    // Two copies: no surplus, nothing more to do.
    const two = decideReplicas(volume([online(0, "node-a"), online(1, "node-b")]), copies, view(), NOW, CFG);
    expect(two.delete).toEqual([]);
    expect(two.status?.set.replicas?.some((e) => e.retiring) ?? false).toBe(false);
  });
});

describe("planned handover of a draining serving node", () => {
  const three = [replica(0, "node-a"), replica(1, "node-b"), replica(2, "node-c")];

  test("not while the serving node still holds a current copy (it is replaced and retired first)", () => {
    const v = volume([online(0, "node-a"), online(1, "node-b"), online(2, "node-c")], { node: "node-a" });
    const out = decideReplicas(v, three, view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.handover).toBeUndefined();
    expect(out.status?.set.replicas?.find((e) => e.name === "vol-r0")?.retiring).toBe("drain of node node-a");
  });

  test("asked once its copy is gone and spec.replicas current copies are elsewhere", () => {
    const v = volume([online(1, "node-b", 4), online(2, "node-c", 4)], { node: "node-a", gen: 4 });
    const out = decideReplicas(v, three.slice(1), view({ nodes: ["node-a"] }), NOW, CFG);
    expect(out.handover).toBe("node-a");
    expect(out.events.map((e) => e.reason)).toContain("HandoverRequested");
    // Asked already: not again.
    v.metadata.annotations = { "storage.distort.io/handover-from": "node-a" };
    expect(decideReplicas(v, three.slice(1), view({ nodes: ["node-a"] }), NOW, CFG).handover).toBeUndefined();
  });

  test("not with fewer current copies elsewhere than spec.replicas", () => {
    const v = volume([online(1, "node-b", 4), online(2, "node-c", 3, { state: "Stale" })], {
      node: "node-a",
      gen: 4,
    });
    expect(decideReplicas(v, three.slice(1), view({ nodes: ["node-a"] }), NOW, CFG).handover).toBeUndefined();
  });

  test("the release counts as lost only with the request and the record naming the serving node", () => {
    const v = volume([online(1, "node-b")], { node: "node-a" });
    const inv = view();
    expect(servingNodeLost(v, inv, NOW)).toBe(false);
    v.metadata.annotations = { "storage.distort.io/handover-from": "node-a" };
    expect(servingReleased(v)).toBe(false);
    expect(servingNodeLost(v, inv, NOW)).toBe(false);
    v.status = { ...(v.status as NonNullable<typeof v.status>), releasedBy: "node-a" };
    expect(servingReleased(v)).toBe(true);
    expect(servingNodeLost(v, inv, NOW)).toBe(true);
    // A record naming another node (an earlier handover) proves nothing about this one.
    v.status = { ...(v.status as NonNullable<typeof v.status>), releasedBy: "node-b" };
    expect(servingNodeLost(v, inv, NOW)).toBe(false);
    v.status = { ...(v.status as NonNullable<typeof v.status>), releasedBy: "node-a" };
    v.metadata.annotations = {};
    expect(servingNodeLost(v, inv, NOW)).toBe(false);
  });
});

describe("decideDrained", () => {
  const node = (drain: boolean, conditions: RDMAStorageNode["status"] = { conditions: [] }) => {
    const n = storageNode("node-a", { heartbeat: T0 });
    if (drain) n.spec.drain = true;
    n.status = { ...n.status, ...conditions };
    return n;
  };
  const single = partition(NS, "solo", { uid: "u-solo", node: "node-a", serial: "SER-node-a" });
  const copy = replica(0, "node-a");
  const served = volume([], { node: "node-a" });

  test("names what is left, and starts with DrainStarted", () => {
    const left = drainLeft("node-a", undefined, [copy, served, replica(1, "node-b")], 0);
    expect(left).toEqual({ copies: [`${NS}/vol-r0`], served: [`${NS}/vol`], singleCopy: [], exports: 0 });
    const out = decideDrained(node(true), "node node-a", left);
    expect(out.condition).toMatchObject({ status: "False", reason: "Draining" });
    expect(out.condition?.message).toMatch(/^2 left: copies distort-system\/vol-r0/);
    expect(out.events.map((e) => e.reason)).toEqual(["DrainStarted"]);
  });

  test("single-copy volumes block it, named, with a Warning and each volume to warn", () => {
    const out = decideDrained(node(true), "node node-a", drainLeft("node-a", undefined, [single], 0));
    expect(out.condition).toMatchObject({ status: "False", reason: "SingleCopyVolumes" });
    expect(out.condition?.message).toMatch(/single-copy volumes distort-system\/solo \(cannot move/);
    expect(out.events.map((e) => e.reason)).toContain("DrainBlocked");
    expect(out.blocked).toEqual([`${NS}/solo`]);
  });

  test("nothing left and no export: Drained True with DrainCompleted once", () => {
    const out = decideDrained(node(true), "node node-a", drainLeft("node-a", undefined, [], 0));
    expect(out.condition).toMatchObject({ status: "True", reason: "Drained" });
    expect(out.events.map((e) => e.reason)).toEqual(["DrainCompleted"]);
    const again = decideDrained(
      node(true, {
        conditions: [{ ...out.condition!, lastTransitionTime: "2026-01-01T00:00:00Z" } as never],
      }),
      "node node-a",
      drainLeft("node-a", undefined, [], 0),
    );
    expect(again.events).toEqual([]);
  });

  test("an export the agent still reports keeps it False", () => {
    const out = decideDrained(node(true), "node node-a", drainLeft("node-a", undefined, [], 1));
    expect(out.condition?.status).toBe("False");
  });

  test("a drive drain counts only that drive's partitions", () => {
    const d = device("dev-a", { node: "node-a", serial: "SER-node-a" });
    const other = partition(NS, "x", { uid: "u-x", node: "node-a", serial: "SER-other" });
    expect(drainLeft("node-a", d, [single, other, served], 3)).toEqual({
      copies: [],
      served: [],
      singleCopy: [`${NS}/solo`],
      exports: 0,
    });
  });

  test("a node that never drained gets no condition", () => {
    expect(decideDrained(node(false), "node node-a", drainLeft("node-a", undefined, [single], 0))).toEqual({
      events: [],
      blocked: [],
    });
  });
});
