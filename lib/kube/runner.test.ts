// Tests for runController: outcome handling (success, requeue, transient, terminal, garbage),
// worker survival, coalescing of bursts, stop semantics, log fields and metric values.

import { describe, expect, test } from "bun:test";
import { ManualClock, settle } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { createLogger, silentLogger } from "../log.ts";
import { Registry } from "../metrics.ts";
import { WorkQueue } from "./queue.ts";
import { KEY_FIELD, type Reconcile, type ReconcileContext, runController, TerminalError } from "./runner.ts";

type Line = Record<string, unknown> & { level: string; msg: string };

function setup(reconcile: Reconcile, opts: { workers?: number; name?: string; registry?: Registry } = {}) {
  const clock = new ManualClock(1_000_000);
  const registry = opts.registry ?? new Registry();
  const queue = new WorkQueue({ name: opts.name ?? "things", clock, qps: Number.POSITIVE_INFINITY });
  const lines: Line[] = [];
  const logger = createLogger({ level: "debug", sink: (l) => lines.push(JSON.parse(l)) });
  const ctl = runController({
    name: opts.name ?? "things",
    queue,
    workers: opts.workers ?? 2,
    reconcile,
    logger,
    registry,
    clock,
  });
  return { clock, registry, queue, lines, ctl };
}

/** Runs the event loop until `cond` holds; fails loudly instead of hanging. */
async function until(cond: () => boolean, what = "condition"): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (cond()) return;
    await settle();
  }
  throw new Error(`timed out waiting for ${what}`);
}

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const total = (r: Registry, result: string, controller = "things") =>
  r
    .counter({
      name: "distort_reconcile_total",
      help: "Reconcile attempts by result.",
      labelNames: ["controller", "result"],
      reuse: true,
    })
    .get({ controller, result });

const errorsOf = (r: Registry, kind: string, controller = "things") =>
  r
    .counter({
      name: "distort_reconcile_errors_total",
      help: "Failed reconciles by kind (transient: retried; terminal: dropped until the next change).",
      labelNames: ["controller", "kind"],
      reuse: true,
    })
    .get({ controller, kind });

describe("runController outcomes", () => {
  test("success forgets the key and counts success with its duration", async () => {
    const calls: Array<[string, number]> = [];
    let clockRef: ManualClock | undefined;
    const { queue, registry, ctl, clock } = setup(async (key, ctx) => {
      calls.push([key, ctx.attempt]);
      clockRef?.advance(250); // the reconcile "takes" 250 ms of clock time
    });
    clockRef = clock;
    queue.addRateLimited("ns/a"); // one earlier failure on record
    clock.advance(5);
    await until(() => calls.length === 1);
    await until(() => total(registry, "success") === 1);
    expect(calls).toEqual([["ns/a", 2]]);
    expect(queue.numRequeues("ns/a")).toBe(0);
    const text = registry.render();
    expect(text).toContain('distort_reconcile_duration_seconds_bucket{controller="things",le="0.25"} 1');
    expect(text).toContain('distort_reconcile_duration_seconds_bucket{controller="things",le="0.1"} 0');
    expect(text).toContain('distort_reconcile_duration_seconds_count{controller="things"} 1');
    expect(text).toContain('distort_reconcile_duration_seconds_sum{controller="things"} 0.25');
    await ctl.stop();
  });

  test("requeueAfterMs schedules the key again after that delay", async () => {
    const calls: number[] = [];
    const { queue, registry, ctl, clock } = setup(async () => {
      calls.push(clock.now());
      return calls.length === 1 ? { requeueAfterMs: 30_000 } : undefined;
    });
    queue.add("k");
    await until(() => calls.length === 1);
    clock.advance(29_999);
    await settle();
    expect(calls.length).toBe(1);
    clock.advance(1);
    await until(() => calls.length === 2);
    expect((calls[1] as number) - (calls[0] as number)).toBe(30_000);
    await until(() => total(registry, "success") === 1);
    expect(total(registry, "requeue")).toBe(1);
    expect(errorsOf(registry, "transient")).toBe(0);
    await ctl.stop();
  });

  test("transient failures retry with growing backoff and rising attempt; success resets it", async () => {
    const attempts: Array<[number, number]> = [];
    const { queue, registry, lines, ctl, clock } = setup(async (_key, ctx) => {
      attempts.push([ctx.attempt, clock.now()]);
      if (ctx.attempt < 4) throw new StorageError("unavailable", "spdk not answering");
    });
    const t0 = clock.now();
    queue.add("k");
    await until(() => attempts.length === 1);
    for (const step of [5, 10, 20]) {
      const before = attempts.length;
      clock.advance(step - 1);
      await settle();
      expect(attempts.length).toBe(before);
      clock.advance(1);
      await until(() => attempts.length === before + 1);
    }
    expect(attempts).toEqual([
      [1, t0],
      [2, t0 + 5],
      [3, t0 + 15],
      [4, t0 + 35],
    ]);
    await until(() => total(registry, "success") === 1);
    expect(total(registry, "error")).toBe(3);
    expect(errorsOf(registry, "transient")).toBe(3);
    expect(queue.numRequeues("k")).toBe(0);
    const warn = lines.find((l) => l.msg === "reconcile failed; retrying");
    expect(warn).toMatchObject({
      level: "warn",
      err: "spdk not answering",
      errKind: "unavailable",
      attempt: 1,
    });
    expect(registry.render()).toContain('distort_workqueue_retries_total{controller="things"} 3');
    await ctl.stop();
  });

  test("TerminalError forgets the key, logs an error, counts terminal, and never retries", async () => {
    let calls = 0;
    const { queue, registry, lines, ctl, clock } = setup(async () => {
      calls++;
      throw new TerminalError(new StorageError("invalid", "size must be a multiple of 4096"));
    });
    queue.addRateLimited("k"); // a prior failure, so we can see forget()
    clock.advance(5);
    await until(() => total(registry, "terminal") === 1);
    clock.advance(600_000);
    await settle();
    expect(calls).toBe(1);
    expect(queue.numRequeues("k")).toBe(0);
    expect(errorsOf(registry, "terminal")).toBe(1);
    expect(errorsOf(registry, "transient")).toBe(0);
    expect(lines.find((l) => l.level === "error")).toMatchObject({
      msg: "reconcile failed permanently; not retrying",
      err: "size must be a multiple of 4096",
      errKind: "invalid",
      key: "k",
    });
    await ctl.stop();
  });

  test("TerminalError wraps its cause and reuses its message", () => {
    const cause = new Error("bad spec");
    const t = new TerminalError(cause);
    expect([t.name, t.message, t.cause]).toEqual(["TerminalError", "bad spec", cause]);
    expect(new TerminalError("raw", "custom").message).toBe("custom");
  });

  test.each([
    [
      "throws synchronously",
      (() => {
        throw new Error("sync boom");
      }) as unknown as Reconcile,
    ],
    ["returns a number", (async () => 42) as unknown as Reconcile],
    ["returns a string", (() => "nope") as unknown as Reconcile],
    ["returns a negative requeue", (async () => ({ requeueAfterMs: -1 })) as Reconcile],
    ["returns a NaN requeue", (async () => ({ requeueAfterMs: Number.NaN })) as Reconcile],
    ["returns a non-number requeue", (async () => ({ requeueAfterMs: "5s" })) as unknown as Reconcile],
  ])("a reconcile that %s is retried and does not kill the only worker", async (_, bad) => {
    const seen: string[] = [];
    const { queue, registry, ctl } = setup(
      (key, ctx) => {
        seen.push(key);
        return key === "bad" ? bad(key, ctx) : Promise.resolve();
      },
      { workers: 1 },
    );
    queue.add("bad");
    queue.add("good");
    await until(() => seen.includes("good"), "the worker to survive");
    await until(() => total(registry, "success") === 1);
    expect(total(registry, "error")).toBe(1);
    expect(queue.numRequeues("bad")).toBe(1);
    await ctl.stop();
  });

  test("requeueAfterMs: 0 re-queues at once (after the current pass ends)", async () => {
    let calls = 0;
    const { queue, ctl } = setup(async () => {
      calls++;
      return calls < 3 ? { requeueAfterMs: 0 } : {};
    });
    queue.add("k");
    await until(() => calls === 3);
    await ctl.stop();
  });
});

describe("runController concurrency", () => {
  test("100 adds of one key during a slow reconcile yield at most 3 reconciles", async () => {
    const gate = deferred();
    let calls = 0;
    let concurrent = 0;
    let maxConcurrent = 0;
    const { queue, ctl } = setup(
      async () => {
        calls++;
        concurrent++;
        maxConcurrent = Math.max(maxConcurrent, concurrent);
        if (calls === 1) await gate.promise;
        concurrent--;
      },
      { workers: 4 },
    );
    queue.add("vol-1");
    await until(() => calls === 1);
    for (let i = 0; i < 100; i++) {
      queue.add("vol-1");
      if (i % 10 === 0) await settle();
    }
    gate.resolve();
    await until(() => calls >= 2 && concurrent === 0 && queue.length === 0);
    for (let i = 0; i < 5; i++) await settle();
    expect(calls).toBeLessThanOrEqual(3);
    expect(calls).toBeGreaterThanOrEqual(2); // the adds during the slow pass are not lost
    expect(maxConcurrent).toBe(1);
    await ctl.stop();
  });

  test("distinct keys run in parallel up to the worker count", async () => {
    const gate = deferred();
    let running = 0;
    let peak = 0;
    const { queue, ctl } = setup(
      async () => {
        running++;
        peak = Math.max(peak, running);
        await gate.promise;
        running--;
      },
      { workers: 3 },
    );
    for (const k of ["a", "b", "c", "d", "e"]) queue.add(k);
    await until(() => running === 3);
    await settle();
    expect(peak).toBe(3);
    expect(queue.length).toBe(2);
    gate.resolve();
    await until(() => running === 0 && queue.length === 0);
    await ctl.stop();
  });
});

describe("stop", () => {
  test("aborts ctx.signal, waits for in-flight reconciles, shuts the queue down, is idempotent", async () => {
    let ctxSeen: ReconcileContext | undefined;
    let finished = false;
    const { queue, registry, lines, ctl, clock } = setup(async (_key, ctx) => {
      ctxSeen = ctx;
      await clock.sleep(60_000, ctx.signal).catch(() => {});
      await settle();
      finished = true;
      throw new Error("cancelled");
    });
    queue.add("k");
    await until(() => ctxSeen !== undefined);
    expect(ctxSeen?.signal.aborted).toBe(false);
    const p1 = ctl.stop();
    const p2 = ctl.stop();
    expect(ctxSeen?.signal.aborted).toBe(true);
    expect(queue.shuttingDown).toBe(true);
    await Promise.all([p1, p2]);
    expect(finished).toBe(true);
    // A failure caused by stopping is not an error worth counting or retrying.
    expect(total(registry, "error")).toBe(0);
    expect(lines.some((l) => l.level === "error" || l.level === "warn")).toBe(false);
    expect(lines.at(-1)?.msg).toBe("controller stopped");
    queue.add("after");
    expect(queue.length).toBe(0);
  });

  test("keys still queued at stop are not reconciled", async () => {
    const gate = deferred();
    const seen: string[] = [];
    const { queue, ctl } = setup(
      async (key) => {
        seen.push(key);
        await gate.promise;
      },
      { workers: 1 },
    );
    queue.add("a");
    queue.add("b");
    queue.add("c");
    await until(() => seen.length === 1);
    const stopped = ctl.stop();
    gate.resolve();
    await stopped;
    expect(seen).toEqual(["a"]);
  });
});

describe("observability", () => {
  test("each reconcile logs with controller, the key and a fresh reconcileId", async () => {
    const ids: string[] = [];
    const { queue, lines, ctl } = setup(async (_key, ctx) => {
      ctx.log.info("working");
    });
    queue.add("ns/x");
    await until(() => lines.filter((l) => l.msg === "working").length === 1);
    queue.add("ns/x");
    await until(() => lines.filter((l) => l.msg === "working").length === 2);
    for (const l of lines.filter((l) => l.msg === "working")) {
      expect(l).toMatchObject({ controller: "things", [KEY_FIELD]: "ns/x" });
      expect(l.reconcileId).toMatch(/^[0-9a-f]{8}$/);
      ids.push(l.reconcileId as string);
    }
    expect(new Set(ids).size).toBe(2);
    await ctl.stop();
  });

  test("metrics start at zero, follow the queue, and two controllers share one registry", async () => {
    const registry = new Registry();
    const a = setup(async () => {}, { name: "claims", registry });
    const b = setup(async () => {}, { name: "partitions", registry });
    const text0 = registry.render();
    for (const result of ["success", "requeue", "error", "terminal"]) {
      expect(text0).toContain(`distort_reconcile_total{controller="claims",result="${result}"} 0`);
      expect(text0).toContain(`distort_reconcile_total{controller="partitions",result="${result}"} 0`);
    }
    expect(text0).toContain('distort_reconcile_errors_total{controller="claims",kind="terminal"} 0');
    expect(text0).toContain('distort_workqueue_depth{controller="claims"} 0');
    a.queue.add("x");
    a.queue.add("y");
    await until(() => total(registry, "success", "claims") === 2);
    const text = registry.render();
    expect(text).toContain('distort_workqueue_adds_total{controller="claims"} 2');
    expect(text).toContain('distort_workqueue_adds_total{controller="partitions"} 0');
    expect(text).toContain('distort_workqueue_depth{controller="claims"} 0');
    expect(text.match(/^# TYPE distort_reconcile_duration_seconds histogram$/gm)?.length).toBe(1);
    await Promise.all([a.ctl.stop(), b.ctl.stop()]);
  });

  test("depth gauge reflects keys waiting for a busy worker", async () => {
    const gate = deferred();
    const { queue, registry, ctl } = setup(() => gate.promise, { workers: 1 });
    for (const k of ["a", "b", "c"]) queue.add(k);
    await until(() => queue.length === 2);
    expect(registry.render()).toContain('distort_workqueue_depth{controller="things"} 2');
    gate.resolve();
    await until(() => queue.length === 0);
    await ctl.stop();
  });

  test("a logger that throws does not kill the worker", async () => {
    const queue = new WorkQueue({ name: "q" });
    const logged: string[] = [];
    const logger = createLogger({
      level: "debug",
      sink: (line) => {
        const { msg } = JSON.parse(line) as { msg: string };
        if (msg === "reconciled") throw new Error("sink full");
        logged.push(msg);
      },
    });
    const seen: string[] = [];
    const ctl = runController({
      name: "x",
      queue,
      workers: 1,
      reconcile: async (key) => {
        seen.push(key);
      },
      logger,
    });
    queue.add("a");
    queue.add("b");
    await until(() => seen.length === 2);
    expect(logged.filter((m) => m === "worker bookkeeping failed").length).toBeGreaterThanOrEqual(1);
    await ctl.stop();
  });

  test("works without a registry and rejects a bad worker count", async () => {
    const queue = new WorkQueue({ name: "q" });
    expect(() =>
      runController({ name: "x", queue, workers: 0, reconcile: async () => {}, logger: silentLogger }),
    ).toThrow(/workers must be an integer >= 1/);
    let n = 0;
    const ctl = runController({
      name: "x",
      queue,
      workers: 1,
      reconcile: async () => {
        n++;
      },
      logger: silentLogger,
    });
    queue.add("k");
    await until(() => n === 1);
    await ctl.stop();
  });
});
