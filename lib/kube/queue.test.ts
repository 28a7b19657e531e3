// Tests for WorkQueue: de-duplication, FIFO, one worker per key, dirty re-queue, backoff and
// token bucket, addAfter, shutdown, and the metrics hooks. Time is a ManualClock throughout.

import { describe, expect, test } from "bun:test";
import { ManualClock, settle } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { seededRandom } from "../seeded-random.ts";
import { WorkQueue, type WorkQueueOptions } from "./queue.ts";

function queue(over: Partial<WorkQueueOptions> = {}) {
  const clock = new ManualClock();
  const q = new WorkQueue({ name: "test", clock, ...over });
  return { q, clock };
}

/** Takes everything queued right now, marking each done (for order checks). */
async function drain(q: WorkQueue): Promise<string[]> {
  const out: string[] = [];
  while (q.length > 0) {
    const k = (await q.get()) as string;
    out.push(k);
    q.done(k);
  }
  return out;
}

describe("WorkQueue basics", () => {
  test("a key added many times while waiting is queued once", async () => {
    const { q } = queue();
    for (let i = 0; i < 10; i++) q.add("a");
    q.add("b");
    q.add("a");
    expect(q.length).toBe(2);
    expect(await drain(q)).toEqual(["a", "b"]);
  });

  test("distinct keys come out FIFO", async () => {
    const { q } = queue();
    const keys = ["ns/c", "ns/a", "ns/b", "other/z", "ns/d"];
    for (const k of keys) q.add(k);
    expect(await drain(q)).toEqual(keys);
  });

  test("a key added while processing is not handed out again until done, then re-queued once", async () => {
    const { q } = queue();
    q.add("a");
    q.add("b");
    const a = await q.get();
    expect(a).toBe("a");
    q.add("a");
    q.add("a");
    expect(q.length).toBe(1); // only b: a is dirty, not queued
    expect(await q.get()).toBe("b");
    // A second worker waiting now must not receive "a".
    let second: string | undefined = "pending";
    const waiting = q.get().then((k) => {
      second = k;
    });
    await settle();
    expect(second).toBe("pending");
    q.done("a");
    await waiting;
    expect(second).toBe("a");
    q.done("a");
    q.done("b");
    expect(q.length).toBe(0);
  });

  test("done for a key that was not handed out is a no-op", async () => {
    const { q } = queue();
    q.done("ghost");
    q.add("a");
    q.done("a"); // queued, not processing
    expect(q.length).toBe(1);
    expect(await q.get()).toBe("a");
  });

  test("waiting getters are served in call order as keys arrive", async () => {
    const { q } = queue();
    const got: string[] = [];
    const g1 = q.get().then((k) => got.push(`1:${k}`));
    const g2 = q.get().then((k) => got.push(`2:${k}`));
    q.add("x");
    q.add("y");
    await Promise.all([g1, g2]);
    expect(got).toEqual(["1:x", "2:y"]);
    expect(q.length).toBe(0);
  });

  test("invalid options are rejected", () => {
    const bad: Array<Partial<WorkQueueOptions>> = [
      { baseDelayMs: -1 },
      { baseDelayMs: 100, maxDelayMs: 10 },
      { qps: 0 },
      { burst: 0 },
      { burst: Number.POSITIVE_INFINITY },
    ];
    for (const opts of bad) expect(() => queue(opts)).toThrow(StorageError);
  });
});

describe("concurrency", () => {
  test("8 workers with random delays never process one key twice at once, and every add is served", async () => {
    const { q } = queue();
    const rand = seededRandom(42);
    const keys = ["a", "b", "c", "d", "e"];
    const inFlight = new Set<string>();
    const lastAdd = new Map<string, number>();
    const lastStart = new Map<string, number>();
    let seq = 0;
    let violations = 0;
    let processed = 0;
    let maxInFlight = 0;
    const turns = async (n: number) => {
      for (let i = 0; i < n; i++) await settle();
    };
    const worker = async () => {
      for (;;) {
        const key = await q.get();
        if (key === undefined) return;
        if (inFlight.has(key)) violations++;
        inFlight.add(key);
        maxInFlight = Math.max(maxInFlight, inFlight.size);
        lastStart.set(key, ++seq);
        processed++;
        await turns(Math.floor(rand() * 4));
        inFlight.delete(key);
        q.done(key);
      }
    };
    const workers = Array.from({ length: 8 }, worker);
    for (let i = 0; i < 400; i++) {
      const key = keys[Math.floor(rand() * keys.length)] as string;
      q.add(key);
      lastAdd.set(key, ++seq);
      if (rand() < 0.3) await turns(1);
    }
    // Let everything settle, then check the level-triggered guarantee: each key was processed
    // after its last add.
    while (q.length > 0 || inFlight.size > 0) await turns(1);
    q.shutDown();
    await Promise.all(workers);
    expect(violations).toBe(0);
    expect(maxInFlight).toBeGreaterThan(1); // the workers really overlapped
    expect(processed).toBeLessThan(400); // de-duplication did its job
    for (const k of keys) expect(lastStart.get(k) ?? 0).toBeGreaterThan(lastAdd.get(k) ?? 0);
  });
});

describe("rate limiting", () => {
  test("per-key backoff doubles from baseDelay and caps at maxDelay", () => {
    const { q } = queue({ baseDelayMs: 5, maxDelayMs: 1000, qps: Number.POSITIVE_INFINITY });
    const delays = Array.from({ length: 12 }, () => q.addRateLimited("k"));
    expect(delays).toEqual([5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]);
    expect(q.numRequeues("k")).toBe(12);
    // Other keys back off independently.
    expect(q.addRateLimited("other")).toBe(5);
  });

  test("huge failure counts do not overflow the cap", () => {
    const { q } = queue({ baseDelayMs: 1, maxDelayMs: 300_000, qps: Number.POSITIVE_INFINITY });
    let last = 0;
    for (let i = 0; i < 2000; i++) last = q.addRateLimited("k");
    expect(last).toBe(300_000);
  });

  test("a rate-limited key becomes available exactly when its delay passes", async () => {
    const { q, clock } = queue({ baseDelayMs: 100, qps: Number.POSITIVE_INFINITY });
    q.addRateLimited("k");
    expect(q.length).toBe(0);
    clock.advance(99);
    expect(q.length).toBe(0);
    clock.advance(1);
    expect(q.length).toBe(1);
    expect(await q.get()).toBe("k");
  });

  test("token bucket: burst passes at once, then retries are spaced at 1/qps", () => {
    const { q, clock } = queue({ baseDelayMs: 0, qps: 10, burst: 3 });
    const first = ["a", "b", "c", "d", "e"].map((k) => q.addRateLimited(k));
    expect(first).toEqual([0, 0, 0, 100, 200]);
    // A second later the bucket is full again (capped at burst, not 10 tokens).
    clock.advance(1300);
    const second = ["f", "g", "h", "i"].map((k) => q.addRateLimited(k));
    expect(second).toEqual([0, 0, 0, 100]);
  });

  test("the longer of backoff and bucket wins", () => {
    const { q } = queue({ baseDelayMs: 50, qps: 1, burst: 1 });
    expect(q.addRateLimited("a")).toBe(50); // token available, backoff 50
    expect(q.addRateLimited("b")).toBe(1000); // bucket empty: 1 s beats 50 ms
  });

  test("forget resets the backoff of one key only", () => {
    const { q } = queue({ baseDelayMs: 10, qps: Number.POSITIVE_INFINITY });
    q.addRateLimited("a");
    q.addRateLimited("a");
    q.addRateLimited("b");
    q.forget("a");
    expect(q.numRequeues("a")).toBe(0);
    expect(q.numRequeues("b")).toBe(1);
    expect(q.addRateLimited("a")).toBe(10);
    expect(q.addRateLimited("b")).toBe(20);
  });
});

describe("addAfter", () => {
  test.each([
    ["earlier second call wins", [500, 100], 100],
    ["later second call is ignored", [100, 500], 100],
    ["equal deadlines keep one timer", [200, 200], 200],
  ] as const)("%s", (_, delays, expectedAt) => {
    const { q, clock } = queue();
    for (const d of delays) q.addAfter("k", d);
    expect(clock.pendingTimers).toBe(1);
    clock.advance(expectedAt - 1);
    expect(q.length).toBe(0);
    clock.advance(1);
    expect(q.length).toBe(1);
    clock.advance(1000);
    expect(q.length).toBe(1); // no second add from a superseded timer
  });

  test("deadlines compare in absolute time", () => {
    const { q, clock } = queue();
    q.addAfter("k", 100); // due at 100
    clock.advance(50);
    q.addAfter("k", 60); // due at 110: later, ignored
    clock.advance(50);
    expect(q.length).toBe(1);
  });

  test("ms <= 0 adds at once", () => {
    const { q } = queue();
    q.addAfter("a", 0);
    q.addAfter("b", -5);
    expect(q.length).toBe(2);
  });

  test("a delayed add of a queued key still de-duplicates when it fires", async () => {
    const { q, clock } = queue();
    q.add("k");
    q.addAfter("k", 10);
    clock.advance(10);
    expect(q.length).toBe(1);
    expect(await drain(q)).toEqual(["k"]);
  });
});

describe("shutDown", () => {
  test("releases waiting getters with undefined", async () => {
    const { q } = queue();
    const getters = [q.get(), q.get(), q.get()];
    q.shutDown();
    expect(await Promise.all(getters)).toEqual([undefined, undefined, undefined]);
    expect(await q.get()).toBeUndefined();
    expect(q.shuttingDown).toBe(true);
  });

  test("drains what was queued, ignores new adds, cancels delayed adds", async () => {
    const { q, clock } = queue();
    q.add("a");
    q.add("b");
    q.addAfter("later", 100);
    q.addRateLimited("retry");
    q.shutDown();
    q.shutDown();
    q.add("c");
    q.addAfter("d", 0);
    expect(clock.pendingTimers).toBe(0);
    clock.advance(1000);
    expect(await q.get()).toBe("a");
    expect(await q.get()).toBe("b");
    expect(await q.get()).toBeUndefined();
  });
});

describe("metrics hooks", () => {
  test("report depth changes, accepted adds and retries", async () => {
    const depths: number[] = [];
    let added = 0;
    let retried = 0;
    const { q, clock } = queue({
      qps: Number.POSITIVE_INFINITY,
      metrics: { depth: (n) => depths.push(n), added: () => added++, retried: () => retried++ },
    });
    q.add("a");
    q.add("a"); // de-duplicated: not counted
    q.add("b");
    const k = (await q.get()) as string;
    q.addRateLimited(k);
    q.done(k);
    clock.advance(5);
    expect(depths).toEqual([1, 2, 1, 2]);
    expect(added).toBe(3); // a, b, and a again from the retry
    expect(retried).toBe(1);

    const late: number[] = [];
    const detach = q.addMetrics({ depth: (n) => late.push(n), added: () => {}, retried: () => {} });
    expect(late).toEqual([2]); // current depth reported on attach
    detach();
    q.add("c");
    expect(late).toEqual([2]);
  });
});
