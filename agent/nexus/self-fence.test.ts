import { expect, test } from "bun:test";
import { SELF_FENCE_FRACTION, selfFenceDue, selfFenceLifted } from "./self-fence.ts";

const T = 1_000_000;

test.each([
  // [last heartbeat, started, failoverAfterSeconds, now, due]
  [T, T - 60_000, 5, T + 2_000, false],
  [T, T - 60_000, 5, T + 3_000, false],
  [T, T - 60_000, 5, T + 3_001, true],
  [T, T - 60_000, undefined, T + 18_000, false],
  [T, T - 60_000, undefined, T + 18_001, true],
  [undefined, T, 5, T + 3_000, false],
  [undefined, T, 5, T + 3_001, true],
  // A heartbeat from a clock ahead of this one: not due.
  [T + 10_000, T, 5, T, false],
] as const)("heartbeat %p, started %p, bound %p s, now %p: due %p", (last, started, bound, now, due) => {
  expect(
    selfFenceDue({ lastHeartbeatMs: last, startedMs: started, failoverAfterSeconds: bound, nowMs: now }),
  ).toBe(due);
});

test("the fence comes before the manager's bound: a fraction below 1", () => {
  expect(SELF_FENCE_FRACTION).toBeGreaterThan(0);
  expect(SELF_FENCE_FRACTION).toBeLessThan(1);
});

test("lifted only by a heartbeat newer than the fence", () => {
  expect(selfFenceLifted(undefined, T)).toBe(false);
  expect(selfFenceLifted(T - 1, T)).toBe(false);
  expect(selfFenceLifted(T, T)).toBe(false);
  expect(selfFenceLifted(T + 1, T)).toBe(true);
});
