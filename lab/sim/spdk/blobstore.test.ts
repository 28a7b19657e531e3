// The pure lvol store core: layout arithmetic against SPDK's numbers, thin vs thick cluster
// accounting, snapshot/clone/delete semantics and the metadata round trip.
import { describe, expect, test } from "bun:test";
import { Blobstore, computeLayout, DEFAULT_CLUSTER_SIZE, parseMetadata } from "./blobstore.ts";
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

  test("metadata round-trips lvols, parents, clone order and allocations", () => {
    const bs = Blobstore.create("lvs", 64 * MIB, 4096);
    const a = bs.createLvol("a", 8 * MIB, false);
    a.written.add(1);
    const snap = bs.snapshot(a, "s");
    bs.clone(snap, "b");
    bs.createLvol("t", 8 * MIB, true);
    const md = JSON.parse(JSON.stringify(bs.toMetadata())) as unknown;
    const back = Blobstore.fromMetadata(parseMetadata(md));
    expect(back.toMetadata()).toEqual(bs.toMetadata());
    expect(back.freeClusters).toBe(bs.freeClusters);
    const s2 = back.find("s");
    expect(s2?.written.has(1)).toBe(true);
    expect(back.clonesOf(s2 as NonNullable<typeof s2>).map((x) => x.name)).toEqual(["a", "b"]);
    expect(() => parseMetadata({ format: "something-else" })).toThrow();
  });
});

describe("contiguous thick lvols (lab deviation: one run of clusters each)", () => {
  // 256 MiB: 63 data clusters after the metadata cluster(s).
  const store = () => Blobstore.create("lvs", 256 * MIB, 4096);
  const md = (bs: Blobstore) => bs.layout.mdClusters;

  test("create takes the first run that fits, also in a hole left by a delete", () => {
    const bs = store();
    const a = bs.createLvol("a", 8 * MIB, false);
    const b = bs.createLvol("b", 12 * MIB, false);
    const c = bs.createLvol("c", 8 * MIB, false);
    expect([a, b, c].map((l) => bs.runOf(l))).toEqual([
      { start: md(bs), count: 2 },
      { start: md(bs) + 2, count: 3 },
      { start: md(bs) + 5, count: 2 },
    ]);
    expect(bs.delete(b)).toEqual([md(bs) + 2, md(bs) + 3, md(bs) + 4]);
    // Too big for the hole: after c. Small enough: in the hole, first fit.
    const big = bs.createLvol("big", 16 * MIB, false);
    expect(bs.runOf(big)).toEqual({ start: md(bs) + 7, count: 4 });
    const d = bs.createLvol("d", 8 * MIB, false);
    expect(bs.runOf(d)).toEqual({ start: md(bs) + 2, count: 2 });
    // Every cluster of a thick lvol counts as written: the store zeroes them on allocation.
    expect([...d.written]).toEqual([0, 1]);
  });

  test("thin lvols, snapshots and clones have no run", () => {
    const bs = store();
    const thin = bs.createLvol("thin", 8 * MIB, true);
    thin.map[0] = bs.allocate();
    thin.written.add(0);
    expect(bs.runOf(thin)).toBeUndefined();
    const l = bs.createLvol("l", 8 * MIB, false);
    const snap = bs.snapshot(l, "snap");
    const clone = bs.clone(snap, "clone");
    expect([l, snap, clone].map((x) => bs.runOf(x))).toEqual([undefined, undefined, undefined]);
    expect(bs.runOf(bs.createLvol("empty", 0, false))).toBeUndefined();
  });

  test("growth is in place when the next clusters are free, a relocation when not", () => {
    const bs = store();
    const a = bs.createLvol("a", 8 * MIB, false);
    const b = bs.createLvol("b", 8 * MIB, false);
    // b is last: it grows in place; only the new clusters need zeroing.
    expect(bs.resize(b, 16 * MIB)).toEqual({
      zero: [md(bs) + 4, md(bs) + 5],
      copy: [],
      released: [],
    });
    expect(bs.runOf(b)).toEqual({ start: md(bs) + 2, count: 4 });
    expect([...b.written]).toEqual([0, 1, 2, 3]);
    // a is boxed in by b: it moves to the first run of 3 after b, old clusters copied then freed.
    const free = bs.freeClusters;
    expect(bs.resize(a, 12 * MIB)).toEqual({
      zero: [md(bs) + 8],
      copy: [
        [md(bs), md(bs) + 6],
        [md(bs) + 1, md(bs) + 7],
      ],
      released: [md(bs), md(bs) + 1],
    });
    expect(bs.runOf(a)).toEqual({ start: md(bs) + 6, count: 3 });
    expect(bs.freeClusters).toBe(free - 1);
    // Shrinking keeps the run and frees the tail.
    expect(bs.resize(a, 4 * MIB).released).toEqual([md(bs) + 7, md(bs) + 8]);
    expect(bs.runOf(a)).toEqual({ start: md(bs) + 6, count: 1 });
    // The freed front is reused first.
    expect(bs.runOf(bs.createLvol("c", 8 * MIB, false))).toEqual({ start: md(bs), count: 2 });
  });

  test("a pinned lvol only grows in place; anything else is EBUSY and changes nothing", () => {
    const bs = store();
    const a = bs.createLvol("a", 8 * MIB, false);
    const b = bs.createLvol("b", 8 * MIB, false);
    const before = JSON.stringify(bs.toMetadata());
    expect(errnoOf(() => bs.resize(a, 12 * MIB, { pinned: true }))).toBe(Errno.EBUSY);
    expect(errnoOf(() => bs.resize(a, 4 * MIB, { pinned: true }))).toBe(Errno.EBUSY);
    expect(JSON.stringify(bs.toMetadata())).toBe(before);
    expect(bs.resize(b, 12 * MIB, { pinned: true }).copy).toEqual([]);
    expect(bs.runOf(b)).toEqual({ start: md(bs) + 2, count: 3 });
    // Not growing at all is fine too.
    expect(bs.resize(a, 8 * MIB, { pinned: true })).toEqual({ zero: [], copy: [], released: [] });
  });

  test("when no run fits, clusters are scattered as SPDK would (no run) until a resize finds one", () => {
    const bs = store();
    // Fill the store with 1-cluster lvols, then free every other one: 31 free, no run of 2.
    const ones = Array.from({ length: 63 }, (_, i) => bs.createLvol(`l${i}`, 4 * MIB, false));
    for (let i = 0; i < 63; i += 2) bs.delete(ones[i] as (typeof ones)[number]);
    expect(bs.freeClusters).toBe(32);
    expect(bs.findRun(2)).toBeUndefined();
    const frag = bs.createLvol("frag", 12 * MIB, false);
    expect(frag.map).toEqual([md(bs), md(bs) + 2, md(bs) + 4]);
    expect(bs.runOf(frag)).toBeUndefined();
    // Free a run of 4 and grow: the lvol moves there and is one run again.
    for (const i of [9, 11, 13]) bs.delete(ones[i] as (typeof ones)[number]);
    const plan = bs.resize(frag, 16 * MIB);
    expect(plan.copy).toEqual([
      [md(bs), md(bs) + 8],
      [md(bs) + 2, md(bs) + 9],
      [md(bs) + 4, md(bs) + 10],
    ]);
    expect(bs.runOf(frag)).toEqual({ start: md(bs) + 8, count: 4 });
    expect(errnoOf(() => bs.createLvol("huge", 1024 * MIB, false))).toBe(Errno.ENOSPC);
  });

  test("checkpoint puts allocation and mapping back", () => {
    const bs = store();
    const a = bs.createLvol("a", 8 * MIB, false);
    bs.createLvol("b", 8 * MIB, false);
    const before = JSON.stringify(bs.toMetadata());
    const free = bs.freeClusters;
    const undo = bs.checkpoint(a);
    bs.resize(a, 20 * MIB);
    expect(bs.freeClusters).toBe(free - 3);
    undo();
    expect(JSON.stringify(bs.toMetadata())).toBe(before);
    expect(bs.freeClusters).toBe(free);
  });
});
