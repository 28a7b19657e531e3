// A set of logical cluster indices of one lvol, and its compact text form for a CRD status: a
// bitmap (bit i, least significant bit first in byte i/8, set when cluster i is in the set),
// raw-deflated, then base64. Changed-block tracking records each snapshot's own clusters this way
// (agent) and answers the CSI SnapshotMetadata service from them (CSI controller).
import { deflateRawSync, inflateRawSync } from "node:zlib";
import { StorageError } from "./errors.ts";

/** Encodes sorted or unsorted, possibly repeated, cluster indices below `numClusters`. Pure. */
export function encodeClusterMap(clusters: Iterable<number>, numClusters: number): string {
  if (!Number.isSafeInteger(numClusters) || numClusters < 0)
    throw new StorageError("invalid", `cluster count ${numClusters} is not a whole number`);
  const bits = new Uint8Array(Math.ceil(numClusters / 8));
  for (const c of clusters) {
    if (!Number.isSafeInteger(c) || c < 0 || c >= numClusters)
      throw new StorageError("invalid", `cluster ${c} is outside 0..${numClusters - 1}`);
    bits[c >> 3] = (bits[c >> 3] as number) | (1 << (c & 7));
  }
  return deflateRawSync(bits, { level: 9 }).toString("base64");
}

/**
 * The sorted cluster indices an encoded map holds. Throws StorageError "invalid" when the text is
 * not base64 of a raw-deflate stream, inflates to more than ceil(numClusters/8) bytes, or sets a
 * bit at or beyond numClusters: a damaged status is refused, never read as fewer clusters.
 */
export function decodeClusterMap(encoded: string, numClusters: number): number[] {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(encoded) || encoded.length % 4 !== 0)
    throw new StorageError("invalid", "cluster map is not base64");
  const want = Math.ceil(numClusters / 8);
  let bits: Buffer;
  try {
    bits = inflateRawSync(Buffer.from(encoded, "base64"), { maxOutputLength: Math.max(want, 1) });
  } catch (err) {
    throw new StorageError("invalid", `cluster map does not inflate within ${want} bytes`, { cause: err });
  }
  if (bits.length > want)
    throw new StorageError("invalid", `cluster map holds ${bits.length} bytes, ${want} expected`);
  const out: number[] = [];
  for (let i = 0; i < bits.length; i++) {
    let b = bits[i] as number;
    while (b !== 0) {
      const low = b & -b;
      const c = i * 8 + (31 - Math.clz32(low));
      if (c >= numClusters)
        throw new StorageError("invalid", `cluster map sets cluster ${c} of a ${numClusters}-cluster lvol`);
      out.push(c);
      b ^= low;
    }
  }
  return out;
}

/**
 * The clusters that byte ranges touch, for clusters of `clusterSize` bytes: a range covering any
 * byte of a cluster counts the whole cluster. Sorted, without repeats. Pure.
 */
export function clustersOfRanges(
  ranges: readonly { offset: number; length: number }[],
  clusterSize: number,
): number[] {
  const set = new Set<number>();
  for (const r of ranges) {
    if (r.length <= 0) continue;
    const first = Math.floor(r.offset / clusterSize);
    const last = Math.floor((r.offset + r.length - 1) / clusterSize);
    for (let c = first; c <= last; c++) set.add(c);
  }
  return [...set].sort((a, b) => a - b);
}

/** Sorted union of cluster lists. Pure. */
export function unionClusters(lists: readonly (readonly number[])[]): number[] {
  const set = new Set<number>();
  for (const l of lists) for (const c of l) set.add(c);
  return [...set].sort((a, b) => a - b);
}
