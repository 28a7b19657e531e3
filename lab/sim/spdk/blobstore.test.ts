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
