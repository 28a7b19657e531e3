// Facts about the running SPDK target that every export's pass would otherwise re-check (drive
// attached, lvstore loaded, transport created, no DH-CHAP key left over): verified once per target
// incarnation and reused until the connection changes, they expire, or someone forgets them.
import { type Clock, realClock } from "../clock.ts";
import type { SpdkRpc } from "./client.ts";

/** What TargetFacts checks over and how long it trusts a check. */
export interface TargetFactsOptions {
  /** The connection facts are checked over; its connectionGeneration marks the incarnation. */
  rpc: SpdkRpc;
  clock?: Clock;
  /**
   * Longest a fact is reused. It bounds how long drift that no failing call reveals (an operator
   * changing the target by hand) goes unnoticed. Default 30000.
   */
  ttlMs?: number;
}

interface Known {
  value: unknown;
  generation: number;
  at: number;
}

interface Running {
  promise: Promise<unknown>;
}

/**
 * A cache of verified facts about one SPDK target, keyed by what they are about.
 *
 * A fact is reused only while the connection it was verified over is still the established one
 * (a restarted target is always a new connection), for at most ttlMs, and until forget() drops
 * it; with an SpdkRpc that reports no connectionGeneration nothing is ever reused. A check that
 * fails records nothing. Concurrent callers of one key share one check. A check still running
 * when its key is forgotten is not recorded, so a recorded fact was always checked after the
 * last forget() of its key returned.
 */
export class TargetFacts {
  readonly #rpc: SpdkRpc;
  readonly #clock: Clock;
  readonly #ttlMs: number;
  readonly #known = new Map<string, Known>();
  readonly #running = new Map<string, Running>();

  constructor(opts: TargetFactsOptions) {
    this.#rpc = opts.rpc;
    this.#clock = opts.clock ?? realClock;
    this.#ttlMs = opts.ttlMs ?? 30_000;
  }

  /** True when fact `key` is recorded and may be reused now. */
  known(key: string): boolean {
    const k = this.#known.get(key);
    if (!k) return false;
    if (k.generation === this.#rpc.connectionGeneration && this.#clock.now() - k.at < this.#ttlMs)
      return true;
    this.#known.delete(key);
    return false;
  }

  /**
   * The value of fact `key`: the recorded one when known(key), else what `check` resolves with
   * (or the outcome of the check of `key` already running). `check` verifies or establishes the
   * fact against the target and must be safe to run again at any time. Its rejection is passed
   * through. Its value is recorded only when every call it made went over one connection.
   */
  verified<T>(key: string, check: () => Promise<T>): Promise<T> {
    if (this.known(key)) return Promise.resolve((this.#known.get(key) as Known).value as T);
    const running = this.#running.get(key);
    if (running) return running.promise as Promise<T>;
    const run: Running = { promise: Promise.resolve() };
    const promise = this.#check(key, run, check).finally(() => {
      if (this.#running.get(key) === run) this.#running.delete(key);
    });
    run.promise = promise;
    this.#running.set(key, run);
    return promise;
  }

  async #check<T>(key: string, run: Running, check: () => Promise<T>): Promise<T> {
    // A connection not yet established when the check starts may be a different one from the
    // one it ends on; only a check bracketed by one generation describes one incarnation.
    const before = this.#rpc.connectionGeneration;
    const value = await check();
    const after = this.#rpc.connectionGeneration;
    if (after !== undefined && after === before && this.#running.get(key) === run) {
      this.#known.set(key, { value, generation: after, at: this.#clock.now() });
    }
    return value;
  }

  /** Drops fact `key`, or every fact; the next verified() of it checks again. */
  forget(key?: string): void {
    if (key === undefined) {
      this.#known.clear();
      this.#running.clear();
      return;
    }
    this.#known.delete(key);
    this.#running.delete(key);
  }

  /**
   * Runs `fn` and passes its outcome through; when it fails, every fact is forgotten first, since
   * a failure may be the first sign that the target no longer is what the facts describe.
   */
  async forgetOnError<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      this.forget();
      throw err;
    }
  }
}
