// The inventory's indexes follow adds, updates and deletes; versions this process read or wrote
// win over an older cached copy until the watch catches up; usage is recomputed when it changes.
import { describe, expect, test } from "bun:test";
import type { NVMeDevice } from "../api/index.ts";
import { compareResourceVersions, Inventory } from "./inventory.ts";
import { claim, device, GiB, partition, refOf, storageNode, T0 } from "./testdata/fixtures.ts";

const at = (d: NVMeDevice, rv: string): NVMeDevice => ({
  ...d,
  metadata: { ...d.metadata, resourceVersion: rv },
});
const c1 = refOf(claim("admin", "c1"));
const c2 = refOf(claim("admin", "c2", { uid: "uid-2" }));

describe("compareResourceVersions", () => {
  test.each([
    ["9", "10", -1],
    ["10", "10", 0],
    ["123456789012345678901", "9", 1],
    ["abc", "10", undefined],
    [undefined, "1", undefined],
  ])("%s vs %s", (a, b, want) => {
    expect(compareResourceVersions(a, b)).toBe(want);
  });
});

describe("Inventory", () => {
  test("a fresher device version wins until the cache catches up; an older one is ignored", () => {
    const inv = new Inventory();
    inv.setDevice(at(device("d1", { claim: c1 }), "10"));
    const written = at(
      device("d1", { claim: c1, reservations: [{ uid: "u", namespace: "a", name: "p", bytes: GiB }] }),
      "12",
    );
    inv.noteFreshDevice(written);
    expect(inv.latestDevice("d1")).toBe(written);
    expect(inv.devicesHolding("u")).toEqual(["d1"]);
    inv.setDevice(at(device("d1", { claim: c1 }), "11")); // an older event arriving late
    expect(inv.latestDevice("d1")).toBe(written);
    expect(inv.devicesHolding("u")).toEqual(["d1"]);
    inv.noteFreshDevice(at(device("d1"), "9"));
    expect(inv.latestDevice("d1")).toBe(written);
    const caught = at(device("d1", { claim: c2 }), "13");
    inv.setDevice(caught);
    expect(inv.latestDevice("d1")).toBe(caught);
    expect(inv.devicesHolding("u")).toEqual([]);
    expect(inv.devicesClaimedAs("admin/c1")).toEqual([]);
    expect(inv.devicesClaimedAs("admin/c2").map((d) => d.metadata.name)).toEqual(["d1"]);
  });

  test("device indexes by serial, node and placement follow updates and deletes", () => {
    const inv = new Inventory();
    const d = device("d1", { node: "n1", serial: "S1" });
    inv.setDevice(d);
    expect(inv.devicesWithSerial("S1")).toEqual([d]);
    expect(inv.devicesOnNode("n1")).toEqual([d]);
    expect(inv.deviceFor("n1", "S1")).toBe("d1");
    inv.deleteDevice(d);
    expect(inv.devicesWithSerial("S1")).toEqual([]);
    expect(inv.devicesOnNode("n1")).toEqual([]);
    expect(inv.deviceFor("n1", "S1")).toBeUndefined();
    expect([...inv.devices()]).toEqual([]);
  });

  test("partitions move between pending and placed; usage follows without stale memo", () => {
    const inv = new Inventory();
    const d = device("d1", { node: "n1", serial: "S1", allocatable: 10 * GiB, claim: c1 });
    inv.setDevice(d);
    const p = partition("apps", "p", { size: GiB });
    inv.setPartition(p);
    expect(inv.pendingCount).toBe(1);
    expect(inv.usage(d).freeBytes).toBe(10 * GiB);
    const placed = partition("apps", "p", { size: GiB, node: "n1", serial: "S1" });
    inv.setPartition(placed);
    expect(inv.pendingCount).toBe(0);
    expect(inv.assigned(d).map((a) => a.name)).toEqual(["p"]);
    expect(inv.usage(d).freeBytes).toBe(9 * GiB);
    inv.setPartition(partition("apps", "p", { size: 2 * GiB, node: "n1", serial: "S1" }));
    expect(inv.usage(d).freeBytes).toBe(8 * GiB);
    inv.deletePartition(placed);
    expect(inv.assigned(d)).toEqual([]);
    expect(inv.usage(d).freeBytes).toBe(10 * GiB);
    expect(inv.partition("apps/p")).toBeUndefined();
  });

  test("decisions in flight count until released, never twice", () => {
    const inv = new Inventory();
    const d = device("d1", {
      allocatable: 10 * GiB,
      claim: c1,
      reservations: [{ uid: "held", namespace: "apps", name: "held", bytes: GiB }],
    });
    inv.setDevice(d);
    const release = inv.assume("d1", {
      uid: "new",
      namespace: "apps",
      name: "new",
      bytes: 2 * GiB,
      terminating: false,
    });
    const again = inv.assume("d1", {
      uid: "held",
      namespace: "apps",
      name: "held",
      bytes: GiB,
      terminating: false,
    });
    expect(inv.usage(d).freeBytes).toBe(7 * GiB);
    release();
    again();
    expect(inv.usage(d).freeBytes).toBe(9 * GiB);
    release(); // idempotent
    expect(inv.usage(d).freeBytes).toBe(9 * GiB);
  });

  test("a partition being deleted is not pending", () => {
    const inv = new Inventory();
    inv.setPartition(partition("apps", "p", { deleting: true }));
    expect(inv.pendingCount).toBe(0);
  });

  test("claims by serial; storage nodes by Kubernetes node name, freshest first", () => {
    const inv = new Inventory();
    const c = claim("admin", "c1", { serial: "S1" });
    inv.setClaim(c);
    expect(inv.claimsWithSerial("S1")).toEqual([c]);
    expect(inv.claim("admin/c1")).toBe(c);
    inv.deleteClaim(c);
    expect(inv.claimsWithSerial("S1")).toEqual([]);

    const old = storageNode("n1", { name: "old", heartbeat: T0 - 60_000 });
    const fresh = storageNode("n1", { name: "fresh", heartbeat: T0 });
    inv.setNode(old);
    inv.setNode(fresh);
    expect(inv.node("n1")).toBe(fresh);
    expect(
      inv
        .nodesNamed("n1")
        .map((n) => n.metadata.name)
        .sort(),
    ).toEqual(["fresh", "old"]);
    inv.deleteNode(fresh);
    expect(inv.node("n1")).toBe(old);
    expect(inv.node("n2")).toBeUndefined();
  });
});
