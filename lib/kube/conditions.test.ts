// Table tests for the metav1.Condition helpers: transition times, replacement and order,
// validation, truncation, lookups and order-insensitive equality.

import { describe, expect, test } from "bun:test";
import { StorageError } from "../errors.ts";
import {
  type Condition,
  conditionsEqual,
  findCondition,
  formatConditionTime,
  isTrue,
  MAX_MESSAGE_BYTES,
  removeCondition,
  setCondition,
  truncateMessage,
} from "./conditions.ts";

const T0 = "2025-01-01T00:00:00Z";
const NOW = new Date("2025-06-01T12:34:56.789Z");
const NOW_S = "2025-06-01T12:34:56Z";

const ready = (over: Partial<Condition> = {}): Condition => ({
  type: "Ready",
  status: "True",
  lastTransitionTime: T0,
  reason: "Exported",
  message: "listening",
  ...over,
});
const degraded = (over: Partial<Condition> = {}): Condition => ({
  type: "Degraded",
  status: "False",
  lastTransitionTime: T0,
  reason: "AsExpected",
  message: "",
  ...over,
});

describe("setCondition", () => {
  const cases: Array<{
    name: string;
    conds: Condition[];
    next: Omit<Condition, "lastTransitionTime">;
    want: Condition[];
  }> = [
    {
      name: "adds a new type with now as transition time (whole seconds)",
      conds: [],
      next: { type: "Ready", status: "False", reason: "Pending", message: "waiting" },
      want: [
        { type: "Ready", status: "False", lastTransitionTime: NOW_S, reason: "Pending", message: "waiting" },
      ],
    },
    {
      name: "keeps the transition time when only reason/message/generation change",
      conds: [ready()],
      next: { type: "Ready", status: "True", reason: "Reexported", message: "again", observedGeneration: 3 },
      want: [ready({ reason: "Reexported", message: "again", observedGeneration: 3 })],
    },
    {
      name: "moves the transition time when the status changes",
      conds: [ready()],
      next: { type: "Ready", status: "False", reason: "TargetDown", message: "nvmf_tgt gone" },
      want: [
        ready({ status: "False", reason: "TargetDown", message: "nvmf_tgt gone", lastTransitionTime: NOW_S }),
      ],
    },
    {
      name: "replaces in place, keeping the order of the others",
      conds: [degraded(), ready(), degraded({ type: "Synced" })],
      next: { type: "Ready", status: "Unknown", reason: "Probing", message: "" },
      want: [
        degraded(),
        ready({ status: "Unknown", reason: "Probing", message: "", lastTransitionTime: NOW_S }),
        degraded({ type: "Synced" }),
      ],
    },
    {
      name: "appends a new type at the end",
      conds: [ready()],
      next: { type: "example.com/Degraded", status: "False", reason: "AsExpected", message: "" },
      want: [ready(), degraded({ type: "example.com/Degraded", lastTransitionTime: NOW_S })],
    },
    {
      name: "drops observedGeneration when the new condition has none",
      conds: [ready({ observedGeneration: 2 })],
      next: { type: "Ready", status: "True", reason: "Exported", message: "listening" },
      want: [ready()],
    },
  ];
  test.each(cases)("$name", ({ conds, next, want }) => {
    const before = structuredClone(conds);
    const got = setCondition(conds, next, NOW);
    expect(got).toEqual(want);
    expect(conds).toEqual(before); // input untouched
    expect(got).not.toBe(conds);
  });

  test.each([
    ["empty reason", { reason: "" }, /reason "" must be CamelCase/],
    ["reason with spaces", { reason: "Not Ready" }, /must be CamelCase/],
    ["reason starting with a digit", { reason: "1Bad" }, /must be CamelCase/],
    ["reason ending in a comma", { reason: "Bad," }, /must be CamelCase/],
    ["reason too long", { reason: `A${"b".repeat(1024)}` }, /1\.\.1024/],
    ["empty type", { type: "" }, /type must be a qualified name/],
    ["type with a space", { type: "Is Ready" }, /type must be a qualified name/],
    ["bad status", { status: "Yes" }, /status must be True, False or Unknown/],
    ["negative generation", { observedGeneration: -1 }, /observedGeneration/],
    ["fractional generation", { observedGeneration: 1.5 }, /observedGeneration/],
  ] as const)("rejects %s", (_, over, message) => {
    const next = { type: "Ready", status: "True", reason: "Ok", message: "", ...over } as Omit<
      Condition,
      "lastTransitionTime"
    >;
    expect(() => setCondition([], next, NOW)).toThrow(message);
    expect(() => setCondition([], next, NOW)).toThrow(StorageError);
  });

  test.each(["Ready", "A", "Reason_With_Underscores", "Scheme:Detail,More_1", "x".repeat(1024)])(
    "accepts reason %s",
    (reason) => {
      expect(setCondition([], { type: "Ready", status: "True", reason, message: "" }, NOW)[0]?.reason).toBe(
        reason,
      );
    },
  );

  test("truncates a long message to the byte limit", () => {
    const got = setCondition(
      [],
      { type: "Ready", status: "False", reason: "Err", message: "é".repeat(40_000) },
      NOW,
    );
    const msg = got[0]?.message ?? "";
    expect(new TextEncoder().encode(msg).length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    expect(msg.endsWith("...")).toBe(true);
    expect(msg.startsWith("éé")).toBe(true);
  });
});

describe("truncateMessage", () => {
  test.each([
    ["short ascii is untouched", "hello", "hello"],
    ["exactly the limit is untouched", "a".repeat(MAX_MESSAGE_BYTES), "a".repeat(MAX_MESSAGE_BYTES)],
    [
      "one byte over is cut with a marker",
      "a".repeat(MAX_MESSAGE_BYTES + 1),
      `${"a".repeat(MAX_MESSAGE_BYTES - 3)}...`,
    ],
  ])("%s", (_, input, want) => {
    expect(truncateMessage(input)).toBe(want);
  });

  test("never splits a surrogate pair", () => {
    const out = truncateMessage(`a${"😀".repeat(10_000)}`);
    expect(out.endsWith("😀...")).toBe(true);
    expect(new TextEncoder().encode(out).length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
  });
});

describe("lookups", () => {
  const conds = [ready({ observedGeneration: 4 }), degraded()];
  test.each([
    ["Ready is true", "Ready", undefined, true],
    ["Ready is true for its generation", "Ready", 4, true],
    ["Ready is stale for a newer generation", "Ready", 5, false],
    ["Degraded is false", "Degraded", undefined, false],
    ["a missing type is not true", "Missing", undefined, false],
  ] as const)("isTrue: %s", (_, type, gen, want) => {
    expect(isTrue(conds, type, gen)).toBe(want);
  });

  test("findCondition returns the condition or undefined", () => {
    expect(findCondition(conds, "Degraded")).toEqual(degraded());
    expect(findCondition(conds, "Nope")).toBeUndefined();
  });

  test("removeCondition returns a new array without the type", () => {
    const got = removeCondition(conds, "Ready");
    expect(got).toEqual([degraded()]);
    expect(conds.length).toBe(2);
    expect(removeCondition(conds, "Nope")).toEqual(conds);
  });

  test("formatConditionTime drops sub-second precision", () => {
    expect(formatConditionTime(NOW)).toBe(NOW_S);
    expect(formatConditionTime(new Date(T0))).toBe(T0);
  });
});

describe("conditionsEqual", () => {
  test.each([
    ["same lists", [ready(), degraded()], [ready(), degraded()], true],
    ["order ignored", [ready(), degraded()], [degraded(), ready()], true],
    ["both empty", [], [], true],
    ["different length", [ready()], [ready(), degraded()], false],
    ["status differs", [ready()], [ready({ status: "False" })], false],
    ["reason differs", [ready()], [ready({ reason: "Other" })], false],
    ["message differs", [ready()], [ready({ message: "x" })], false],
    ["generation differs", [ready({ observedGeneration: 1 })], [ready({ observedGeneration: 2 })], false],
    ["generation missing vs set", [ready()], [ready({ observedGeneration: 1 })], false],
    ["transition time differs", [ready()], [ready({ lastTransitionTime: NOW_S })], false],
    ["duplicates compare as multisets", [ready(), ready()], [ready(), degraded()], false],
  ] as const)("%s", (_, a, b, want) => {
    expect(conditionsEqual(a, b)).toBe(want);
    expect(conditionsEqual(b, a)).toBe(want);
  });

  test("a re-set with identical content is a no-op write", () => {
    const first = setCondition([], { type: "Ready", status: "True", reason: "Exported", message: "ok" }, NOW);
    const again = setCondition(
      first,
      { type: "Ready", status: "True", reason: "Exported", message: "ok" },
      new Date(),
    );
    expect(conditionsEqual(first, again)).toBe(true);
  });
});
