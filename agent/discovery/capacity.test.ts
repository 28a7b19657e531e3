// Capacity = namespace 1 minus a 1 % reserve (rounded up), rounded down to 4 MiB; exact at any size.
import { expect, test } from "bun:test";
import { ALLOCATION_UNIT_BYTES, allocatableBytes } from "./capacity.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

test.each([
  ["empty", 0, 0],
  ["exactly one unit: the reserve leaves less than a unit", 4 * MiB, 0],
  ["smallest size that yields one unit", 4_236_671, 4 * MiB], // 4236671 - 42367 = 4194304
  ["one byte less yields nothing", 4_236_670, 0],
  ["1 GiB", GiB, 1012 * MiB],
  ["100 GiB", 100 * GiB, 101_376 * MiB],
  ["3.84 TB drive", 3_840_755_982_336, 3_802_346_291_200],
  // bytes * 99 is far beyond 2^53 here: a float formula would be off
  ["largest safe integer", Number.MAX_SAFE_INTEGER, 8_917_127_260_012_544],
])("%s", (_name, bytes, want) => {
  const got = allocatableBytes(bytes);
  expect(got).toBe(want);
  expect(got % ALLOCATION_UNIT_BYTES).toBe(0);
});

test.each([-1, 1.5, Number.NaN, 2 ** 60])("rejects %p", (bytes) => {
  expect(() => allocatableBytes(bytes)).toThrow(RangeError);
});
