// Wait budgets: the caller's deadline less a margin, the default without one, cancellation.
import { expect, test } from "bun:test";
import { ManualClock } from "../../lib/clock.ts";
import { StorageError } from "../../lib/errors.ts";
import { waitBudget, withBudget } from "./waiter.ts";

const ctx = (timeoutMs: number | undefined, signal = new AbortController().signal) => ({
  signal,
  timeoutMs: () => timeoutMs,
});

test("budget: a tenth of the deadline kept back, at most a second; the default without a deadline", () => {
  const clock = new ManualClock();
  const cases: [number | undefined, number][] = [
    [10_000, 9_000],
    [100_000, 99_000],
    [500, 450],
    [0, 0],
    [undefined, 60_000],
  ];
  for (const [deadline, want] of cases) {
    const b = waitBudget(ctx(deadline), clock, 60_000);
    expect(b.ms).toBe(want);
    b.dispose();
  }
  expect(clock.pendingTimers).toBe(0);
});

test("running out of budget is DEADLINE_EXCEEDED with the caller's description", async () => {
  const clock = new ManualClock();
  const p = withBudget(
    ctx(1000),
    clock,
    60_000,
    (signal) => new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
    () => "still provisioning",
  ).catch((e) => e);
  await clock.advanceAsync(900);
  const err = await p;
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("timeout");
  expect((err as StorageError).message).toBe("still provisioning (waited 900 ms)");
});

test("a cancelled call rethrows the cancellation, not a timeout", async () => {
  const clock = new ManualClock();
  const call = new AbortController();
  const p = withBudget(
    ctx(undefined, call.signal),
    clock,
    60_000,
    (signal) => new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))),
    () => "x",
  );
  call.abort(new Error("client went away"));
  await expect(p).rejects.toThrow("client went away");
  expect(clock.pendingTimers).toBe(0);
});
