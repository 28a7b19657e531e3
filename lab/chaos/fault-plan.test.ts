import { expect, test } from "bun:test";
import {
  DEFAULT_DRAIN_MS,
  DEFAULT_GAP_MS,
  DEFAULT_NODE_DOWN_MS,
  DEFAULT_PROCESS_DOWN_MS,
  describeFault,
  faultPlan,
} from "./fault-plan.ts";

test("the plan is a pure function of the seed", () => {
  const a = faultPlan({ seed: 42, faults: 200, nodes: 3 });
  expect(faultPlan({ seed: 42, faults: 200, nodes: 3 })).toEqual(a);
  expect(faultPlan({ seed: 43, faults: 200, nodes: 3 })).not.toEqual(a);
  // A shorter run is the start of the longer one.
  expect(faultPlan({ seed: 42, faults: 15, nodes: 3 })).toEqual(a.slice(0, 15));
  expect(a.map((f) => f.n)).toEqual([...Array(200).keys()].map((i) => i + 1));
});

test("200 faults hit every node with every action and the manager, within the bounds", () => {
  const plan = faultPlan({ seed: 7, faults: 200, nodes: 3 });
  const kinds = new Set(
    plan.map((f) =>
      f.target.kind === "manager"
        ? "manager"
        : f.target.kind === "drain"
          ? `${f.target.index}/drain`
          : `${f.target.index}/${f.target.action}`,
    ),
  );
  for (const i of [0, 1, 2])
    for (const a of ["agent", "target", "node"]) expect(kinds.has(`${i}/${a}`)).toBe(true);
  expect(kinds.has("manager")).toBe(true);
  for (const f of plan) {
    const [lo, hi] =
      f.target.kind === "node" && f.target.action === "node" ? DEFAULT_NODE_DOWN_MS : DEFAULT_PROCESS_DOWN_MS;
    expect(f.downMs).toBeGreaterThanOrEqual(lo);
    expect(f.downMs).toBeLessThanOrEqual(hi);
    expect(f.gapMs).toBeGreaterThanOrEqual(DEFAULT_GAP_MS[0]);
    expect(f.gapMs).toBeLessThanOrEqual(DEFAULT_GAP_MS[1]);
  }
  // Node deaths are the commonest fault (they make the failovers).
  const deaths = plan.filter((f) => f.target.kind === "node" && f.target.action === "node").length;
  expect(deaths).toBeGreaterThan(40);
});

test("drains: absent by default (each seed's plan unchanged), within their bounds with a weight", () => {
  const without = faultPlan({ seed: 11, faults: 200, nodes: 4 });
  expect(without.some((f) => f.target.kind === "drain")).toBe(false);
  expect(faultPlan({ seed: 11, faults: 200, nodes: 4, drainWeight: 0 })).toEqual(without);
  const plan = faultPlan({ seed: 11, faults: 200, nodes: 4, drainWeight: 1 });
  const drains = plan.filter((f) => f.target.kind === "drain");
  // Weight 1 of 12: about 17 of 200.
  expect(drains.length).toBeGreaterThan(5);
  expect(drains.length).toBeLessThan(40);
  expect(new Set(drains.map((f) => (f.target.kind === "drain" ? f.target.index : -1))).size).toBe(4);
  for (const f of drains) {
    expect(f.downMs).toBeGreaterThanOrEqual(DEFAULT_DRAIN_MS[0]);
    expect(f.downMs).toBeLessThanOrEqual(DEFAULT_DRAIN_MS[1]);
  }
  expect(
    describeFault({ n: 9, target: { kind: "drain", index: 2 }, downMs: 30000, gapMs: 500 }, ["a", "b", "c"]),
  ).toBe("fault 9: drain of c for up to 30000 ms (the next faults go on), then 500 ms");
  expect(() => faultPlan({ seed: 1, faults: 1, nodes: 3, drainWeight: -1 })).toThrow(/drainWeight/);
  expect(() => faultPlan({ seed: 1, faults: 1, nodes: 3, drainMs: [5, 1] })).toThrow(/drainMs/);
});

test("bad options are refused with a clear error", () => {
  expect(() => faultPlan({ seed: -1, faults: 1, nodes: 3 })).toThrow(/seed/);
  expect(() => faultPlan({ seed: 1.5, faults: 1, nodes: 3 })).toThrow(/seed/);
  expect(() => faultPlan({ seed: 1, faults: -2, nodes: 3 })).toThrow(/faults/);
  expect(() => faultPlan({ seed: 1, faults: 1, nodes: 1 })).toThrow(/nodes/);
  expect(() => faultPlan({ seed: 1, faults: 1, nodes: 3, gapMs: [5, 1] })).toThrow(/gapMs/);
});

test("each fault reads as one line", () => {
  const names = ["a", "b", "c"];
  expect(
    describeFault({ n: 3, target: { kind: "node", index: 1, action: "node" }, downMs: 10, gapMs: 5 }, names),
  ).toBe("fault 3: node death of b (kill -9 agent + nvmf_tgt), down 10 ms, then 5 ms");
  expect(describeFault({ n: 4, target: { kind: "manager" }, downMs: 1, gapMs: 2 }, names)).toBe(
    "fault 4: kill -9 manager, down 1 ms, then 2 ms",
  );
});
