// decideReplicas on plain objects: which replicas are created or deleted, and what the volume's
// status.replicas, dataGeneration and ReplicasReady say.
import { describe, expect, test } from "bun:test";
import type { NVMePartition, ReplicaStatus } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { cond, GiB, partition, storageNode, T0 } from "../testdata/fixtures.ts";
import {
  decideReplicas,
  REPLICAS_FINALIZER,
  replicaIndex,
  replicaName,
  replicaSpec,
  SERVING,
  servingCondition,
} from "./replica-core.ts";

const NS = "distort-system";
const NOW = T0 + 10_000;
const CFG = { stalenessMs: 60_000 };

function volume(
  o: { replicas?: number; key?: string; status?: NVMePartition["status"]; deleting?: boolean } = {},
) {
  const v = partition(NS, "vol", { uid: "uid-vol", size: 2 * GiB, deleting: o.deleting });
  v.spec.replicas = o.replicas ?? 3;
  if (o.key) v.spec.replicaTopologyKey = o.key;
  v.spec.targetOptions = { transport: "tcp", portalPort: 4420 };
  v.metadata.finalizers = [...(v.metadata.finalizers ?? []), REPLICAS_FINALIZER];
  if (o.status) v.status = o.status;
  return v;
}

function replica(
  i: number,
  o: { node?: string; state?: "Pending" | "Exported" | "Failed"; deleting?: boolean } = {},
) {
  const r = partition(NS, `vol-r${i}`, {
    uid: `uid-r${i}`,
    node: o.node,
    serial: o.node ? `SER-${o.node}` : undefined,
    state: o.state,
    deleting: o.deleting,
  });
  r.spec.replicaOf = { name: "vol", uid: "uid-vol" };
  return r;
}

function nodes(spec: Record<string, { stale?: boolean; labels?: Record<string, string> }>) {
  const inv = new Inventory();
  for (const [n, o] of Object.entries(spec))
    inv.setNode(storageNode(n, { heartbeat: o.stale ? T0 - 120_000 : T0, labels: o.labels }));
  return inv;
}

const entry = (s: ReplicaStatus[] | undefined, name: string) => s?.find((e) => e.name === name);

describe("decideReplicas", () => {
  test("a new volume gets one replica per copy, with the volume's size, carving and transport", () => {
    const v = volume();
    v.metadata.finalizers = [];
    const out = decideReplicas(v, [], nodes({}), NOW, CFG);
    expect(out.finalizer).toBe(true);
    expect(out.create.map((c) => c.name)).toEqual(["vol-r0", "vol-r1", "vol-r2"]);
    expect(out.create[0]?.spec).toEqual({
      sizeBytes: 2 * GiB + 1024 * 1024,
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "tcp", portalPort: 4420 },
      replicaOf: { name: "vol", uid: "uid-vol" },
    });
    expect(out.status?.set.replicas?.map((e) => [e.name, e.state])).toEqual([
      ["vol-r0", "Pending"],
      ["vol-r1", "Pending"],
      ["vol-r2", "Pending"],
    ]);
    expect(out.status?.conditions[0]).toMatchObject({ status: "False", reason: "ReplicasPending" });
  });

  test("only missing copies are made, at free indices", () => {
    const out = decideReplicas(volume(), [replica(0), replica(2)], nodes({}), NOW, CFG);
    expect(out.create.map((c) => c.name)).toEqual(["vol-r1"]);
  });

  test("every copy exported on distinct nodes: data generation 1, all Online, ReplicasReady", () => {
    const rs = [
      replica(0, { node: "a", state: "Exported" }),
      replica(1, { node: "b", state: "Exported" }),
      replica(2, { node: "c", state: "Exported" }),
    ];
    const out = decideReplicas(volume(), rs, nodes({ a: {}, b: {}, c: {} }), NOW, CFG);
    expect(out.create).toEqual([]);
    expect(out.status?.set.dataGeneration).toBe(1);
    expect(out.status?.set.state).toBe("Placed");
    expect(out.status?.set.replicas?.map((e) => [e.name, e.nodeName, e.state, e.generation])).toEqual([
      ["vol-r0", "a", "Online", 1],
      ["vol-r1", "b", "Online", 1],
      ["vol-r2", "c", "Online", 1],
    ]);
    expect(out.status?.conditions[0]).toMatchObject({ status: "True", reason: "AllReplicasOnline" });
    expect(out.events.map((e) => e.reason)).toEqual(["ReplicasOnline"]);
    // Served from the first current copy's node, which is admitted to every copy.
    expect(out.serve).toBe("a");
    expect(out.admit).toEqual([
      { copy: "vol-r0", uid: "uid-r0", node: "a" },
      { copy: "vol-r1", uid: "uid-r1", node: "a" },
      { copy: "vol-r2", uid: "uid-r2", node: "a" },
    ]);
  });

  test("no serving node before the copies are current, and none is chosen twice", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Pending" })];
    const v = volume({ replicas: 2 });
    expect(decideReplicas(v, rs, nodes({ a: {}, b: {} }), NOW, CFG).serve).toBeUndefined();
    expect(decideReplicas(v, rs, nodes({ a: {}, b: {} }), NOW, CFG).admit).toEqual([]);
    const served = volume({
      replicas: 2,
      status: {
        state: "Exported",
        dataGeneration: 3,
        conditions: [],
        replicas: [
          { name: "vol-r0", uid: "uid-r0", nodeName: "a", state: "Online", generation: 3 },
          { name: "vol-r1", uid: "uid-r1", nodeName: "b", state: "Stale", generation: 2 },
        ],
      },
    });
    served.spec.nodeName = "b";
    const out = decideReplicas(
      served,
      [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })],
      nodes({ a: {}, b: {} }),
      NOW,
      CFG,
    );
    expect(out.serve).toBeUndefined();
    // The current copy is offered to the serving node for its raid; the stale one only to be
    // rebuilt (its admission moved from an earlier serving node, which a failover leaves it on).
    expect(out.admit).toEqual([
      { copy: "vol-r0", uid: "uid-r0", node: "b" },
      { copy: "vol-r1", uid: "uid-r1", node: "b", move: true },
    ]);
    // While the serving node counts as lost (a failover runs), no copy's admission is moved.
    const lost = decideReplicas(
      served,
      [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })],
      nodes({ a: {}, b: { stale: true } }),
      NOW,
      CFG,
    );
    expect(lost.admit).toEqual([{ copy: "vol-r0", uid: "uid-r0", node: "b" }]);
  });

  test("not every copy exported yet: no generation is given out", () => {
    const rs = [
      replica(0, { node: "a", state: "Exported" }),
      replica(1, { node: "b", state: "Pending" }),
      replica(2, { node: "c", state: "Exported" }),
    ];
    const out = decideReplicas(volume(), rs, nodes({ a: {}, b: {}, c: {} }), NOW, CFG);
    expect(out.status?.set.dataGeneration).toBeUndefined();
    expect(entry(out.status?.set.replicas, "vol-r0")?.state).toBe("Pending");
  });

  test("two copies on one node before the volume served: the newer one is made again", () => {
    const rs = [
      replica(0, { node: "a", state: "Exported" }),
      replica(1, { node: "a", state: "Exported" }),
      replica(2, { node: "c", state: "Exported" }),
    ];
    const out = decideReplicas(volume(), rs, nodes({ a: {}, c: {} }), NOW, CFG);
    expect(out.delete).toEqual([expect.objectContaining({ name: "vol-r1", uid: "uid-r1" })]);
    expect(out.create.map((c) => c.name)).toEqual(["vol-r3"]);
    expect(out.status?.set.dataGeneration).toBeUndefined();
    expect(out.events.map((e) => e.reason)).toContain("ReplicaCoLocated");
  });

  test("with a spread key, two copies in one zone count as co-located", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })];
    const out = decideReplicas(
      volume({ replicas: 2, key: "zone" }),
      rs,
      nodes({ a: { labels: { zone: "z1" } }, b: { labels: { zone: "z1" } } }),
      NOW,
      CFG,
    );
    expect(out.delete.map((d) => d.name)).toEqual(["vol-r1"]);
  });

  const served = (replicas: ReplicaStatus[]) =>
    volume({ status: { state: "Exported", dataGeneration: 4, replicas, conditions: [] } });
  const current = (name: string, nodeName: string, generation = 4): ReplicaStatus => ({
    name,
    uid: `uid-${name.slice(4)}`,
    nodeName,
    deviceSerial: `SER-${nodeName}`,
    state: "Online",
    generation,
  });

  test("a current copy on a stale node is Degraded, keeps its generation, and comes back Online", () => {
    const rs = [
      replica(0, { node: "a", state: "Exported" }),
      replica(1, { node: "b", state: "Exported" }),
      replica(2, { node: "c", state: "Exported" }),
    ];
    const v = served([current("vol-r0", "a"), current("vol-r1", "b"), current("vol-r2", "c")]);
    const out = decideReplicas(v, rs, nodes({ a: {}, b: { stale: true }, c: {} }), NOW, CFG);
    expect(entry(out.status?.set.replicas, "vol-r1")).toMatchObject({ state: "Degraded", generation: 4 });
    expect(out.status?.conditions[0]).toMatchObject({ reason: "Degraded" });
    expect(out.status?.set.dataGeneration).toBeUndefined();
  });

  test("a copy behind the data generation never becomes Online by being exported again", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })];
    const v = served([
      current("vol-r0", "a"),
      { ...current("vol-r1", "b", 3), state: "Stale", message: "missed writes" },
    ]);
    v.spec.replicas = 2;
    const out = decideReplicas(v, rs, nodes({ a: {}, b: {} }), NOW, CFG);
    const r1 = entry(out.status?.set.replicas ?? v.status?.replicas, "vol-r1");
    expect(r1).toMatchObject({ state: "Stale", generation: 3 });
  });

  test("a Rebuilding copy keeps the serving node's progress: the manager has nothing to rewrite", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })];
    const rebuild = { percent: 40, bytesDone: 400, bytesTotal: 1000 };
    const v = served([
      current("vol-r0", "a"),
      { ...current("vol-r1", "b", 3), state: "Rebuilding", message: "being rebuilt", rebuild },
    ]);
    v.spec.replicas = 2;
    const out = decideReplicas(v, rs, nodes({ a: {}, b: {} }), NOW, CFG);
    expect(entry(out.status?.set.replicas ?? v.status?.replicas, "vol-r1")).toMatchObject({
      state: "Rebuilding",
      rebuild,
    });
    expect(JSON.stringify(out.status?.set.replicas ?? v.status?.replicas)).toBe(
      JSON.stringify(v.status?.replicas),
    );
  });

  test("a replacement copy of a volume that served is Stale at generation 0 once exported", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(3, { node: "d", state: "Exported" })];
    const v = served([current("vol-r0", "a"), { name: "vol-r3", state: "Pending", generation: 0 }]);
    v.spec.replicas = 2;
    const out = decideReplicas(v, rs, nodes({ a: {}, d: {} }), NOW, CFG);
    expect(entry(out.status?.set.replicas, "vol-r3")).toMatchObject({ state: "Stale", generation: 0 });
    expect(out.status?.conditions[0]).toMatchObject({ reason: "Degraded" });
  });

  test("no copy at the data generation: NoCurrentReplica", () => {
    const rs = [replica(1, { node: "b", state: "Exported" })];
    const v = served([{ ...current("vol-r1", "b", 3), state: "Stale" }]);
    v.spec.replicas = 2;
    const out = decideReplicas(v, rs, nodes({ b: {} }), NOW, CFG);
    expect(out.status?.conditions[0]).toMatchObject({ status: "False", reason: "NoCurrentReplica" });
  });

  test("a failed replica is Faulted and a new one is made beside it", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Failed" })];
    const v = served([current("vol-r0", "a"), current("vol-r1", "b")]);
    v.spec.replicas = 2;
    const out = decideReplicas(v, rs, nodes({ a: {}, b: {} }), NOW, CFG);
    expect(entry(out.status?.set.replicas, "vol-r1")?.state).toBe("Faulted");
    expect(out.create.map((c) => c.name)).toEqual(["vol-r2"]);
  });

  test("a deleted volume deletes its replicas, and lets go once none is left", () => {
    const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", deleting: true })];
    // The deletion fixture holds a finalizer of its own: the serving node has not let go yet.
    const held = volume({ deleting: true });
    expect(decideReplicas(held, rs, nodes({}), NOW, CFG)).toMatchObject({ delete: [], unadmit: [] });
    const v = volume({ deleting: true });
    v.metadata.finalizers = [REPLICAS_FINALIZER];
    const out = decideReplicas(v, rs, nodes({}), NOW, CFG);
    expect(out.unadmit).toEqual([
      { copy: "vol-r0", uid: "uid-r0" },
      { copy: "vol-r1", uid: "uid-r1" },
    ]);
    expect(out.delete.map((d) => d.name)).toEqual(["vol-r0"]);
    expect(out.finalizer).toBeUndefined();
    expect(decideReplicas(v, [], nodes({}), NOW, CFG).finalizer).toBe(false);
  });

  test("nothing to write when the status already says it", () => {
    const rs = [
      replica(0, { node: "a", state: "Exported" }),
      replica(1, { node: "b", state: "Exported" }),
      replica(2, { node: "c", state: "Exported" }),
    ];
    const first = decideReplicas(volume(), rs, nodes({ a: {}, b: {}, c: {} }), NOW, CFG);
    const v = volume({
      status: { state: "Placed", conditions: [], ...first.status?.set },
    });
    v.status!.conditions = [
      { ...first.status!.conditions[0]!, lastTransitionTime: "2026-02-01T10:00:00Z" },
    ] as never;
    const again = decideReplicas(v, rs, nodes({ a: {}, b: {}, c: {} }), NOW, CFG);
    expect(again.status).toBeUndefined();
    expect(again.events).toEqual([]);
  });
});

describe("servingCondition: a Serving False left by a failover clears once the volume serves", () => {
  /** A two-copy volume at generation 2 served from `node`, with Serving as `serving` says. */
  function served(node: string, serving?: "True" | "False", reason = "NoLiveCurrentCopy") {
    const v = volume({
      replicas: 2,
      status: {
        state: "Exported",
        dataGeneration: 2,
        conditions: serving ? [{ ...cond(SERVING, serving, reason), message: "was" }] : [],
        replicas: [
          { name: "vol-r0", uid: "uid-r0", nodeName: "a", state: "Online", generation: 2 },
          { name: "vol-r1", uid: "uid-r1", nodeName: "b", state: "Faulted", generation: 1 },
        ],
      },
    });
    v.spec.nodeName = node;
    v.spec.failoverAfterSeconds = 5;
    v.metadata.generation = 4;
    return v;
  }
  const rs = [replica(0, { node: "a", state: "Exported" }), replica(1, { node: "b", state: "Exported" })];
  const back = { stalenessMs: 60_000 };

  test.each([["NoLiveCurrentCopy"], ["Fencing"], ["AcceptDataLossInvalid"]])(
    "False (%s) with the serving node alive again: True, Served, naming the node",
    (reason) => {
      const v = served("a", "False", reason);
      const inv = new Inventory();
      inv.setNode(storageNode("a", { heartbeat: NOW - 1_000 }));
      inv.setNode(storageNode("b", { heartbeat: NOW - 1_000 }));
      expect(servingCondition(v, inv, NOW, back)).toEqual({
        type: SERVING,
        status: "True",
        reason: "Served",
        message: "served from node a",
        observedGeneration: 4,
      });
      // decideReplicas writes it beside ReplicasReady, even when nothing else changed.
      const out = decideReplicas(v, rs, inv, NOW, back);
      expect(out.status?.conditions.find((c) => c.type === SERVING)).toMatchObject({
        status: "True",
        reason: "Served",
        message: "served from node a",
      });
    },
  );

  test("another node named by a failover serves: its name is the message", () => {
    const inv = new Inventory();
    inv.setNode(storageNode("a", { heartbeat: NOW - 60_000 }));
    inv.setNode(storageNode("b", { heartbeat: NOW - 1_000 }));
    expect(servingCondition(served("b", "False", "Fencing"), inv, NOW, back)?.message).toBe(
      "served from node b",
    );
  });

  test("still lost, or alive but unhealthy: the False stays", () => {
    const lost = new Inventory();
    // Past the volume's 5 s failover bound, though within the staleness window.
    lost.setNode(storageNode("a", { heartbeat: NOW - 6_000 }));
    expect(servingCondition(served("a", "False"), lost, NOW, back)).toBeUndefined();
    const missing = new Inventory();
    expect(servingCondition(served("a", "False"), missing, NOW, back)).toBeUndefined();
    const notReady = new Inventory();
    notReady.setNode(storageNode("a", { heartbeat: NOW - 1_000, ready: false }));
    expect(servingCondition(served("a", "False"), notReady, NOW, back)).toBeUndefined();
  });

  test("nothing to write when Serving is True, absent, or the volume is not served", () => {
    const inv = new Inventory();
    inv.setNode(storageNode("a", { heartbeat: NOW - 1_000 }));
    inv.setNode(storageNode("b", { heartbeat: NOW - 1_000 }));
    expect(servingCondition(served("a", "True", "FailedOver"), inv, NOW, back)).toBeUndefined();
    expect(servingCondition(served("a", "True", "Served"), inv, NOW, back)).toBeUndefined();
    expect(servingCondition(served("a"), inv, NOW, back)).toBeUndefined();
    const unnamed = served("a", "False");
    delete unnamed.spec.nodeName;
    expect(servingCondition(unnamed, inv, NOW, back)).toBeUndefined();
    const deleting = served("a", "False");
    deleting.metadata.deletionTimestamp = new Date(T0).toISOString();
    expect(servingCondition(deleting, inv, NOW, back)).toBeUndefined();
    // Once written, deciding again on what it says writes nothing more (no write storm).
    const v = served("a", "False");
    const first = decideReplicas(v, rs, inv, NOW, back);
    v.status = {
      ...(v.status as NonNullable<NVMePartition["status"]>),
      ...first.status?.set,
      conditions: (first.status?.conditions ?? []).map((c) => ({
        ...c,
        lastTransitionTime: "2026-02-01T10:00:00Z",
      })),
    };
    expect(decideReplicas(v, rs, inv, NOW, back).status).toBeUndefined();
  });
});

describe("replica names", () => {
  test("index suffix, bounded for long volume names", () => {
    expect(replicaName("pvc-1", 2)).toBe("pvc-1-r2");
    const long = replicaName("v".repeat(253), 1);
    expect(long.length).toBeLessThanOrEqual(253);
    expect(long.endsWith("-r1")).toBe(true);
    expect(replicaIndex(long)).toBe(1);
    expect(replicaIndex("plain")).toBeUndefined();
  });

  test("a replica carries the volume's thin flag and topology", () => {
    const v = volume();
    v.spec.thinProvisioning = true;
    v.spec.topology = { requisite: [{ segments: { zone: "z1" } }] };
    expect(replicaSpec(v)).toMatchObject({ thinProvisioning: true, topology: v.spec.topology });
  });
});
