// The pure lvol store core: layout arithmetic against SPDK's numbers, thin vs thick cluster
// accounting, snapshot/clone/delete semantics, homes kept apart from the accounting, the metadata
// round trip and metadata from before homes.
import { describe, expect, test } from "bun:test";
import {
  Blobstore,
  computeLayout,
  DEFAULT_CLUSTER_SIZE,
  type LvstoreMetadata,
  legacyByteSource,
  parseMetadata,
} from "./blobstore.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

const MIB = 1024 * 1024;

function errnoOf(fn: () => unknown): number | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof ErrnoError) return e.errno;
    throw e;
  }
  return undefined;
}

describe("computeLayout", () => {
  test.each([
    // [device bytes, total data clusters]: 64 MiB malloc gave 15 on a real v25.05.1 target.
    [64 * MIB, 15],
    [256 * MIB, 63],
    // 1 TB: metadata takes 233 of 238418 clusters (1 page per cluster plus masks).
    [1_000_000_000_000, 238_418 - 233],
  ])("%d bytes with 4 MiB clusters hold %d data clusters", (bytes, data) => {
    expect(computeLayout(bytes, 4096, DEFAULT_CLUSTER_SIZE).totalDataClusters).toBe(data);
  });

  test("rejects a device too small for its metadata and odd cluster sizes", () => {
    expect(errnoOf(() => computeLayout(4 * MIB, 4096, DEFAULT_CLUSTER_SIZE))).toBe(Errno.ENOMEM);
    expect(errnoOf(() => computeLayout(64 * MIB, 4096, 6000))).toBe(Errno.EINVAL);
  });
});

describe("Blobstore", () => {
  test("thick lvols take their clusters up front, thin ones take none", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    expect(bs.freeClusters).toBe(15);
    const thick = bs.createLvol("thick", 16 * MIB, false);
    const thin = bs.createLvol("thin", 32 * MIB, true);
    expect(thick.allocatedClusters).toBe(4);
    expect(thin.allocatedClusters).toBe(0);
    expect(bs.freeClusters).toBe(11);
    // Sizes round up to whole clusters.
    expect(bs.createLvol("odd", 5 * MIB, false).numClusters).toBe(2);
    expect(bs.freeClusters).toBe(9);
    expect(errnoOf(() => bs.createLvol("huge", 1024 * MIB, false))).toBe(Errno.ENOSPC);
    expect(errnoOf(() => bs.createLvol("thick", 4 * MIB, true))).toBe(Errno.EEXIST);
    // A thin lvol may promise more than the store has.
    expect(bs.createLvol("bigthin", 1024 * MIB, true).allocatedClusters).toBe(0);
    expect(bs.freeClusters).toBe(9);
  });

  test("resize grows thick lvols from free clusters and gives them back when shrinking", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const l = bs.createLvol("l", 16 * MIB, false);
    bs.resize(l, 24 * MIB);
    expect(bs.freeClusters).toBe(9);
    bs.resize(l, 4 * MIB);
    expect(bs.freeClusters).toBe(14);
    expect(errnoOf(() => bs.resize(l, 1024 * MIB))).toBe(Errno.ENOSPC);
  });

  test("a snapshot takes the clusters, the origin becomes a thin clone; deletes follow SPDK's rules", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const l = bs.createLvol("l", 24 * MIB, false);
    const snap = bs.snapshot(l, "snap");
    expect(snap.allocatedClusters).toBe(6);
    expect(snap.thin).toBe(false);
    expect(l.thin).toBe(true);
    expect(l.parent).toBe(snap);
    expect(l.allocatedClusters).toBe(0);
    const c = bs.clone(snap, "c");
    expect(bs.clonesOf(snap).map((x) => x.name)).toEqual(["l", "c"]);
    expect(errnoOf(() => bs.clone(l, "x"))).toBe(Errno.EINVAL);
    expect(errnoOf(() => bs.snapshot(l, "snap"))).toBe(Errno.EEXIST);
    expect(errnoOf(() => bs.delete(snap))).toBe(Errno.EPERM);
    bs.delete(c);
    // One clone left: the snapshot merges into it.
    l.map[0] = bs.allocate();
    bs.delete(snap);
    expect(l.parent).toBeNull();
    expect(l.allocatedClusters).toBe(6);
    expect(bs.freeClusters).toBe(15 - 6);
  });

  test("metadata round-trips lvols, parents, clone order, allocations and homes", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const a = bs.createLvol("a", 8 * MIB, false);
    const snap = bs.snapshot(a, "s");
    bs.clone(snap, "b");
    bs.createLvol("t", 8 * MIB, true);
    const md = JSON.parse(JSON.stringify(bs.toMetadata())) as unknown;
    const { bs: back, legacy } = Blobstore.fromMetadata(parseMetadata(md));
    expect(legacy).toEqual([]);
    expect(back.toMetadata()).toEqual(bs.toMetadata());
    expect(back.freeClusters).toBe(bs.freeClusters);
    const s2 = back.find("s") as NonNullable<ReturnType<typeof back.find>>;
    expect(s2.allocatedClusters).toBe(2);
    expect(back.clonesOf(s2).map((x) => x.name)).toEqual(["a", "b"]);
    expect(back.home(back.find("a") as typeof s2)).toEqual(bs.home(a));
    expect(back.physical.freeBaseClusters).toBe(bs.physical.freeBaseClusters);
    expect(() => parseMetadata({ format: "something-else" })).toThrow();
  });

  test("checkpoint puts accounting, parents, clone order and homes back", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const a = bs.createLvol("a", 8 * MIB, false);
    const before = JSON.stringify(bs.toMetadata());
    const free = bs.freeClusters;
    const undo = bs.checkpoint();
    const snap = bs.snapshot(a, "s");
    bs.clone(snap, "c");
    bs.resize(a, 20 * MIB);
    bs.createLvol("d", 8 * MIB, false);
    undo();
    expect(JSON.stringify(bs.toMetadata())).toBe(before);
    expect(bs.freeClusters).toBe(free);
    expect(a.parent).toBeNull();
    expect(a.thin).toBe(false);
    expect(bs.lvols.map((l) => l.name)).toEqual(["a"]);
  });
});

describe("homes next to SPDK's accounting", () => {
  test("thick lvols get a run, thin ones, snapshots and clones their own container", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const md = bs.layout.mdClusters;
    const a = bs.createLvol("a", 8 * MIB, false);
    const t = bs.createLvol("t", 8 * MIB, true);
    expect(bs.home(a)).toEqual({ kind: "run", start: md, count: 2 });
    expect(bs.home(t)).toEqual({ kind: "own" });
    const snap = bs.snapshot(a, "s");
    const c = bs.clone(snap, "c");
    // The origin keeps its run (a loop device over it stays valid); SPDK's view moved the
    // clusters to the snapshot all the same.
    expect(bs.home(a)).toEqual({ kind: "run", start: md, count: 2 });
    expect([bs.home(snap), bs.home(c)]).toEqual([{ kind: "own" }, { kind: "own" }]);
    expect([a.allocatedClusters, snap.allocatedClusters, c.allocatedClusters]).toEqual([0, 2, 0]);
    expect(bs.freeClusters).toBe(15 - 2);
  });

  test("accounting and base runs are independent: a merge frees no run, a thick lvol without a run goes own", () => {
    // 64 MiB: 15 data clusters.
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const a = bs.createLvol("a", 32 * MIB, false);
    const snap = bs.snapshot(a, "s");
    // SPDK counts 8 clusters for the snapshot, none for the origin: 7 free, enough for b.
    const b = bs.createLvol("b", 28 * MIB, false);
    expect(bs.freeClusters).toBe(0);
    expect(bs.home(b)).toEqual({ kind: "run", start: bs.layout.mdClusters + 8, count: 7 });
    // Writing into the origin allocates for the accounting only.
    expect(() => bs.allocate()).toThrow();
    bs.delete(b);
    a.map[0] = bs.allocate();
    // Deleting the snapshot merges it into its only clone, a: the clone keeps its run.
    expect(bs.delete(snap)).toEqual({ kind: "own" });
    expect(a.allocatedClusters).toBe(8);
    expect(bs.home(a)).toEqual({ kind: "run", start: bs.layout.mdClusters, count: 8 });
    expect(bs.freeClusters).toBe(15 - 8);
    // Fragment the base: a thick lvol with enough free clusters but no run gets its own container.
    const ones = Array.from({ length: 7 }, (_, i) => bs.createLvol(`o${i}`, 4 * MIB, false));
    for (const i of [0, 2, 4, 6]) bs.delete(ones[i] as (typeof ones)[number]);
    const frag = bs.createLvol("frag", 8 * MIB, false);
    expect(frag.allocatedClusters).toBe(2);
    expect(bs.home(frag)).toEqual({ kind: "own" });
  });

  test("resize: EPERM for a snapshot, ENOSPC beyond the free clusters, both changing nothing; a boxed-in run moves", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const a = bs.createLvol("a", 8 * MIB, false);
    bs.createLvol("b", 8 * MIB, false);
    const snap = bs.snapshot(a, "s");
    const c = bs.createLvol("c", 4 * MIB, false);
    const before = JSON.stringify(bs.toMetadata());
    expect(errnoOf(() => bs.resize(snap, 16 * MIB))).toBe(Errno.EPERM);
    expect(errnoOf(() => bs.resize(c, 1024 * MIB))).toBe(Errno.ENOSPC);
    expect(JSON.stringify(bs.toMetadata())).toBe(before);
    // a is a thin clone now, boxed in by b: it moves without allocating anything.
    const free = bs.freeClusters;
    const plan = bs.resize(a, 16 * MIB);
    expect(plan.after).toMatchObject({ kind: "run", count: 4 });
    expect(plan.released).toEqual({ start: bs.layout.mdClusters, count: 2 });
    expect(bs.freeClusters).toBe(free);
  });
});

/** Metadata as the emulator wrote it before lvols had homes: bytes at the allocated clusters. */
function legacyMetadata(): LvstoreMetadata {
  return {
    format: "distort-sim-lvstore",
    version: 1,
    uuid: "9a0c1d8e-0000-4000-8000-000000000001",
    name: "old",
    clusterSize: 4 * MIB,
    blockSize: 4096,
    totalClusters: 16,
    mdClusters: 1,
    lvols: [
      // A thick lvol in one run, fully written: stays where it is.
      {
        uuid: "u-thick",
        name: "thick",
        thin: false,
        snapshot: false,
        parent: null,
        cloneSeq: 0,
        numClusters: 2,
        clusters: [[0, 1, 2]],
        written: [[0, 2, 0]],
      },
      // A snapshot of a former origin, at clusters 3-4 (cluster 1 of it never written).
      {
        uuid: "u-snap",
        name: "snap",
        thin: false,
        snapshot: true,
        parent: null,
        cloneSeq: 1,
        numClusters: 2,
        clusters: [[0, 3, 2]],
        written: [[0, 1, 0]],
      },
      // Its origin, a thin clone that has rewritten cluster 1 into cluster 5.
      {
        uuid: "u-orig",
        name: "orig",
        thin: true,
        snapshot: false,
        parent: "u-snap",
        cloneSeq: 2,
        numClusters: 2,
        clusters: [[1, 5, 1]],
        written: [[1, 1, 0]],
      },
    ],
  };
}

describe("metadata from before homes", () => {
  test("loads: a contiguous thick lvol keeps its run, everything else is listed for copying", () => {
    const { bs, legacy } = Blobstore.fromMetadata(parseMetadata(legacyMetadata()));
    expect(legacy.map((l) => l.name)).toEqual(["snap", "orig"]);
    expect(bs.home(bs.find("thick") as (typeof legacy)[number])).toEqual({ kind: "run", start: 1, count: 2 });
    expect(bs.freeClusters).toBe(15 - 5);
    expect(bs.toMetadata().lvols.every((l) => l.home !== undefined && l.written === undefined)).toBe(true);
  });

  test("the old byte layout: own written clusters, else the parent's, else zeros", () => {
    const source = legacyByteSource(parseMetadata(legacyMetadata()));
    expect([0, 1].map((i) => source("u-thick", i))).toEqual([1, 2]);
    expect([0, 1].map((i) => source("u-snap", i))).toEqual([3, undefined]);
    expect([0, 1].map((i) => source("u-orig", i))).toEqual([3, 5]);
  });
});
