// Unit tests of the growth runs' command line: the --sizes list and what it refuses.
import { describe, expect, test } from "bun:test";
import { sizesArg } from "./growth.ts";

describe("sizesArg", () => {
  test("absent: undefined, so a bench runs its defaults", () => {
    expect(sizesArg(["1000"])).toBeUndefined();
  });

  test("a comma list of two or more positive integers", () => {
    expect(sizesArg(["--sizes", "1000,2500,5000"])).toEqual([1000, 2500, 5000]);
  });

  test("refuses one size, non-integers and a missing list", () => {
    expect(() => sizesArg(["--sizes", "1000"])).toThrow("two or more");
    expect(() => sizesArg(["--sizes", "10,x"])).toThrow("two or more");
    expect(() => sizesArg(["--sizes"])).toThrow("two or more");
  });
});
