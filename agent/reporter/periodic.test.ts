// The reporter ticker on a ManualClock: a pass at once, the next one a period after the previous
// ended, never overlapping, and a prompt stop on abort.
import { expect, test } from "bun:test";
import { ManualClock, settle } from "../../lib/clock.ts";
import { DEFAULT_REPORT_PERIOD_MS, runPeriodically } from "./periodic.ts";

test("passes run at once and then every period after the previous one ended", async () => {
  const clock = new ManualClock(0);
  const ctl = new AbortController();
  const starts: number[] = [];
  const done = runPeriodically(clock, DEFAULT_REPORT_PERIOD_MS, ctl.signal, async () => {
    starts.push(clock.now());
    await clock.sleep(5_000); // a pass that takes 5 s
  });
  await clock.advanceAsync(5_000);
  expect(starts).toEqual([0]);
  await clock.advanceAsync(29_999);
  expect(starts).toEqual([0]);
  await clock.advanceAsync(1);
  expect(starts).toEqual([0, 35_000]);
  await clock.advanceAsync(5_000 + 30_000);
  expect(starts).toEqual([0, 35_000, 70_000]);
  // Aborted mid-pass: the loop waits for that pass to end, then stops without sleeping again.
  ctl.abort();
  let stopped = false;
  void done.then(() => {
    stopped = true;
  });
  await settle();
  expect(stopped).toBe(false);
  await clock.advanceAsync(5_000);
  await done;
  expect(starts).toEqual([0, 35_000, 70_000]);
  expect(clock.pendingTimers).toBe(0);
});

test("abort while waiting ends the loop without another pass", async () => {
  const clock = new ManualClock(0);
  const ctl = new AbortController();
  let passes = 0;
  const done = runPeriodically(clock, 1_000, ctl.signal, async () => {
    passes++;
  });
  await settle();
  expect(passes).toBe(1);
  ctl.abort();
  await done;
  await clock.advanceAsync(10_000);
  expect(passes).toBe(1);
  expect(clock.pendingTimers).toBe(0);
});

test("an already aborted signal runs nothing; a bad period is refused", async () => {
  const ctl = new AbortController();
  ctl.abort();
  let passes = 0;
  await runPeriodically(new ManualClock(), 1_000, ctl.signal, async () => {
    passes++;
  });
  expect(passes).toBe(0);
  await expect(
    runPeriodically(new ManualClock(), 0, new AbortController().signal, async () => {}),
  ).rejects.toThrow(RangeError);
});

test("abort during a pass stops after that pass", async () => {
  const clock = new ManualClock(0);
  const ctl = new AbortController();
  let passes = 0;
  const done = runPeriodically(clock, 1_000, ctl.signal, async () => {
    passes++;
    ctl.abort();
  });
  await done;
  expect(passes).toBe(1);
  expect(clock.pendingTimers).toBe(0);
});
