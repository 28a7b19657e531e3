// Capacity accounting, table-driven: free bytes from the ledger and placed partitions (rounded,
// terminating ones included), which ledger entries are dead or need checking, adoption of
// partitions placed without an entry, and the Overcommitted condition.
import { describe, expect, test } from "bun:test";
import type { DeviceReservation, NVMeDevice, NVMePartition } from "../../api/index.ts";
import { type PartitionUse, partitionUse } from "../../lib/device-ledger.ts";
import { Inventory } from "../inventory.ts";
import { claimedDevice, device, GiB, MiB, partition, T0 } from "../testdata/fixtures.ts";
import { auditLedger, capacityStatus, entryIsDead } from "./capacity-core.ts";

const NOW = new Date(T0);
const entry = (name: string, bytes: number, uid = `uid-part-${name}`): DeviceReservation => ({
  uid,
  namespace: "apps",
  name,
  bytes,
});
const use = (p: NVMePartition) => partitionUse(p) as PartitionUse;

function inv(devices: NVMeDevice[], partitions: NVMePartition[]): Inventory {
  const i = new Inventory();
  for (const d of devices) i.setDevice(d);
  for (const p of partitions) i.setPartition(p);
  return i;
}

describe("capacityStatus", () => {
  const placed = (name: string, size: number, o: { deleting?: boolean } = {}) =>
    partition("apps", name, { node: "node-a", serial: "SER-d1", size, ...o });
  const cases: {
    name: string;
    ledger: DeviceReservation[];
    assigned: NVMePartition[];
    dead?: string[];
    free: number;
    entries: string[];
  }[] = [
    { name: "empty device", ledger: [], assigned: [], free: 10 * GiB, entries: [] },
    {
      name: "ledger entries of unplaced partitions count",
      ledger: [entry("a", GiB)],
      assigned: [],
      free: 9 * GiB,
      entries: ["a"],
    },
    {
      name: "placed partitions are counted once with their entry",
      ledger: [entry("a", GiB)],
      assigned: [placed("a", GiB)],
      free: 9 * GiB,
      entries: ["a"],
    },
    {
      name: "sizes are rounded up to 4 MiB",
      ledger: [],
      assigned: [placed("a", 1), placed("b", 4 * MiB + 1)],
      free: 10 * GiB - 12 * MiB,
      entries: [],
    },
    {
      name: "terminating partitions count",
      ledger: [entry("a", GiB)],
      assigned: [placed("a", GiB, { deleting: true })],
      free: 9 * GiB,
      entries: ["a"],
    },
    {
      name: "a grown partition grows its entry",
      ledger: [entry("a", GiB)],
      assigned: [placed("a", 2 * GiB)],
      free: 8 * GiB,
      entries: ["a"],
    },
    {
      name: "dead entries are dropped",
      ledger: [entry("a", GiB), entry("b", GiB)],
      assigned: [],
      dead: ["uid-part-a"],
      free: 9 * GiB,
      entries: ["b"],
    },
    {
      name: "partitions placed without an entry count, but are never adopted into the ledger",
      ledger: [],
      assigned: [placed("m", GiB)],
      free: 9 * GiB,
      entries: [],
    },
  ];
  test.each(cases)("$name", (c) => {
    const { device: d } = claimedDevice("d1", { allocatable: 10 * GiB, reservations: c.ledger });
    const s = capacityStatus(d, c.assigned.map(use), new Set(c.dead ?? []), NOW);
    expect(s.freeBytes).toBe(c.free);
    expect((s.reservations ?? []).map((r) => r.name)).toEqual(c.entries);
    expect(s.claimRef).toEqual(d.status?.claimRef);
    expect(s.conditions.find((x) => x.type === "Overcommitted")).toBeUndefined();
  });

  test("over-commitment clamps free at 0 and raises Overcommitted, which clears later", () => {
    const { device: d } = claimedDevice("d1", { allocatable: GiB });
    const over = capacityStatus(
      d,
      [use(partition("apps", "x", { node: "node-a", serial: "SER-d1", size: 2 * GiB }))],
      new Set(),
      NOW,
    );
    expect(over.freeBytes).toBe(0);
    expect(over.conditions.find((x) => x.type === "Overcommitted")).toMatchObject({
      status: "True",
      reason: "PlacedExceedsAllocatable",
      message: "partitions on this device add up to 2 GiB, 1 GiB more than its 1 GiB",
    });
    const cleared = capacityStatus({ ...d, status: over }, [], new Set(["uid-part-x"]), NOW);
    expect(cleared.freeBytes).toBe(GiB);
    expect(cleared.conditions.find((x) => x.type === "Overcommitted")).toMatchObject({ status: "False" });
  });

  test("a device without status gets phase Available and its accounting", () => {
    const s = capacityStatus(device("d1", { allocatable: GiB }), [], new Set(), NOW);
    expect(s).toMatchObject({ phase: "Available", freeBytes: GiB, reservations: [] });
  });
});

describe("auditLedger", () => {
  test("sorts entries into kept, dead and to-verify", () => {
    const { device: d } = claimedDevice("d1", {
      reservations: [
        entry("pending", GiB),
        entry("here", GiB),
        entry("elsewhere", GiB),
        entry("uncached", GiB),
        entry("recreated", GiB, "uid-old"),
      ],
    });
    const view = inv(
      [d],
      [
        partition("apps", "pending"),
        partition("apps", "here", { node: "node-a", serial: "SER-d1" }),
        partition("apps", "elsewhere", { node: "node-b", serial: "SER-d9" }),
        partition("apps", "recreated"),
      ],
    );
    const a = auditLedger(d, view);
    expect(a.dead.map((r) => r.name)).toEqual(["elsewhere"]);
    expect(a.verify.map((r) => r.name)).toEqual(["uncached", "recreated"]);
  });
});

describe("entryIsDead", () => {
  const { device: d } = claimedDevice("d1");
  const e = entry("p", GiB);
  test.each([
    { name: "not found", fresh: undefined, dead: true },
    { name: "another object of the same name", fresh: partition("apps", "p", { uid: "other" }), dead: true },
    {
      name: "placed on another device",
      fresh: partition("apps", "p", { node: "node-b", serial: "SER-d1" }),
      dead: true,
    },
    { name: "placed here", fresh: partition("apps", "p", { node: "node-a", serial: "SER-d1" }), dead: false },
    { name: "not placed yet", fresh: partition("apps", "p"), dead: false },
    { name: "terminating", fresh: partition("apps", "p", { deleting: true }), dead: false },
  ])("$name -> dead: $dead", ({ fresh, dead }) => {
    expect(entryIsDead(e, fresh, d)).toBe(dead);
  });

  // A leftover's partition is gone on purpose (released while its drive or node was lost); the
  // drive may come back holding the volume, so its room is held whatever the API says.
  const left = { ...e, leftover: { since: "2026-01-01T00:00:00Z", reason: "DeviceUnavailable" } };
  test.each([
    { name: "not found", fresh: undefined },
    { name: "another object of the same name", fresh: partition("apps", "p", { uid: "other" }) },
  ])("a leftover entry whose partition is $name -> kept", ({ fresh }) => {
    expect(entryIsDead(left, fresh, d)).toBe(false);
  });
});

describe("leftover entries", () => {
  test("are neither dead nor to verify, and keep counting against the device", () => {
    const leftover = { since: "2026-01-01T00:00:00Z", reason: "NodeLost" };
    const { device: d } = claimedDevice("d1", {
      reservations: [{ ...entry("gone", GiB), leftover }, entry("gone-too", GiB)],
    });
    const a = auditLedger(d, inv([d], []));
    expect(a.dead).toEqual([]);
    expect(a.verify.map((r) => r.name)).toEqual(["gone-too"]);
    const s = capacityStatus(d, [], new Set(["uid-part-gone-too"]), NOW);
    expect(s.reservations).toEqual([{ ...entry("gone", GiB), leftover }]);
    expect(s.freeBytes).toBe(d.spec.allocatableBytes - GiB);
  });
});
