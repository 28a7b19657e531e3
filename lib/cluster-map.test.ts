import { describe, expect, test } from "bun:test";
import { deflateRawSync } from "node:zlib";
import { clustersOfRanges, decodeClusterMap, encodeClusterMap, unionClusters } from "./cluster-map.ts";
import { StorageError } from "./errors.ts";

describe("cluster map codec", () => {
  test("round-trips sets of every shape, sorted and without repeats", () => {
    const cases: [number[], number][] = [
      [[], 0],
      [[], 17],
      [[0], 1],
      [[2, 5, 9, 10, 20], 32],
      [[31, 0, 7, 8, 7], 32],
      [Array.from({ length: 1000 }, (_, i) => i * 2), 2001],
    ];
    for (const [set, n] of cases) {
      const expected = [...new Set(set)].sort((a, b) => a - b);
      expect(decodeClusterMap(encodeClusterMap(set, n), n)).toEqual(expected);
    }
  });

  test("a sparse map of a large lvol stays small", () => {
    const n = 4 * 1024 * 1024; // 16 TiB of 4 MiB clusters
    const enc = encodeClusterMap([0, 1, 2, n - 1], n);
    expect(enc.length).toBeLessThan(2048);
    expect(decodeClusterMap(enc, n)).toEqual([0, 1, 2, n - 1]);
  });

  test("refuses clusters outside the lvol when encoding", () => {
    expect(() => encodeClusterMap([32], 32)).toThrow(StorageError);
    expect(() => encodeClusterMap([-1], 32)).toThrow(/outside/);
    expect(() => encodeClusterMap([1.5], 32)).toThrow(/outside/);
  });

  test("refuses damaged text instead of reading fewer clusters", () => {
    expect(() => decodeClusterMap("not base64!", 32)).toThrow(/base64/);
    expect(() => decodeClusterMap("AAAA", 32)).toThrow(/inflate/);
    // Too many bytes for the lvol.
    const long = deflateRawSync(new Uint8Array(8)).toString("base64");
    expect(() => decodeClusterMap(long, 32)).toThrow(StorageError);
    // A bit beyond the last cluster of a 10-cluster lvol (byte 1, bit 7 = cluster 15).
    const beyond = deflateRawSync(Uint8Array.of(0, 0x80)).toString("base64");
    expect(() => decodeClusterMap(beyond, 10)).toThrow(/cluster 15/);
  });

  test("byte ranges count every cluster they touch", () => {
    const mib = 1024 * 1024;
    expect(
      clustersOfRanges(
        [
          { offset: 0, length: 4 * mib },
          { offset: 2 * mib + 4096, length: 4096 },
          { offset: 5 * mib, length: 4096 },
          { offset: 9 * mib, length: 2 * mib },
          { offset: 21 * mib - 1, length: 1 },
          { offset: 30 * mib, length: 0 },
        ],
        mib,
      ),
    ).toEqual([0, 1, 2, 3, 5, 9, 10, 20]);
  });

  test("union is sorted and deduplicated", () => {
    expect(unionClusters([[5, 1], [1, 9], []])).toEqual([1, 5, 9]);
  });
});
