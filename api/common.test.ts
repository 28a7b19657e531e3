// Condition, ClaimRef and the small helpers: the metav1 constraints hold in TS as they do upstream.
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { ConditionSchema, conditions, intRange, ObjectMetaSchema } from "./common.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

const cond = {
  type: "storage.distort.io/Ready",
  status: "True",
  observedGeneration: 3,
  lastTransitionTime: "2026-02-01T10:00:00.123456Z",
  reason: "AllGood_2",
  message: "",
};

describe("ConditionSchema", () => {
  test("valid condition parses", () => {
    expect(issuePaths(ConditionSchema, cond)).toEqual([]);
    expect(issuePaths(ConditionSchema, { ...cond, lastTransitionTime: "2026-02-01T10:00:00+02:00" })).toEqual(
      [],
    );
  });

  const rejects: RejectCase[] = [
    { name: "type with space", set: { type: "Not Ready" }, at: "type" },
    { name: "type too long", set: { type: "A".repeat(317) }, at: "type" },
    { name: "status Yes", set: { status: "Yes" }, at: "status" },
    { name: "negative observedGeneration", set: { observedGeneration: -1 }, at: "observedGeneration" },
    { name: "fractional observedGeneration", set: { observedGeneration: 1.5 }, at: "observedGeneration" },
    {
      name: "lastTransitionTime not RFC 3339",
      set: { lastTransitionTime: "yesterday" },
      at: "lastTransitionTime",
    },
    {
      name: "lastTransitionTime with a space",
      set: { lastTransitionTime: "2026-02-01 10:00:00Z" },
      at: "lastTransitionTime",
    },
    {
      name: "lastTransitionTime offset without colon",
      set: { lastTransitionTime: "2026-02-01T10:00:00+0200" },
      at: "lastTransitionTime",
    },
    {
      name: "lastTransitionTime month 13",
      set: { lastTransitionTime: "2026-13-01T10:00:00Z" },
      at: "lastTransitionTime",
    },
    { name: "missing lastTransitionTime", set: { lastTransitionTime: undefined }, at: "lastTransitionTime" },
    { name: "empty reason", set: { reason: "" }, at: "reason" },
    { name: "reason starting with digit", set: { reason: "1Bad" }, at: "reason" },
    { name: "reason ending with comma", set: { reason: "Bad," }, at: "reason" },
    { name: "message too long", set: { message: "x".repeat(32769) }, at: "message" },
    { name: "missing message", set: { message: undefined }, at: "message" },
  ];
  test.each(rejects)("rejects $name", ({ set, at }) => {
    expect(issuePaths(ConditionSchema, withPaths(cond, set))).toContain(at);
  });
});

describe("conditions()", () => {
  const schema = v.object({ conditions: conditions("test") });
  test("absent decodes as an empty list, fresh each time", () => {
    const a = v.parse(schema, {});
    const b = v.parse(schema, {});
    expect(a.conditions).toEqual([]);
    expect(a.conditions).not.toBe(b.conditions);
  });
  test("more than 32 conditions rejected", () => {
    const many = Array.from({ length: 33 }, (_, i) => ({ ...cond, type: `T${i}` }));
    expect(issuePaths(schema, { conditions: many })).toContain("conditions");
  });
});

describe("ObjectMetaSchema", () => {
  test("keeps unknown keys (managedFields, ownerReferences)", () => {
    const meta = v.parse(ObjectMetaSchema, { name: "a", ownerReferences: [{ uid: "u" }] });
    expect(meta).toEqual({ name: "a", ownerReferences: [{ uid: "u" }] });
  });
});

describe("intRange()", () => {
  const percent = intRange(0, 100);
  test("takes integers from min to max inclusive", () => {
    for (const n of [0, 1, 99, 100]) expect(v.is(percent, n)).toBe(true);
  });
  test("refuses values outside the range, fractions and non-numbers", () => {
    for (const bad of [-1, 101, 2.5, Number.NaN, "5", null]) expect(v.is(percent, bad)).toBe(false);
  });
});
