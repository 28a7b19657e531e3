// Core mask parsing and comparison: the accepted and refused forms, canonical hex, the bound on
// lcores, reactor replies, and the valibot schema for configuration.

import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { StorageError } from "../errors.ts";
import {
  CoreMaskSchema,
  coreMaskOf,
  coreMaskOfReactors,
  MAX_LCORES,
  parseCoreMask,
  sameCores,
} from "./core-mask.ts";

describe("parseCoreMask accepts", () => {
  const table: [string, number[], string][] = [
    ["0x1", [0], "0x1"],
    ["0x3", [0, 1], "0x3"],
    ["0xF0", [4, 5, 6, 7], "0xf0"],
    ["0X0a", [1, 3], "0xa"],
    ["0x0001", [0], "0x1"],
    [" 0x3 ", [0, 1], "0x3"],
    ["[0,2-3]", [0, 2, 3], "0xd"],
    ["[ 1 , 3 ]", [1, 3], "0xa"],
    ["[5-5]", [5], "0x20"],
    ["[3,1,1-2]", [1, 2, 3], "0xe"],
    [`0x8${"0".repeat(255)}`, [1023], `0x8${"0".repeat(255)}`],
    ["[1023]", [1023], `0x8${"0".repeat(255)}`],
  ];
  for (const [text, cores, hex] of table) {
    test(JSON.stringify(text), () => {
      const m = parseCoreMask(text);
      expect(m.cores).toEqual(cores);
      expect(m.hex).toBe(hex);
    });
  }
});

describe("parseCoreMask refuses", () => {
  const table: [string, string][] = [
    ["", "is empty"],
    ["   ", "is empty"],
    ["0x0", "selects no core"],
    ["0x000", "selects no core"],
    ["0x", 'must be hex with a "0x" prefix'],
    ["3", 'must be hex with a "0x" prefix'],
    ["10", 'must be hex with a "0x" prefix'],
    ["0xG1", 'must be hex with a "0x" prefix'],
    ["-0x1", 'must be hex with a "0x" prefix'],
    ["0x-1", 'must be hex with a "0x" prefix'],
    ["[", 'must end with "]"'],
    ["[]", "is not a core or a range"],
    ["[1,]", "is not a core or a range"],
    ["[a]", "is not a core or a range"],
    ["[-1]", "is not a core or a range"],
    ["[3-1]", "range 3-1 is descending"],
    ["[1024]", "beyond the 1024 lcores"],
    ["[0-1024]", "beyond the 1024 lcores"],
    [`0x1${"0".repeat(256)}`, "beyond the 1024 lcores"],
  ];
  for (const [text, why] of table) {
    test(JSON.stringify(text), () => {
      let err: unknown;
      try {
        parseCoreMask(text);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(StorageError);
      expect((err as StorageError).kind).toBe("invalid");
      expect((err as StorageError).message).toContain(JSON.stringify(text));
      expect((err as StorageError).message).toContain(why);
    });
  }
});

test("MAX_LCORES matches SPDK's cpuset width", () => {
  expect(MAX_LCORES).toBe(1024);
  expect(() => coreMaskOf([MAX_LCORES])).toThrow(StorageError);
  expect(() => coreMaskOf([1.5])).toThrow(StorageError);
  expect(() => coreMaskOf([])).toThrow("selects no core");
  expect(coreMaskOf([2, 0, 2]).cores).toEqual([0, 2]);
});

test("coreMaskOfReactors takes the lcores framework_get_reactors lists", () => {
  const m = coreMaskOfReactors({ reactors: [{ lcore: 3 }, { lcore: 0 }] });
  expect(m.hex).toBe("0x9");
  expect(m.cores).toEqual([0, 3]);
  const err = (() => {
    try {
      coreMaskOfReactors({ reactors: [] });
    } catch (e) {
      return e as StorageError;
    }
  })();
  expect(err?.kind).toBe("internal");
});

test("sameCores holds for equal sets only, whatever the spelling", () => {
  expect(sameCores(parseCoreMask("0xd"), parseCoreMask("[0,2-3]"))).toBe(true);
  expect(sameCores(parseCoreMask("0x3"), parseCoreMask("0x7"))).toBe(false); // subset
  expect(sameCores(parseCoreMask("0x7"), parseCoreMask("0x3"))).toBe(false); // superset
  expect(sameCores(parseCoreMask("0x3"), parseCoreMask("0xc"))).toBe(false); // same size, other cores
});

test("CoreMaskSchema parses configuration and reports the reason", () => {
  expect(v.parse(CoreMaskSchema, "[0-1]").hex).toBe("0x3");
  const r = v.safeParse(CoreMaskSchema, "0x0");
  expect(r.success).toBe(false);
  expect(r.issues?.[0]?.message).toContain("selects no core");
  expect(v.safeParse(CoreMaskSchema, 3).success).toBe(false);
});
