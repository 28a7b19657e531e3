// Table tests for first-fit aligned placement and size rounding.
import { expect, test } from "bun:test";
import type { FreeRegion } from "./parted-output.ts";
import { DEFAULT_ALIGN, MiB, placeVolume, roundUp } from "./placement.ts";

const region = (start: number, end: number): FreeRegion => ({ start, end, sizeBytes: end - start + 1 });
// A 64 MiB GPT disk with 512-byte sectors: usable 17408 .. 64 MiB - 16896 - 1.
const DISK = region(17408, 64 * MiB - 16896 - 1);

test.each<[string, FreeRegion[], number, number, ReturnType<typeof placeVolume>]>([
  [
    "first volume starts at the first aligned offset",
    [DISK],
    4 * MiB,
    DEFAULT_ALIGN,
    { start: 4 * MiB, end: 8 * MiB - 1 },
  ],
  ["1 MiB alignment starts at 1 MiB, never lower", [DISK], 1 * MiB, MiB, { start: MiB, end: 2 * MiB - 1 }],
  [
    "a free region starting at 0 still starts at 1 MiB",
    [region(0, 10 * MiB)],
    MiB,
    MiB,
    { start: MiB, end: 2 * MiB - 1 },
  ],
  [
    "the lowest fitting region wins, whatever the input order",
    [region(40 * MiB, 64 * MiB - 1), region(12 * MiB, 20 * MiB - 1)],
    8 * MiB,
    DEFAULT_ALIGN,
    { start: 12 * MiB, end: 20 * MiB - 1 },
  ],
  [
    "a hole too small after alignment is skipped",
    [region(12 * MiB + 512, 20 * MiB - 1), region(40 * MiB, 64 * MiB - 1)],
    8 * MiB,
    DEFAULT_ALIGN,
    { start: 40 * MiB, end: 48 * MiB - 1 },
  ],
  [
    "exactly filling the tail fits",
    [region(8 * MiB, 16 * MiB - 1)],
    8 * MiB,
    DEFAULT_ALIGN,
    { start: 8 * MiB, end: 16 * MiB - 1 },
  ],
  ["one byte short does not fit", [region(8 * MiB, 16 * MiB - 2)], 8 * MiB, DEFAULT_ALIGN, undefined],
  ["the tail of a disk not ending on a boundary is unusable", [DISK], 64 * MiB, DEFAULT_ALIGN, undefined],
  ["nothing free", [], 4 * MiB, DEFAULT_ALIGN, undefined],
])("%s", (_name, free, size, align, expected) => {
  const got = placeVolume(free, size, align);
  expect(got).toEqual(expected);
  if (got) {
    expect(got.start % align).toBe(0);
    expect((got.end + 1) % align).toBe(0);
  }
});

test("sizes round up to the alignment", () => {
  expect(roundUp(1, 4 * MiB)).toBe(4 * MiB);
  expect(roundUp(4 * MiB, 4 * MiB)).toBe(4 * MiB);
  expect(roundUp(4 * MiB + 1, 4 * MiB)).toBe(8 * MiB);
  expect(roundUp(10 * MiB, 4 * MiB)).toBe(12 * MiB);
});
