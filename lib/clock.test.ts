// Tests for the Clock port: ManualClock ordering, sleeps, cancellation and aborts; realClock basics.

import { describe, expect, test } from "bun:test";
import { ManualClock, realClock, settle } from "./clock.ts";

describe("ManualClock", () => {
  test("fires due timers in due order, ties in creation order, with now() at the due time", () => {
    const clock = new ManualClock(1000);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push(`c@${clock.now()}`), 30);
    clock.setTimeout(() => fired.push(`a@${clock.now()}`), 10);
    clock.setTimeout(() => fired.push(`b1@${clock.now()}`), 20);
    clock.setTimeout(() => fired.push(`b2@${clock.now()}`), 20);
    clock.advance(20);
    expect(fired).toEqual(["a@1010", "b1@1020", "b2@1020"]);
    expect(clock.now()).toBe(1020);
    clock.advance(100);
    expect(fired).toEqual(["a@1010", "b1@1020", "b2@1020", "c@1030"]);
    expect(clock.now()).toBe(1120);
    expect(clock.pendingTimers).toBe(0);
  });

  test("timers scheduled by a callback inside the window fire in the same advance", () => {
    const clock = new ManualClock();
    const fired: number[] = [];
    const tick = () => {
      fired.push(clock.now());
      if (fired.length < 5) clock.setTimeout(tick, 10);
    };
    clock.setTimeout(tick, 10);
    clock.advance(35);
    expect(fired).toEqual([10, 20, 30]);
    expect(clock.nextDue()).toBe(40);
  });

  test("cancel removes a timer; cancelling twice or after firing is harmless", () => {
    const clock = new ManualClock();
    let n = 0;
    const cancel = clock.setTimeout(() => n++, 5);
    cancel();
    cancel();
    clock.advance(10);
    expect(n).toBe(0);
    const cancel2 = clock.setTimeout(() => n++, 5);
    clock.advance(5);
    cancel2();
    expect(n).toBe(1);
  });

  test("setTimeout with ms <= 0 never fires synchronously", () => {
    const clock = new ManualClock();
    let n = 0;
    clock.setTimeout(() => n++, 0);
    clock.setTimeout(() => n++, -5);
    expect(n).toBe(0);
    clock.advance(0);
    expect(n).toBe(2);
  });

  test("sleep resolves after advance; sleep(0) resolves without advancing", async () => {
    const clock = new ManualClock();
    let woke = false;
    const p = clock.sleep(100).then(() => {
      woke = true;
    });
    clock.advance(99);
    await settle();
    expect(woke).toBe(false);
    clock.advance(1);
    await p;
    expect(woke).toBe(true);
    await clock.sleep(0);
  });

  test("sleep rejects with the abort reason and frees its timer", async () => {
    const clock = new ManualClock();
    const ac = new AbortController();
    const p = clock.sleep(1000, ac.signal);
    expect(clock.pendingTimers).toBe(1);
    ac.abort(new Error("stop"));
    await expect(p).rejects.toThrow("stop");
    expect(clock.pendingTimers).toBe(0);
    await expect(clock.sleep(5, ac.signal)).rejects.toThrow("stop");
  });

  test("advanceAsync lets async loops schedule their next sleep within the window", async () => {
    const clock = new ManualClock();
    const ticks: number[] = [];
    const ac = new AbortController();
    const loop = (async () => {
      for (;;) {
        await clock.sleep(10, ac.signal);
        ticks.push(clock.now());
      }
    })().catch(() => {});
    await clock.advanceAsync(45);
    expect(ticks).toEqual([10, 20, 30, 40]);
    ac.abort();
    await loop;
  });

  test("advance rejects negative steps", () => {
    expect(() => new ManualClock().advance(-1)).toThrow(RangeError);
  });
});

describe("realClock", () => {
  test("now is wall time and sleep/setTimeout really wait a little", async () => {
    const before = Date.now();
    expect(Math.abs(realClock.now() - before)).toBeLessThan(1000);
    await realClock.sleep(2);
    let fired = false;
    await new Promise<void>((resolve) => {
      realClock.setTimeout(() => {
        fired = true;
        resolve();
      }, 1);
    });
    expect(fired).toBe(true);
    let cancelled = true;
    const cancel = realClock.setTimeout(() => {
      cancelled = false;
    }, 1);
    cancel();
    await realClock.sleep(5);
    expect(cancelled).toBe(true);
  });

  test("sleep aborts promptly", async () => {
    const ac = new AbortController();
    const p = realClock.sleep(60_000, ac.signal);
    ac.abort();
    await expect(p).rejects.toThrow();
  });
});
