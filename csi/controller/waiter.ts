// Waiting for the cluster to reach a state, driven by a watch: a check runs on the cached object
// now and again on every watch event for its key, never on a timer. Plus the wait budget of an
// RPC: its deadline minus a margin, so the answer leaves before the caller gives up on it.
import type { Clock } from "../../lib/clock.ts";
import { StorageError } from "../../lib/errors.ts";
import type { WatchCache } from "../../lib/kube/cache.ts";
import { type KubeObject, objectKey } from "../../lib/kube/resource.ts";

/**
 * Wakes waiters registered on a WatchCache key. One per cache; registering it adds one handler to
 * the cache for good, so create it once per controller, not per call.
 */
export class CacheWaiter<T extends KubeObject> {
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(private readonly cache: WatchCache<T>) {
    const wake = (o: T) => {
      for (const w of this.waiters.get(objectKey(o.metadata)) ?? []) w();
    };
    cache.on({ add: wake, update: (_old, o) => wake(o), delete: wake });
  }

  /**
   * Resolves with the first value other than undefined that `check` returns for the cached object
   * (undefined when the cache holds none under `key`), evaluated at once and after each watch event
   * on `key`. A throw from `check` rejects with it; `signal` aborting rejects with its reason.
   * The cache may trail the API server: checks must treat "absent" and stale states as "not yet"
   * unless the caller confirms them against the server.
   */
  waitFor<R>(key: string, check: (obj: T | undefined) => R | undefined, signal: AbortSignal): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      let set = this.waiters.get(key);
      if (!set) {
        set = new Set();
        this.waiters.set(key, set);
      }
      const entry = set;
      const cleanup = () => {
        entry.delete(evaluate);
        if (entry.size === 0 && this.waiters.get(key) === entry) this.waiters.delete(key);
        signal.removeEventListener("abort", onAbort);
      };
      const evaluate = () => {
        try {
          const r = check(this.cache.get(key));
          if (r === undefined) return;
          cleanup();
          resolve(r);
        } catch (err) {
          cleanup();
          reject(err);
        }
      };
      const onAbort = () => {
        cleanup();
        reject(signal.reason);
      };
      if (signal.aborted) {
        reject(signal.reason);
        return;
      }
      entry.add(evaluate);
      signal.addEventListener("abort", onAbort, { once: true });
      evaluate();
    });
  }

  /** Keys with at least one waiter (tests use it to see a call has reached its wait). */
  waitingKeys(): string[] {
    return [...this.waiters.keys()];
  }
}

/** What a handler needs of Connect's HandlerContext. */
export interface CallContext {
  signal: AbortSignal;
  /** Milliseconds left until the caller's deadline; undefined when it sent none. */
  timeoutMs(): number | undefined;
}

/** The marker reason of a budget that ran out (as opposed to a cancelled call). */
class BudgetExpired extends Error {}

export interface WaitBudget {
  /** Aborts when the budget runs out or the call is cancelled. */
  readonly signal: AbortSignal;
  /** Milliseconds granted at the start. */
  readonly ms: number;
  /** Frees the timer; call in finally. */
  dispose(): void;
}

/**
 * The time a handler may spend waiting: the caller's deadline less a margin (a tenth, at most one
 * second) so the reply is on the wire before the deadline, or `defaultMs` when there is none.
 */
export function waitBudget(ctx: CallContext, clock: Clock, defaultMs: number): WaitBudget {
  const remaining = ctx.timeoutMs();
  const ms =
    remaining === undefined ? defaultMs : Math.max(0, remaining - Math.min(1000, Math.floor(remaining / 10)));
  const ctl = new AbortController();
  const cancel = clock.setTimeout(() => ctl.abort(new BudgetExpired("wait budget exhausted")), ms);
  const onCallAbort = () => ctl.abort(ctx.signal.reason);
  if (ctx.signal.aborted) onCallAbort();
  else ctx.signal.addEventListener("abort", onCallAbort, { once: true });
  return {
    signal: ctl.signal,
    ms,
    dispose() {
      cancel();
      ctx.signal.removeEventListener("abort", onCallAbort);
    },
  };
}

/**
 * Runs a wait under a budget. When the budget runs out, throws StorageError("timeout") with the
 * message `onTimeout()` composes from what was last seen (DEADLINE_EXCEEDED: the CO retries the
 * same idempotent call); a cancelled call rethrows the cancellation.
 */
export async function withBudget<R>(
  ctx: CallContext,
  clock: Clock,
  defaultMs: number,
  wait: (signal: AbortSignal) => Promise<R>,
  onTimeout: () => string,
): Promise<R> {
  const budget = waitBudget(ctx, clock, defaultMs);
  try {
    return await wait(budget.signal);
  } catch (err) {
    if (err instanceof BudgetExpired) {
      throw new StorageError("timeout", `${onTimeout()} (waited ${budget.ms} ms)`);
    }
    throw err;
  } finally {
    budget.dispose();
  }
}
