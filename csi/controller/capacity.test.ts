// Capacity ranges to allocation sizes: rounding to 4 MiB, limit-only ranges, and the two error codes.
import { expect, test } from "bun:test";
import { create } from "@bufbuild/protobuf";
import { CapacityRangeSchema } from "../../gen/csi/v1/csi_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { MAX_VOLUME_BYTES, resolveCapacity } from "./capacity.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const range = (requiredBytes: bigint, limitBytes: bigint) =>
  create(CapacityRangeSchema, { requiredBytes, limitBytes });

const rows: [string, ReturnType<typeof range> | undefined, number | "invalid" | "out-of-range"][] = [
  ["no range: the default", undefined, GiB],
  ["both zero: the default", range(0n, 0n), GiB],
  ["exact multiple", range(BigInt(8 * MiB), 0n), 8 * MiB],
  ["rounded up", range(1n, 0n), 4 * MiB],
  ["rounded up within the limit", range(BigInt(5 * MiB), BigInt(8 * MiB)), 8 * MiB],
  ["required == limit on the unit", range(BigInt(GiB), BigInt(GiB)), GiB],
  ["limit only: rounded down", range(0n, BigInt(10 * MiB)), 8 * MiB],
  ["limit only below the unit", range(0n, BigInt(3 * MiB)), "out-of-range"],
  ["no multiple inside the range", range(BigInt(5 * MiB), BigInt(7 * MiB)), "out-of-range"],
  ["required above the limit", range(BigInt(2 * GiB), BigInt(GiB)), "invalid"],
  ["negative required", range(-1n, 0n), "invalid"],
  ["negative limit", range(0n, -5n), "invalid"],
  ["beyond the largest volume", range(BigInt(Number.MAX_SAFE_INTEGER) + 10n, 0n), "out-of-range"],
  ["the largest volume", range(BigInt(MAX_VOLUME_BYTES), 0n), MAX_VOLUME_BYTES],
];

for (const [name, r, want] of rows) {
  test(name, () => {
    if (typeof want === "number") {
      expect(resolveCapacity(r, GiB)).toBe(want);
      return;
    }
    let err: unknown;
    try {
      resolveCapacity(r, GiB);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe(want);
  });
}
