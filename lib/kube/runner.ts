// The reconcile loop: N workers take keys from a WorkQueue, call reconcile, and turn its outcome
// into forget / requeue-after / rate-limited retry, with logs and metrics for every attempt.

import { type Clock, realClock } from "../clock.ts";
import { errorMessage, StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { WorkQueue } from "./queue.ts";

/**
 * A reconcile failure that retrying cannot fix (invalid spec, unsupported request): the runner
 * logs it, counts it and forgets the key until something adds it again. The message defaults to
 * the cause's message; the cause is kept for logs.
 */
export class TerminalError extends Error {
  override readonly name = "TerminalError";

  constructor(cause: unknown, message?: string) {
    super(message ?? errorMessage(cause), { cause });
  }
}

/** What reconcile receives besides the key. */
export interface ReconcileContext {
  /** Aborted when the controller stops; pass it to every wait and request. */
  signal: AbortSignal;
  /** Carries controller, the key (as KEY_FIELD) and reconcileId. */
  log: Logger;
  /** 1 on the first try after a success (or ever), then 1 + consecutive failures. */
  attempt: number;
}

/** Reconcile one key. Resolve (optionally asking for a requeue), throw to retry, or throw TerminalError. */
// biome-ignore lint/suspicious/noConfusingVoidType: void lets a plain `async () => {}` be a Reconcile.
export type Reconcile = (key: string, ctx: ReconcileContext) => Promise<{ requeueAfterMs?: number } | void>;

export interface ControllerOptions {
  /** Controller name: the `controller` label and log field. */
  name: string;
  /** The runner owns it from now on: stop() shuts it down. */
  queue: WorkQueue;
  /** Concurrent reconciles; an integer >= 1. One key is never reconciled twice at once regardless. */
  workers: number;
  reconcile: Reconcile;
  logger: Logger;
  /** When given, the metrics below are registered on it (shared by all controllers). */
  registry?: Registry;
  /** For reconcile durations; defaults to realClock. */
  clock?: Clock;
  /** Correlation id per reconcile; defaults to 8 random hex digits. */
  newId?: () => string;
}

export interface Controller {
  /**
   * Shuts the queue down, aborts every ctx.signal, and resolves once all in-flight reconciles have
   * settled and all workers exited (a reconcile that ignores its signal delays this). Idempotent.
   */
  stop(): Promise<void>;
}

/** Log field carrying the queue key (lib/log.ts redacts apiKey-like names, not a bare "key"). */
export const KEY_FIELD = "key";

type Result = "success" | "requeue" | "error" | "terminal";
const RESULTS: readonly Result[] = ["success", "requeue", "error", "terminal"];
/** Reconciles span sub-millisecond cache hits to minute-long SPDK operations. */
const DURATION_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** The work-queue and reconcile families every controller runner shares (registered with reuse). */
export function controllerMetrics(registry: Registry) {
  const c = ["controller"] as const;
  return {
    depth: registry.gauge({
      name: "distort_workqueue_depth",
      help: "Keys waiting in the work queue.",
      labelNames: c,
      reuse: true,
    }),
    adds: registry.counter({
      name: "distort_workqueue_adds_total",
      help: "Keys added to the work queue (de-duplicated adds excluded).",
      labelNames: c,
      reuse: true,
    }),
    retries: registry.counter({
      name: "distort_workqueue_retries_total",
      help: "Rate-limited retries scheduled by the work queue.",
      labelNames: c,
      reuse: true,
    }),
    reconciles: registry.counter({
      name: "distort_reconcile_total",
      help: "Reconcile attempts by result.",
      labelNames: ["controller", "result"] as const,
      reuse: true,
    }),
    errors: registry.counter({
      name: "distort_reconcile_errors_total",
      help: "Failed reconciles by kind (transient: retried; terminal: dropped until the next change).",
      labelNames: ["controller", "kind"] as const,
      reuse: true,
    }),
    duration: registry.histogram({
      name: "distort_reconcile_duration_seconds",
      help: "Time spent in reconcile.",
      labelNames: c,
      buckets: DURATION_BUCKETS,
      reuse: true,
    }),
  };
}

/** Reads a reconcile result; undefined means "not a result we understand". */
function parseResult(res: unknown): { requeueAfterMs?: number } | undefined {
  if (res === undefined || res === null) return {};
  if (typeof res !== "object") return undefined;
  const after = (res as { requeueAfterMs?: unknown }).requeueAfterMs;
  if (after === undefined) return {};
  if (typeof after !== "number" || !Number.isFinite(after) || after < 0) return undefined;
  return { requeueAfterMs: after };
}

/** A short, never-throwing rendering of an arbitrary value for a log line. */
function describe(value: unknown): string {
  try {
    return (JSON.stringify(value) ?? String(value)).slice(0, 200);
  } catch {
    return typeof value;
  }
}

function errorFields(err: unknown): Record<string, unknown> {
  const root = err instanceof TerminalError ? err.cause : err;
  const fields: Record<string, unknown> = { err: errorMessage(err) };
  if (root instanceof StorageError) {
    fields.errKind = root.kind;
    if (Object.keys(root.details).length > 0) fields.errDetails = root.details;
  }
  return fields;
}

/**
 * Starts `workers` workers on `queue` and returns at once. Outcomes per reconcile:
 * - resolves with nothing: forget(key), result "success";
 * - resolves with { requeueAfterMs }: forget(key), addAfter(key, ms), result "requeue";
 * - throws TerminalError: forget(key), logged at error, result "terminal", no retry;
 * - throws anything else, or resolves with something unreadable: addRateLimited(key), result "error".
 * A reconcile that throws synchronously is handled like a rejection; nothing a reconcile does can
 * end a worker. Failures after stop() began are logged at debug and not counted. Throws
 * StorageError("invalid") when `workers` is not an integer >= 1.
 */
export function runController(opts: ControllerOptions): Controller {
  const { name, queue, reconcile, logger } = opts;
  if (!Number.isInteger(opts.workers) || opts.workers < 1) {
    throw new StorageError(
      "invalid",
      `controller ${name}: workers must be an integer >= 1, got ${opts.workers}`,
    );
  }
  const clock = opts.clock ?? realClock;
  const newId = opts.newId ?? (() => crypto.randomUUID().slice(0, 8));
  const log = logger.with({ controller: name });
  const abort = new AbortController();
  const labels = { controller: name };

  const m = opts.registry ? controllerMetrics(opts.registry) : undefined;
  let detach = () => {};
  if (m) {
    // Touch every series so dashboards see zeros (and rate() has a baseline) before the first event.
    for (const result of RESULTS) m.reconciles.inc({ controller: name, result }, 0);
    m.errors.inc({ controller: name, kind: "transient" }, 0);
    m.errors.inc({ controller: name, kind: "terminal" }, 0);
    m.adds.inc(labels, 0);
    m.retries.inc(labels, 0);
    detach = queue.addMetrics({
      depth: (n) => m.depth.set(labels, n),
      added: () => m.adds.inc(labels),
      retried: () => m.retries.inc(labels),
    });
  }

  const count = (result: Result, startedMs: number) => {
    if (!m) return;
    m.reconciles.inc({ controller: name, result });
    if (result === "error") m.errors.inc({ controller: name, kind: "transient" });
    if (result === "terminal") m.errors.inc({ controller: name, kind: "terminal" });
    m.duration.observe(labels, Math.max(0, clock.now() - startedMs) / 1000);
  };

  const processOne = async (key: string): Promise<void> => {
    const attempt = queue.numRequeues(key) + 1;
    const rlog = log.with({ [KEY_FIELD]: key, reconcileId: newId() });
    const started = clock.now();
    try {
      let raw: unknown;
      try {
        raw = await reconcile(key, { signal: abort.signal, log: rlog, attempt });
      } catch (err) {
        if (abort.signal.aborted) {
          rlog.debug("reconcile ended by stop", errorFields(err));
          return;
        }
        if (err instanceof TerminalError) {
          queue.forget(key);
          rlog.error("reconcile failed permanently; not retrying", { attempt, ...errorFields(err) });
          count("terminal", started);
          return;
        }
        const delayMs = queue.addRateLimited(key);
        rlog.warn("reconcile failed; retrying", {
          attempt,
          retryInMs: Math.round(delayMs),
          ...errorFields(err),
        });
        count("error", started);
        return;
      }
      const res = parseResult(raw);
      if (res === undefined) {
        // We cannot tell whether the work is done, so retry rather than drop the key.
        const delayMs = queue.addRateLimited(key);
        rlog.error("reconcile returned an unreadable result; retrying", {
          attempt,
          result: describe(raw),
          retryInMs: Math.round(delayMs),
        });
        count("error", started);
        return;
      }
      queue.forget(key);
      const durationMs = clock.now() - started;
      if (res.requeueAfterMs !== undefined) {
        queue.addAfter(key, res.requeueAfterMs);
        rlog.debug("reconciled; requeue requested", { durationMs, requeueAfterMs: res.requeueAfterMs });
        count("requeue", started);
      } else {
        rlog.debug("reconciled", { durationMs });
        count("success", started);
      }
    } finally {
      queue.done(key);
    }
  };

  const worker = async (): Promise<void> => {
    for (;;) {
      const key = await queue.get();
      if (key === undefined) return;
      if (abort.signal.aborted) {
        // Drain without reconciling: the queue hands out what was queued before shutdown.
        queue.done(key);
        continue;
      }
      try {
        await processOne(key);
      } catch (err) {
        // Only logging or metrics can land here (a bad hook or sink); keep the worker alive, even
        // if the logger is what broke.
        try {
          log.error("worker bookkeeping failed", { [KEY_FIELD]: key, err: errorMessage(err) });
        } catch {}
      }
    }
  };

  log.info("controller starting", { workers: opts.workers });
  const workers = Array.from({ length: opts.workers }, () => worker());
  let stopping: Promise<void> | undefined;

  return {
    stop() {
      stopping ??= (async () => {
        log.info("controller stopping");
        queue.shutDown();
        abort.abort(new StorageError("unavailable", `controller ${name} is stopping`));
        await Promise.allSettled(workers);
        detach();
        log.info("controller stopped");
      })();
      return stopping;
    },
  };
}
