// The /proc readers the benches use to tell a slow process from a starved one.
import { expect, test } from "bun:test";
import { cpuSeconds, runDelaySeconds } from "./proc-stats.ts";

test("run-queue delay of this process is a non-negative number of seconds that never goes back", () => {
  const a = runDelaySeconds(process.pid, -1);
  let x = 0;
  for (let i = 0; i < 2e6; i++) x += i % 7;
  expect(x).toBeGreaterThan(0);
  const b = runDelaySeconds(process.pid, -1);
  expect(Number.isFinite(a)).toBe(true);
  expect(a).toBeGreaterThanOrEqual(0);
  expect(b).toBeGreaterThanOrEqual(a);
});

test("a process that is not there gives the caller's value", () => {
  // PIDs above /proc/sys/kernel/pid_max (at most 2^22) are never used.
  expect(runDelaySeconds(2 ** 23, -1)).toBe(-1);
  expect(runDelaySeconds(undefined, 7)).toBe(7);
  expect(cpuSeconds(2 ** 23, -1)).toBe(-1);
});
