import { describe, expect, test } from "bun:test";
import { exampleNVMeSnapshot, type NVMeSnapshot } from "../../api/index.ts";
import { BlockMetadataType } from "../../gen/csi/v1/csi_pb.ts";
import { encodeClusterMap } from "../../lib/cluster-map.ts";
import { StorageError } from "../../lib/errors.ts";
import { allocatedAnswer, deltaAnswer, lineage, messages, recordOf } from "./snapshot-metadata.ts";

const MiB = 1024 * 1024;
const CLUSTER = 4 * MiB;
const CLUSTERS = 16;
const T = "2026-12-04T00:00:00Z";

/** A ready snapshot `name` holding `own` clusters itself, taken after the snapshot `parent`. */
function snap(name: string, own: number[], parent?: string, recorded = true): NVMeSnapshot {
  const s = exampleNVMeSnapshot();
  s.metadata.name = name;
  s.metadata.uid = `uid-${name}`;
  const st = s.status as NonNullable<NVMeSnapshot["status"]>;
  st.externalId = `ext-${name}`;
  st.sizeBytes = CLUSTERS * CLUSTER;
  if (recorded) {
    st.blockMetadata = {
      clusterSizeBytes: CLUSTER,
      numClusters: CLUSTERS,
      clusters: encodeClusterMap(own, CLUSTERS),
      fingerprint: `${name}:${own.length}`,
      recordedAt: T,
      ...(parent ? { parentSnapshot: `ext-${parent}` } : {}),
    };
    st.conditions = [
      ...(st.conditions ?? []),
      { type: "BlockMetadata", status: "True", lastTransitionTime: T, reason: "Recorded", message: "" },
    ];
  }
  return s;
}

function byName(...all: NVMeSnapshot[]) {
  return new Map(all.map((s) => [s.metadata.name, s]));
}

function kindOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (err) {
    if (err instanceof StorageError) return err.kind;
    throw err;
  }
  return undefined;
}

// The lineage of transcript section 6: a writes clusters 0-3, b rewrites part of 2 and writes 5,
// 9, 10; c (after b) writes 12.
const a = snap("a", [0, 1, 2, 3]);
const b = snap("b", [2, 5, 9, 10], "a");
const c = snap("c", [12], "b");
const all = byName(a, b, c);

describe("allocated and delta from the per-snapshot records", () => {
  test("allocated is the union up the lineage", () => {
    expect(allocatedAnswer(a, all).clusters).toEqual([0, 1, 2, 3]);
    expect(allocatedAnswer(b, all).clusters).toEqual([0, 1, 2, 3, 5, 9, 10]);
    expect(allocatedAnswer(c, all)).toEqual({
      clusterSizeBytes: CLUSTER,
      capacityBytes: CLUSTERS * CLUSTER,
      clusters: [0, 1, 2, 3, 5, 9, 10, 12],
    });
  });

  test("delta is the union after the base up to the target", () => {
    expect(deltaAnswer(a, b, all).clusters).toEqual([2, 5, 9, 10]);
    expect(deltaAnswer(a, c, all).clusters).toEqual([2, 5, 9, 10, 12]);
    expect(deltaAnswer(b, c, all).clusters).toEqual([12]);
  });

  test("a base that is not earlier in the target's lineage is refused", () => {
    expect(kindOf(() => deltaAnswer(c, a, all))).toBe("invalid");
    expect(kindOf(() => deltaAnswer(b, b, all))).toBe("invalid");
    const other = snap("other", [1]);
    expect(kindOf(() => deltaAnswer(other, c, byName(a, b, c, other)))).toBe("invalid");
    const elsewhere = snap("elsewhere", [1]);
    (elsewhere.status as { deviceSerial: string }).deviceSerial = "OTHER-DRIVE";
    expect(kindOf(() => deltaAnswer(elsewhere, c, byName(a, b, c, elsewhere)))).toBe("invalid");
  });

  test("a parent without an NVMeSnapshot (being merged) or without a record is UNAVAILABLE, never fewer clusters", () => {
    expect(kindOf(() => allocatedAnswer(c, byName(a, c)))).toBe("unavailable");
    const bUnread = snap("b", [2, 5, 9, 10], "a", false);
    expect(kindOf(() => allocatedAnswer(c, byName(a, bUnread, c)))).toBe("unavailable");
    expect(kindOf(() => deltaAnswer(a, c, byName(a, bUnread, c)))).toBe("unavailable");
  });

  test("a record the agent marked failed is not read", () => {
    const failed = snap("b", [2], "a");
    const st = failed.status as NonNullable<NVMeSnapshot["status"]>;
    st.conditions = (st.conditions ?? []).map((x) =>
      x.type === "BlockMetadata" ? { ...x, status: "False", reason: "ReadFailed", message: "gone" } : x,
    );
    expect(kindOf(() => recordOf(failed))).toBe("unavailable");
  });

  test("an unready snapshot or a damaged record is refused", () => {
    const unready = snap("u", [1]);
    (unready.status as { readyToUse: boolean }).readyToUse = false;
    expect(kindOf(() => recordOf(unready))).toBe("precondition");
    const damaged = snap("d", [1]);
    (damaged.status?.blockMetadata as { clusters: string }).clusters = "AAAA";
    expect(kindOf(() => recordOf(damaged))).toBe("internal");
  });

  test("a cycle in the records is an internal error, not a hang", () => {
    const x = snap("x", [1], "y");
    const y = snap("y", [2], "x");
    expect(kindOf(() => lineage(x, byName(x, y)))).toBe("internal");
  });
});

describe("streamed messages", () => {
  const answer = { clusterSizeBytes: CLUSTER, capacityBytes: CLUSTERS * CLUSTER, clusters: [0, 2, 5, 9, 10] };
  const offsets = (pages: ReturnType<typeof messages>) =>
    pages.flatMap((p) => p.blockMetadata.map((m) => Number(m.byteOffset / BigInt(CLUSTER))));

  test("fixed-length tuples of one cluster, in order", () => {
    const [page, ...rest] = messages(answer, 0n, 0);
    expect(rest).toEqual([]);
    expect(page?.blockMetadataType).toBe(BlockMetadataType.FIXED_LENGTH);
    expect(page?.volumeCapacityBytes).toBe(BigInt(CLUSTERS * CLUSTER));
    expect(page?.blockMetadata).toEqual(
      [0, 2, 5, 9, 10].map((c) => ({ byteOffset: BigInt(c * CLUSTER), sizeBytes: BigInt(CLUSTER) })),
    );
  });

  test("max_results splits into messages, starting_offset skips what ends before it", () => {
    const pages = messages(answer, 0n, 2);
    expect(pages.map((p) => p.blockMetadata.length)).toEqual([2, 2, 1]);
    expect(offsets(pages)).toEqual([0, 2, 5, 9, 10]);
    // An offset inside cluster 5 keeps cluster 5 (it ends after the offset).
    expect(offsets(messages(answer, BigInt(5 * CLUSTER + 4096), 0))).toEqual([5, 9, 10]);
    expect(offsets(messages(answer, BigInt(6 * CLUSTER), 0))).toEqual([9, 10]);
  });

  test("nothing allocated is one empty message; offsets outside the volume and negative limits are refused", () => {
    expect(messages({ ...answer, clusters: [] }, 0n, 0).map((p) => p.blockMetadata)).toEqual([[]]);
    expect(kindOf(() => messages(answer, BigInt(CLUSTERS * CLUSTER), 0))).toBe("out-of-range");
    expect(kindOf(() => messages(answer, -1n, 0))).toBe("out-of-range");
    expect(kindOf(() => messages(answer, 0n, -1))).toBe("invalid");
  });
});
