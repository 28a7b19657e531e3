// reserveVerdict on freshly read objects: the ledger entry is added only while every placement
// condition still holds, and an existing entry is recognised instead of added twice.
import { describe, expect, test } from "bun:test";
import type { NVMeDevice, NVMeDeviceClaim, RDMAStorageNode } from "../../api/index.ts";
import { type PartitionUse, partitionUse } from "../../lib/device-ledger.ts";
import { claimedDevice, GiB, MiB, partition, storageNode, T0 } from "../testdata/fixtures.ts";
import type { Reserve } from "./placement-core.ts";
import { MAX_LEDGER_ENTRIES, type ReserveInput, reserveVerdict } from "./reservation.ts";

const NOW = T0 + 1000;
const p = partition("apps", "vol", { size: 3 * GiB });
const use = partitionUse(p) as PartitionUse;

function input(o: {
  device?: NVMeDevice;
  claim?: NVMeDeviceClaim | null;
  node?: RDMAStorageNode | null;
  assigned?: PartitionUse[];
  partition?: typeof p;
  reserve?: Partial<Reserve>;
}): ReserveInput {
  const base = claimedDevice("d1", { allocatable: 10 * GiB, activeBackend: "spdk" });
  const d = o.device ?? base.device;
  const reserve: Reserve = {
    type: "reserve",
    device: "d1",
    nodeName: "node-a",
    serial: "SER-d1",
    claimRef: base.device.status?.claimRef as Reserve["claimRef"],
    bytes: 3 * GiB,
    reuse: false,
    ...o.reserve,
  };
  return {
    partition: o.partition ?? p,
    use,
    reserve,
    device: d,
    claim: o.claim === null ? undefined : (o.claim ?? base.claim),
    node: o.node === null ? undefined : (o.node ?? storageNode("node-a")),
    assigned: o.assigned ?? [],
    nowMs: NOW,
    stalenessMs: 60_000,
  };
}

describe("reserveVerdict", () => {
  test("adds the entry and keeps the rest of the status", () => {
    const base = claimedDevice("d1", {
      allocatable: 10 * GiB,
      activeBackend: "spdk",
      reservations: [{ uid: "x", namespace: "apps", name: "x", bytes: 4 * MiB }],
    });
    const v = reserveVerdict(input({ device: base.device }));
    expect(v.kind).toBe("write");
    if (v.kind !== "write") return;
    expect(v.status.reservations).toEqual([
      { uid: "x", namespace: "apps", name: "x", bytes: 4 * MiB },
      { uid: use.uid, namespace: "apps", name: "vol", bytes: 3 * GiB },
    ]);
    expect(v.status.claimRef).toEqual(base.device.status?.claimRef);
    expect(v.status.activeBackend).toBe("spdk");
    expect(v.status.phase).toBe("Claimed");
    expect(v.status.freeBytes).toBe(10 * GiB - 4 * MiB - 3 * GiB);
  });

  test("recognises its own entry", () => {
    const base = claimedDevice("d1", {
      allocatable: 1 * GiB, // already full: the entry is what fills it
      reservations: [{ uid: use.uid, namespace: "apps", name: "vol", bytes: 3 * GiB }],
    });
    expect(reserveVerdict(input({ device: base.device })).kind).toBe("held");
  });

  test("fits exactly", () => {
    const v = reserveVerdict(input({ reserve: { bytes: 10 * GiB } }));
    expect(v.kind).toBe("write");
  });

  const other = claimedDevice("d1", { allocatable: 10 * GiB, claimName: "other" });
  const rejects: { name: string; in: ReserveInput; message: RegExp }[] = [
    {
      name: "the device now belongs to another claim",
      in: input({ device: other.device, claim: other.claim }),
      message: /changed owner/,
    },
    { name: "the claim is gone", in: input({ claim: null }), message: /no longer exists/ },
    {
      name: "the claim is being deleted",
      in: (() => {
        const c = claimedDevice("d1").claim;
        return input({
          claim: { ...c, metadata: { ...c.metadata, deletionTimestamp: "2026-02-01T10:00:00Z" } },
        });
      })(),
      message: /being deleted/,
    },
    {
      name: "the node went stale",
      in: input({ node: storageNode("node-a", { heartbeat: T0 - 120_000 }) }),
      message: /no heartbeat since/,
    },
    { name: "the node record is gone", in: input({ node: null }), message: /no RDMAStorageNode/ },
    {
      name: "the device got locked to the other backend",
      in: input({ device: claimedDevice("d1", { allocatable: 10 * GiB, activeBackend: "kernel" }).device }),
      message: /locked to backend kernel/,
    },
    {
      name: "the node left the requisite topology",
      in: input({
        partition: partition("apps", "vol", {
          size: 3 * GiB,
          topology: { requisite: [{ segments: { zone: "b" } }] },
        }),
        node: storageNode("node-a", { labels: { zone: "a" } }),
      }),
      message: /outside the requested topology/,
    },
    {
      name: "another manager's entry took the room",
      in: input({
        device: claimedDevice("d1", {
          allocatable: 10 * GiB,
          reservations: [{ uid: "y", namespace: "apps", name: "y", bytes: 8 * GiB }],
        }).device,
      }),
      message: /has 2 GiB free, needs 3 GiB/,
    },
    {
      name: "placed partitions without ledger entries took the room",
      in: input({
        assigned: [{ uid: "z", namespace: "apps", name: "z", bytes: 9 * GiB, terminating: true }],
      }),
      message: /has 1 GiB free/,
    },
    {
      name: "the ledger is full",
      in: input({
        device: claimedDevice("d1", {
          allocatable: 10 * GiB,
          reservations: Array.from({ length: MAX_LEDGER_ENTRIES }, (_, i) => ({
            uid: `u${i}`,
            namespace: "apps",
            name: `p${i}`,
            bytes: 1,
          })),
        }).device,
      }),
      message: /maximum of 4096/,
    },
    {
      name: "the device is not the one chosen",
      in: input({ reserve: { serial: "SER-other" } }),
      message: /no longer matches/,
    },
  ];
  test.each(rejects)("rejects when $name", ({ in: i, message }) => {
    const v = reserveVerdict(i);
    expect(v.kind).toBe("reject");
    if (v.kind === "reject") expect(v.message).toMatch(message);
  });
});

describe("reserveVerdict for a thin partition", () => {
  const thinP = partition("apps", "vol", { size: 3 * GiB });
  thinP.spec.thinProvisioning = true;
  const thinUse = partitionUse(thinP) as PartitionUse;
  const withRatio = (ratio: number, reservations: { uid: string; bytes: number; thin?: boolean }[]) => {
    const base = claimedDevice("d1", {
      allocatable: 10 * GiB,
      activeBackend: "spdk",
      reservations: reservations.map((r) => ({ namespace: "apps", name: r.uid, ...r })),
    });
    base.claim.spec.overcommitRatio = ratio;
    return base;
  };

  test("the entry is marked thin and counts against allocatable x ratio", () => {
    const base = withRatio(2, [{ uid: "a", bytes: 9 * GiB, thin: true }]);
    const v = reserveVerdict({
      ...input({ device: base.device, claim: base.claim, partition: thinP }),
      use: thinUse,
    });
    expect(v.kind).toBe("write");
    if (v.kind !== "write") return;
    expect(v.status.reservations?.at(-1)).toEqual({
      uid: thinUse.uid,
      namespace: "apps",
      name: "vol",
      bytes: 3 * GiB,
      thin: true,
    });
    expect(v.status).toMatchObject({ provisionedBytes: 12 * GiB, thinBytes: 12 * GiB, overcommitRatio: 2 });
  });

  test("past the ratio it is refused on the fresh device; the same ledger at ratio 1 refuses sooner", () => {
    const over = withRatio(2, [{ uid: "a", bytes: 18 * GiB, thin: true }]);
    const v = reserveVerdict({
      ...input({ device: over.device, claim: over.claim, partition: thinP }),
      use: thinUse,
    });
    expect(v).toMatchObject({ kind: "reject" });
    expect(v.kind === "reject" && v.message).toContain("2 GiB free within overcommit ratio 2, needs 3 GiB");
    const one = withRatio(1, [{ uid: "a", bytes: 8 * GiB, thin: true }]);
    expect(
      reserveVerdict({ ...input({ device: one.device, claim: one.claim, partition: thinP }), use: thinUse })
        .kind,
    ).toBe("reject");
  });

  test("a full lvstore refuses it", () => {
    const base = withRatio(4, []);
    if (base.device.status)
      base.device.status.lvstore = { totalBytes: 100, freeBytes: 5, observedTime: "2026-02-01T10:00:00Z" };
    const v = reserveVerdict({
      ...input({ device: base.device, claim: base.claim, partition: thinP }),
      use: thinUse,
    });
    expect(v.kind === "reject" && v.message).toContain("lvstore is 95% full, above the 85% limit");
  });
});
