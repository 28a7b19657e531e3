// A rate-limited, de-duplicating work queue with client-go's workqueue semantics: a key waits at
// most once, is never handed to two workers at once, and retries back off per key and overall.

import { type Clock, realClock } from "../clock.ts";
import { StorageError } from "../errors.ts";

/** Callbacks for instrumentation, so the queue needs no metrics library. Must not throw. */
export interface WorkQueueMetrics {
  /** Number of keys queued and not yet handed out; called whenever it changes. */
  depth(n: number): void;
  /** A key entered the queue (a de-duplicated add does not count). */
  added(): void;
  /** addRateLimited was called (a retry was scheduled). */
  retried(): void;
}

export interface WorkQueueOptions {
  /** Identifies the queue in errors and metrics. */
  name: string;
  /** First retry delay per key; doubles with every consecutive failure. Default 5 ms. */
  baseDelayMs?: number;
  /** Cap on the per-key delay. Default 300 000 ms (5 min). */
  maxDelayMs?: number;
  /** Overall retry rate (token bucket refill per second), shared by all keys. Default 10. */
  qps?: number;
  /** Token bucket size: retries allowed back to back before qps applies. Default 100. */
  burst?: number;
  clock?: Clock;
  metrics?: WorkQueueMetrics;
}

/**
 * client-go's workqueue.TypedRateLimitingInterface in one class (the default controller rate
 * limiter: max of per-key exponential backoff and a global token bucket).
 *
 * Invariants: a key added N times while waiting is queued once; a key being processed (between
 * get() and done()) is never handed out again until done(), and an add during processing marks it
 * dirty so done() re-queues it once; distinct keys come out in the order they were queued.
 * Everything is synchronous except get(), so there are no races between callers on JS's one
 * thread. Constructor options out of range throw StorageError("invalid").
 */
export class WorkQueue {
  readonly name: string;
  readonly #baseDelayMs: number;
  readonly #maxDelayMs: number;
  readonly #qps: number;
  readonly #burst: number;
  readonly #clock: Clock;
  readonly #hooks: WorkQueueMetrics[] = [];

  /** FIFO of keys waiting for a worker. Head index instead of shift() keeps get() O(1). */
  #queue: string[] = [];
  #head = 0;
  /** Keys that need processing: queued ones, plus processing ones added again. */
  #dirty = new Set<string>();
  #processing = new Set<string>();
  /** Pending addAfter timers, one per key (the earliest deadline wins). */
  #waiting = new Map<string, { due: number; cancel: () => void }>();
  #getters: Array<(key: string | undefined) => void> = [];
  #failures = new Map<string, number>();
  #tokens: number;
  #tokensAt: number;
  #shuttingDown = false;

  constructor(opts: WorkQueueOptions) {
    this.name = opts.name;
    this.#baseDelayMs = opts.baseDelayMs ?? 5;
    this.#maxDelayMs = opts.maxDelayMs ?? 300_000;
    this.#qps = opts.qps ?? 10;
    this.#burst = opts.burst ?? 100;
    this.#clock = opts.clock ?? realClock;
    if (opts.metrics) this.#hooks.push(opts.metrics);
    const bad = (what: string) => new StorageError("invalid", `work queue ${opts.name}: ${what}`);
    if (!(this.#baseDelayMs >= 0 && Number.isFinite(this.#baseDelayMs)))
      throw bad("baseDelayMs must be >= 0");
    if (!(this.#maxDelayMs >= this.#baseDelayMs)) throw bad("maxDelayMs must be >= baseDelayMs");
    if (!(this.#qps > 0)) throw bad("qps must be > 0 (Infinity disables the bucket)");
    if (!(this.#burst >= 1 && Number.isFinite(this.#burst))) throw bad("burst must be >= 1");
    this.#tokens = this.#burst;
    this.#tokensAt = this.#clock.now();
  }

  /**
   * Adds hooks after construction (the runner instruments a queue it was handed). Reports the
   * current depth at once. Returns a function that detaches them.
   */
  addMetrics(hooks: WorkQueueMetrics): () => void {
    this.#hooks.push(hooks);
    hooks.depth(this.length);
    return () => {
      const i = this.#hooks.indexOf(hooks);
      if (i >= 0) this.#hooks.splice(i, 1);
    };
  }

  /** Queues `key` unless it is already waiting. Ignored after shutDown(). */
  add(key: string): void {
    if (this.#shuttingDown || this.#dirty.has(key)) return;
    this.#dirty.add(key);
    for (const h of this.#hooks) h.added();
    // A key being processed stays out of the FIFO; done() puts it back, keeping one worker per key.
    if (this.#processing.has(key)) return;
    this.#push(key);
  }

  /**
   * Adds `key` after `ms` (immediately when ms <= 0). If the key already has a pending delayed add,
   * the earlier deadline is kept. Delayed keys do not count in `length`. Ignored after shutDown().
   */
  addAfter(key: string, ms: number): void {
    if (this.#shuttingDown) return;
    if (!(ms > 0)) {
      this.add(key);
      return;
    }
    const due = this.#clock.now() + ms;
    const pending = this.#waiting.get(key);
    if (pending) {
      if (pending.due <= due) return;
      pending.cancel();
    }
    const cancel = this.#clock.setTimeout(() => {
      this.#waiting.delete(key);
      this.add(key);
    }, ms);
    this.#waiting.set(key, { due, cancel });
  }

  /**
   * Schedules a retry: delay = max(baseDelay * 2^failures capped at maxDelay, token-bucket wait),
   * then counts the failure. Like client-go, the bucket token is consumed even when the per-key
   * backoff is the longer wait. Returns the delay chosen (for logs).
   */
  addRateLimited(key: string): number {
    if (this.#shuttingDown) return 0;
    const failures = this.#failures.get(key) ?? 0;
    this.#failures.set(key, failures + 1);
    // 2^failures overflows to Infinity past ~1023; Math.min caps it either way.
    const backoff = Math.min(this.#maxDelayMs, this.#baseDelayMs * 2 ** failures);
    const delay = Math.max(backoff, this.#reserveToken());
    for (const h of this.#hooks) h.retried();
    this.addAfter(key, delay);
    return delay;
  }

  /** Resets the failure count of `key` (call after a success). Does not touch queued adds. */
  forget(key: string): void {
    this.#failures.delete(key);
  }

  /** Failures counted by addRateLimited since the last forget(). */
  numRequeues(key: string): number {
    return this.#failures.get(key) ?? 0;
  }

  /**
   * The next key, marked as processing; the caller must call done(key) when finished. Waits while
   * the queue is empty. After shutDown() it still hands out what was queued, then resolves
   * undefined (at once for getters already waiting). Waiting getters are served in call order.
   */
  get(): Promise<string | undefined> {
    const key = this.#take();
    if (key !== undefined || this.#shuttingDown) return Promise.resolve(key);
    return new Promise((resolve) => this.#getters.push(resolve));
  }

  /**
   * Ends processing of `key`. If it was added again meanwhile it is re-queued (at the tail).
   * Calling done for a key that is not processing is a no-op.
   */
  done(key: string): void {
    if (!this.#processing.delete(key)) return;
    if (this.#dirty.has(key)) this.#push(key);
  }

  /** Keys queued and not yet handed out (excludes processing keys and pending addAfter). */
  get length(): number {
    return this.#queue.length - this.#head;
  }

  get shuttingDown(): boolean {
    return this.#shuttingDown;
  }

  /**
   * Stops accepting adds, cancels delayed adds (so no timer outlives the queue) and resolves
   * waiting getters with undefined. Keys already queued can still be drained with get().
   * Idempotent.
   */
  shutDown(): void {
    if (this.#shuttingDown) return;
    this.#shuttingDown = true;
    for (const { cancel } of this.#waiting.values()) cancel();
    this.#waiting.clear();
    const getters = this.#getters;
    this.#getters = [];
    for (const resolve of getters) resolve(undefined);
  }

  #push(key: string): void {
    const getter = this.#getters.shift();
    if (getter) {
      // Hand the key over directly: marking it processing now means no other get() can win it
      // between this resolve and the waiter's continuation.
      this.#dirty.delete(key);
      this.#processing.add(key);
      getter(key);
      return;
    }
    this.#queue.push(key);
    this.#reportDepth();
  }

  #take(): string | undefined {
    if (this.#head >= this.#queue.length) return undefined;
    const key = this.#queue[this.#head] as string;
    this.#head++;
    // Compact occasionally so a long-lived queue does not grow without bound.
    if (this.#head > 1024 && this.#head * 2 > this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#head = 0;
    }
    this.#dirty.delete(key);
    this.#processing.add(key);
    this.#reportDepth();
    return key;
  }

  #reportDepth(): void {
    const n = this.length;
    for (const h of this.#hooks) h.depth(n);
  }

  /** golang.org/x/time/rate Reserve().Delay(): take a token, possibly going into debt. */
  #reserveToken(): number {
    if (this.#qps === Number.POSITIVE_INFINITY) return 0;
    const now = this.#clock.now();
    const elapsed = Math.max(0, now - this.#tokensAt);
    this.#tokens = Math.min(this.#burst, this.#tokens + (elapsed * this.#qps) / 1000);
    this.#tokensAt = now;
    this.#tokens -= 1;
    return this.#tokens >= 0 ? 0 : (-this.#tokens / this.#qps) * 1000;
  }
}
