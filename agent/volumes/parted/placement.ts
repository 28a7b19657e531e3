// Where a new partition goes: first fit in the disk's free space, starting on an alignment
// boundary, with its size rounded up to that alignment, so every partition edge stays aligned.
import type { FreeRegion } from "./parted-output.ts";

export const MiB = 1024 * 1024;
/** Default alignment of partition starts and sizes: a multiple of every common erase block and stripe. */
export const DEFAULT_ALIGN = 4 * MiB;
/** Nothing starts below 1 MiB: the GPT header and entries live there, and 1 MiB is the usual floor. */
export const MIN_START = MiB;

/** `n` rounded up to a multiple of `to` (> 0). */
export function roundUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

/** A byte range to create; end is inclusive, as parted takes it. */
export interface Placement {
  start: number;
  end: number;
}

/**
 * The lowest-addressed aligned range of exactly `sizeBytes` inside one free region, or undefined
 * when none fits. Pure. `sizeBytes` must already be a multiple of `alignBytes`.
 */
export function placeVolume(
  free: readonly FreeRegion[],
  sizeBytes: number,
  alignBytes: number,
): Placement | undefined {
  const regions = [...free].sort((a, b) => a.start - b.start);
  for (const r of regions) {
    const start = roundUp(Math.max(r.start, MIN_START), alignBytes);
    const end = start + sizeBytes - 1;
    if (end <= r.end) return { start, end };
  }
  return undefined;
}
