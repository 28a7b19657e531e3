// Unit tests of the rebuild bench's pure parts: the fill pattern (non-zero, position-dependent,
// continuous across windows), MiB/s, the cap chosen for the capped run and the cap check.
import { describe, expect, test } from "bun:test";
import { capFor, keptToCap, mibPerSecond, pattern } from "./rebuild-math.ts";

describe("pattern", () => {
  test("has no zero word and no repeated word in 1 MiB", () => {
    const b = pattern(0, 2 ** 20);
    const seen = new Set<number>();
    for (let i = 0; i < b.length; i += 4) seen.add(b.readUInt32LE(i));
    expect(seen.has(0)).toBe(false);
    expect(seen.size).toBe(b.length / 4);
  });

  test("windows continue one stream, and a shifted window differs", () => {
    const whole = pattern(4096, 8192);
    expect(Buffer.concat([pattern(4096, 4096), pattern(8192, 4096)]).equals(whole)).toBe(true);
    expect(pattern(4096, 4096).equals(pattern(8192, 4096))).toBe(false);
    expect(pattern(0, 8).toString("hex")).toBe("b179379e62f36e3c");
  });

  test("refuses offsets and lengths that are not whole words", () => {
    expect(() => pattern(2, 4)).toThrow(RangeError);
    expect(() => pattern(0, 6)).toThrow(RangeError);
    expect(() => pattern(-4, 4)).toThrow(RangeError);
  });
});

describe("rates and the cap", () => {
  test("MiB/s from bytes and milliseconds", () => {
    expect(mibPerSecond(2 ** 30, 4000)).toBe(256);
    expect(mibPerSecond(2 ** 20, 0)).toBeNaN();
  });

  test("the cap is 100 MiB/s, or half a slower uncapped rebuild, and never 0", () => {
    expect(capFor(500)).toBe(100);
    expect(capFor(150)).toBe(75);
    expect(capFor(1.5)).toBe(1);
    expect(capFor(Number.NaN)).toBe(1);
    expect(capFor(500, 40)).toBe(40);
  });

  test("a rate keeps to its cap up to 110 % of it", () => {
    expect(keptToCap(110, 100)).toBe(true);
    expect(keptToCap(110.5, 100)).toBe(false);
    expect(keptToCap(Number.NaN, 100)).toBe(false);
  });
});
