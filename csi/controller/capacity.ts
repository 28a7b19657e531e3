// CSI capacity ranges -> the byte size of a partition, on the 4 MiB allocation unit the kernel
// (GPT) and SPDK (lvol cluster) paths share. Pure.

import type { CapacityRange } from "../../gen/csi/v1/csi_pb.ts";
import { ALLOCATION_UNIT } from "../../lib/units.ts";
import { csiError, invalidArgument } from "../errors.ts";

/** Largest size a partition spec can hold (the API caps int64 fields at 2^53-1), on the unit. */
export const MAX_VOLUME_BYTES = Math.floor(Number.MAX_SAFE_INTEGER / ALLOCATION_UNIT) * ALLOCATION_UNIT;

const UNIT = BigInt(ALLOCATION_UNIT);
const MAX = BigInt(MAX_VOLUME_BYTES);

/**
 * The size to allocate for `range`:
 * - no range, or both fields 0: `defaultBytes`;
 * - required_bytes set: required rounded up to the unit, which must not pass limit_bytes;
 * - limit_bytes only: the limit rounded down to the unit (the largest size the caller allows).
 * Negative values and required > limit are INVALID_ARGUMENT; a range no multiple of 4 MiB fits,
 * and sizes above MAX_VOLUME_BYTES, are OUT_OF_RANGE (CSI "unsupported capacity").
 */
export function resolveCapacity(range: CapacityRange | undefined, defaultBytes: number): number {
  const required = range?.requiredBytes ?? 0n;
  const limit = range?.limitBytes ?? 0n;
  if (required < 0n)
    throw invalidArgument(`capacity_range.required_bytes must not be negative (${required})`);
  if (limit < 0n) throw invalidArgument(`capacity_range.limit_bytes must not be negative (${limit})`);
  if (limit > 0n && required > limit) {
    throw invalidArgument(`capacity_range.required_bytes ${required} exceeds limit_bytes ${limit}`);
  }
  let size: bigint;
  if (required > 0n) {
    size = ((required + UNIT - 1n) / UNIT) * UNIT;
    if (limit > 0n && size > limit) {
      throw csiError(
        "out-of-range",
        `no size in [${required}, ${limit}] bytes is a multiple of the ${ALLOCATION_UNIT}-byte allocation unit (nearest: ${size})`,
      );
    }
  } else if (limit > 0n) {
    size = (limit / UNIT) * UNIT;
    if (size === 0n) {
      throw csiError(
        "out-of-range",
        `limit_bytes ${limit} is below the ${ALLOCATION_UNIT}-byte allocation unit, the smallest volume DISTORT makes`,
      );
    }
  } else {
    size = BigInt(defaultBytes);
  }
  if (size > MAX)
    throw csiError("out-of-range", `${size} bytes exceeds the largest volume size ${MAX_VOLUME_BYTES}`);
  return Number(size);
}
