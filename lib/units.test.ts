// Allocation-unit rounding and the byte formatting used in conditions and events.
import { describe, expect, test } from "bun:test";
import { ALLOCATION_UNIT, formatBytes, formatQuantity, roundUpToUnit } from "./units.ts";

const MiB = 1024 ** 2;

describe("roundUpToUnit", () => {
  test.each([
    [0, 0],
    [1, 4 * MiB],
    [4 * MiB - 1, 4 * MiB],
    [4 * MiB, 4 * MiB],
    [4 * MiB + 1, 8 * MiB],
    [10 * 1024 * MiB, 10 * 1024 * MiB],
    [2 ** 53 - ALLOCATION_UNIT, 2 ** 53 - ALLOCATION_UNIT],
  ])("%d -> %d", (input, want) => {
    expect(roundUpToUnit(input)).toBe(want);
  });
});

describe("formatBytes", () => {
  test.each([
    [0, "0 B"],
    [1023, "1023 B"],
    [4 * MiB, "4 MiB"],
    [1.5 * 1024 * MiB, "1.5 GiB"],
    [-8 * MiB, "-8 MiB"],
  ])("%d -> %s", (input, want) => {
    expect(formatBytes(input)).toBe(want);
  });
});

describe("formatQuantity", () => {
  test.each([
    [0, "0"],
    [1023, "1023"],
    [1024, "1Ki"],
    [1073741824, "1Gi"],
    [34015805440, "31.7Gi"],
    [1024 ** 2 * 1536, "1.5Gi"],
    [1024 ** 3 - 1, "1Gi"],
    [4 * 1024 ** 4, "4Ti"],
  ])("%p bytes -> %p", (input, want) => {
    expect(formatQuantity(input)).toBe(want);
  });
});
