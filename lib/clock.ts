// Time as a port: code that waits, schedules or timestamps takes a Clock from its constructor, so
// tests drive it with ManualClock instead of sleeping for real.

/** The time source and timer facility every component receives instead of the globals. */
export interface Clock {
  /** Milliseconds since the Unix epoch. Non-decreasing for ManualClock; wall time for realClock. */
  now(): number;
  /**
   * Resolves after `ms` milliseconds; `ms <= 0` resolves without a timer. With `signal`, rejects
   * with `signal.reason` as soon as it aborts (immediately when already aborted) and frees its timer.
   */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
  /**
   * Runs `fn` once after `ms` milliseconds (never synchronously, even for `ms <= 0`). Returns a
   * cancel function; cancelling twice or after the timer fired is a no-op.
   */
  setTimeout(fn: () => void, ms: number): () => void;
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("The operation was aborted.", "AbortError");
}

/** Shared sleep on top of a Clock's setTimeout, so both clocks abort the same way. */
function sleepWith(clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(abortReason(signal));
  if (ms <= 0) return Promise.resolve();
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      cancel();
      reject(abortReason(signal as AbortSignal));
    };
    const cancel = clock.setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The process clock: Date.now and the global timers. Stateless, so sharing it is safe. */
export const realClock: Clock = {
  now: () => Date.now(),
  sleep(ms, signal) {
    return sleepWith(realClock, ms, signal);
  },
  setTimeout(fn, ms) {
    const handle = globalThis.setTimeout(fn, Math.max(0, ms));
    return () => globalThis.clearTimeout(handle);
  },
};

interface Timer {
  due: number;
  seq: number;
  fn: () => void;
}

/**
 * A clock that moves only when a test calls advance(). Timers fire in due order (ties in creation
 * order), each with now() set to its due time. Not thread-safe in any sense beyond JS's one
 * thread; a timer callback that throws propagates out of advance() after the clock reached it.
 */
export class ManualClock implements Clock {
  #now: number;
  #seq = 0;
  // A sorted array is plenty: tests hold a handful of timers, and order must be exact.
  #timers: Timer[] = [];

  constructor(startMs = 0) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return sleepWith(this, ms, signal);
  }

  setTimeout(fn: () => void, ms: number): () => void {
    const timer: Timer = { due: this.#now + Math.max(0, ms), seq: this.#seq++, fn };
    // Insert after every timer due at or before this one, keeping creation order among equals.
    let i = this.#timers.length;
    while (i > 0 && (this.#timers[i - 1] as Timer).due > timer.due) i--;
    this.#timers.splice(i, 0, timer);
    return () => {
      const at = this.#timers.indexOf(timer);
      if (at >= 0) this.#timers.splice(at, 1);
    };
  }

  /** Timers scheduled and not yet fired or cancelled. */
  get pendingTimers(): number {
    return this.#timers.length;
  }

  /** The due time of the next timer, or undefined when none is pending. */
  nextDue(): number | undefined {
    return this.#timers[0]?.due;
  }

  /**
   * Moves time forward by `ms` (>= 0), firing every timer that falls due on the way, including
   * timers those callbacks schedule inside the window. Synchronous: promise continuations (such
   * as code after `await clock.sleep()`) run only after it returns; use advanceAsync for those.
   */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`ManualClock.advance: ms must be >= 0, got ${ms}`);
    const target = this.#now + ms;
    for (;;) {
      const next = this.#timers[0];
      if (next === undefined || next.due > target) break;
      this.#timers.shift();
      this.#now = next.due;
      next.fn();
    }
    this.#now = target;
  }

  /**
   * Like advance(), but lets the event loop run (one macrotask turn) before and after each timer,
   * so async code woken by a timer can schedule its next timer inside the same window.
   */
  async advanceAsync(ms: number): Promise<void> {
    if (!(ms >= 0)) throw new RangeError(`ManualClock.advanceAsync: ms must be >= 0, got ${ms}`);
    const target = this.#now + ms;
    await settle();
    for (;;) {
      const next = this.#timers[0];
      if (next === undefined || next.due > target) break;
      this.#timers.shift();
      this.#now = next.due;
      next.fn();
      await settle();
    }
    this.#now = target;
  }
}

/** One macrotask turn: every microtask queued so far (and those they queue) has run by then. */
export function settle(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
