// applyStatusPatch and isNoop: fields set and dropped, conditions upserted without touching
// other writers' fields or conditions, transition times kept while the status stays the same.
import { describe, expect, test } from "bun:test";
import type { NVMePartitionStatus } from "../api/index.ts";
import { applyStatusPatch, isNoop, type StatusPatch } from "./status-patch.ts";
import { cond, T0 } from "./testdata/fixtures.ts";

const INITIAL: NVMePartitionStatus = { state: "Pending", conditions: [] };
const later = new Date(T0 + 60_000);

describe("applyStatusPatch", () => {
  test("starts from the initial status when there is none", () => {
    expect(applyStatusPatch(undefined, INITIAL, { set: { state: "Placed" } }, later)).toEqual({
      state: "Placed",
      conditions: [],
    });
  });

  test("sets and drops fields, keeps the ones it does not name", () => {
    const cur: NVMePartitionStatus = {
      state: "Exported",
      nqn: "nqn.2026-02.io.distort:v",
      allocatedBytes: 4,
      conditions: [],
    };
    const out = applyStatusPatch(
      cur,
      INITIAL,
      { set: { allocatedBytes: undefined, state: "Exported" } },
      later,
    );
    expect(out).toEqual({ state: "Exported", nqn: "nqn.2026-02.io.distort:v", conditions: [] });
    expect(cur.allocatedBytes).toBe(4); // input untouched
  });

  test("upserts its conditions, keeps others, keeps the transition time while status is unchanged", () => {
    const cur: NVMePartitionStatus = {
      state: "Pending",
      conditions: [cond("Ready", "False", "NotExported"), cond("Scheduled", "False", "NoClaimedDevice")],
    };
    const sameStatus = applyStatusPatch(
      cur,
      INITIAL,
      { conditions: [{ type: "Scheduled", status: "False", reason: "NodeStale", message: "m" }] },
      later,
    );
    expect(sameStatus.conditions).toEqual([
      cond("Ready", "False", "NotExported"),
      { ...cond("Scheduled", "False", "NodeStale"), message: "m" },
    ]);
    const flipped = applyStatusPatch(
      cur,
      INITIAL,
      { conditions: [{ type: "Scheduled", status: "True", reason: "Placed", message: "" }] },
      later,
    );
    expect(flipped.conditions[1]?.lastTransitionTime).toBe("2026-02-01T10:01:00Z");
  });
});

describe("isNoop", () => {
  const cur: NVMePartitionStatus = {
    state: "Placed",
    conditions: [{ ...cond("Scheduled", "True", "Placed"), observedGeneration: 2 }],
  };
  const cases: { name: string; patch: StatusPatch<NVMePartitionStatus>; want: boolean }[] = [
    { name: "empty patch", patch: {}, want: true },
    { name: "same field", patch: { set: { state: "Placed" } }, want: true },
    { name: "other field value", patch: { set: { state: "Exported" } }, want: false },
    {
      name: "same condition",
      patch: {
        conditions: [
          { type: "Scheduled", status: "True", reason: "Placed", message: "", observedGeneration: 2 },
        ],
      },
      want: true,
    },
    {
      name: "newer generation",
      patch: {
        conditions: [
          { type: "Scheduled", status: "True", reason: "Placed", message: "", observedGeneration: 3 },
        ],
      },
      want: false,
    },
    {
      name: "missing condition",
      patch: { conditions: [{ type: "Ready", status: "True", reason: "X", message: "" }] },
      want: false,
    },
  ];
  test.each(cases)("$name -> $want", ({ patch, want }) => {
    expect(isNoop(cur, patch)).toBe(want);
  });
  test("no status at all is never a no-op", () => {
    expect(isNoop(undefined, {})).toBe(false);
  });
});
