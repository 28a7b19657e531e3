// The fault schedule: reproducible from its seed, different across seeds, and covering every phase
// and component; plus the env parsing and the summary lines the suite prints.
import { describe, expect, test } from "bun:test";
import {
  BLOCK_ROUNDS,
  COMPONENTS,
  describeRound,
  faultPlan,
  MAX_DELAY_MS,
  PHASES,
  parseRounds,
  parseSeed,
  STEPS,
  summarizeFaults,
} from "./fault-plan.ts";

describe("faultPlan", () => {
  test("replays the plan recorded for seed 20261201 since the node crash joined the components", () => {
    // Recorded when "node" became the fifth component (blocks of five rounds): a printed seed
    // must keep naming the same rounds.
    expect(
      faultPlan(20261201, 5).map((r) => [r.phase, r.component, r.trigger, r.storageClass, r.bytes]),
    ).toEqual([
      [
        "delete",
        "nvmf_tgt",
        { kind: "step", step: "pvc-deletion-requested" },
        "distort-lab-immediate",
        5058560,
      ],
      ["detach", "agent", { kind: "step", step: "pod-deletion-requested" }, "distort-lab-immediate", 5926912],
      ["create", "node", { kind: "delay", ms: 765 }, "distort-lab-immediate", 1650688],
      ["attach", "manager", { kind: "step", step: "nvmeva-created" }, "distort-lab", 3125248],
      ["delete", "csi-controller", { kind: "delay", ms: 26 }, "distort-lab-immediate", 1511424],
    ]);
    expect(faultPlan(20261201, 5).map((r) => [r.fallbackStorageNode, r.writerHolds])).toEqual([
      [1, false],
      [0, false],
      [0, true],
      [1, false],
      [0, false],
    ]);
  });

  test("the same seed gives the same plan", () => {
    expect(faultPlan(123456, 12)).toEqual(faultPlan(123456, 12));
  });

  test("different seeds give different plans", () => {
    const plans = [0, 1, 2, 3, 7, 4294967295].map((s) =>
      JSON.stringify(faultPlan(s, 8).map(({ dataSeed: _, ...p }) => p)),
    );
    expect(new Set(plans).size).toBe(plans.length);
  });

  test("a shorter plan is a prefix of a longer one", () => {
    expect(faultPlan(99, 5)).toEqual(faultPlan(99, 13).slice(0, 5));
  });

  test("every block of rounds covers every phase and every component, for any seed", () => {
    expect(BLOCK_ROUNDS).toBe(COMPONENTS.length);
    expect(BLOCK_ROUNDS).toBeGreaterThanOrEqual(PHASES.length);
    for (let seed = 0; seed < 500; seed++) {
      const plan = faultPlan((seed * 2654435761) >>> 0, 3 * BLOCK_ROUNDS);
      for (let block = 0; block < 3; block++) {
        const part = plan.slice(block * BLOCK_ROUNDS, (block + 1) * BLOCK_ROUNDS);
        expect(new Set(part.map((p) => p.phase))).toEqual(new Set(PHASES));
        expect(new Set(part.map((p) => p.component))).toEqual(new Set(COMPONENTS));
      }
    }
  });

  test("every trigger belongs to its phase, delays stay in range, sizes are whole blocks", () => {
    const seen = new Set<string>();
    for (let seed = 0; seed < 200; seed++) {
      for (const p of faultPlan(seed, 8)) {
        if (p.trigger.kind === "step") {
          expect(STEPS[p.phase] as readonly string[]).toContain(p.trigger.step);
          seen.add(p.trigger.step);
        } else {
          expect(p.trigger.ms).toBeGreaterThanOrEqual(0);
          expect(p.trigger.ms).toBeLessThanOrEqual(MAX_DELAY_MS);
          expect(Number.isInteger(p.trigger.ms)).toBe(true);
          seen.add("delay");
        }
        expect(p.bytes % 4096).toBe(0);
        expect(p.bytes).toBeGreaterThanOrEqual(1 << 20);
        expect(p.bytes).toBeLessThanOrEqual(8 << 20);
        expect([0, 1]).toContain(p.fallbackStorageNode);
      }
    }
    // Over many seeds every step of every phase, and plain delays, are planned.
    expect(seen).toEqual(new Set(["delay", ...Object.values(STEPS).flat()]));
  });

  test("delays lean short but reach the whole range", () => {
    const delays = Array.from({ length: 300 }, (_, seed) => faultPlan(seed, 8))
      .flat()
      .flatMap((p) => (p.trigger.kind === "delay" ? [p.trigger.ms] : []));
    const short = delays.filter((ms) => ms < 300).length;
    expect(short / delays.length).toBeGreaterThan(0.5);
    expect(delays.some((ms) => ms > 1200)).toBe(true);
  });

  test("rounds are numbered from 1 and data seeds are distinct per round and seed", () => {
    const plan = faultPlan(5, 9);
    expect(plan.map((p) => p.round)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(new Set(plan.map((p) => p.dataSeed)).size).toBe(9);
    expect(faultPlan(6, 1)[0]?.dataSeed).not.toBe(plan[0]?.dataSeed);
  });

  test("zero rounds is an empty plan; a bad count is refused", () => {
    expect(faultPlan(1, 0)).toEqual([]);
    expect(() => faultPlan(1, -1)).toThrow();
    expect(() => faultPlan(1, 2.5)).toThrow();
  });

  test("describeRound names the component, phase and trigger", () => {
    const p = faultPlan(77, 4);
    for (const r of p) {
      const line = describeRound(r);
      expect(line).toContain(`round ${r.round}: kill ${r.component} during ${r.phase}`);
      expect(line).toContain(r.dataSeed);
    }
  });
});

describe("env parsing", () => {
  test("parseSeed takes a uint32 or draws one", () => {
    expect(parseSeed("0")).toBe(0);
    expect(parseSeed(" 4294967295 ")).toBe(4294967295);
    expect(parseSeed(undefined, () => 0.5)).toBe(2147483648);
    expect(parseSeed("", () => 0)).toBe(0);
    for (const bad of ["-1", "1.5", "4294967296", "abc", "0x10"])
      expect(() => parseSeed(bad)).toThrow(/DISTORT_FAULT_SEED/);
  });

  test("parseRounds takes 1..100 with a default", () => {
    expect(parseRounds(undefined)).toBe(8);
    expect(parseRounds("", 10)).toBe(10);
    expect(parseRounds("12")).toBe(12);
    for (const bad of ["0", "101", "x", "3.5"])
      expect(() => parseRounds(bad)).toThrow(/DISTORT_FAULT_ROUNDS/);
  });
});

test("summarizeFaults counts per component and per phase", () => {
  expect(
    summarizeFaults([
      { round: 1, phase: "create", component: "manager", inProgress: true },
      { round: 2, phase: "attach", component: "nvmf_tgt", inProgress: false },
      { round: 3, phase: "attach", component: "nvmf_tgt", inProgress: true },
    ]),
  ).toEqual([
    "faults injected: 3 (manager: 1, agent: 0, csi-controller: 0, nvmf_tgt: 2, node: 0)",
    "faults per phase: create: 1, attach: 2, detach: 0, delete: 0",
    "faults that hit a phase still in progress: 2 of 3",
  ]);
  expect(summarizeFaults([])[0]).toBe(
    "faults injected: 0 (manager: 0, agent: 0, csi-controller: 0, nvmf_tgt: 0, node: 0)",
  );
});
