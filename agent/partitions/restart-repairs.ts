// Which export repairs a known target restart explains. A restarted nvmf_tgt has lost every
// export, so each partition exported on it is repaired by its next pass; those expected repairs
// are counted into one summary per restart, while a repair outside that replay is drift.
import type { Clock } from "../../lib/clock.ts";
import type { BackendName } from "../backends/types.ts";

/** What the replay after one target restart did. */
export interface RestartSummary {
  backend: BackendName;
  /** Partitions exported on the backend when it restarted. */
  exports: number;
  /** Of those, how many a pass has verified since (repaired or found intact). */
  verified: number;
  /** Of the verified ones, how many had to be repaired. */
  repaired: number;
  /** Neither verified nor gone when the summary was made: 0 unless the deadline cut it short. */
  unverified: number;
  /** From the restart to the last verification, or to the deadline. */
  seconds: number;
}

/** Where RestartRepairs gets time from and sends its summaries. */
export interface RestartRepairsOptions {
  clock: Clock;
  /**
   * A replay not finished this long after its restart is summarized anyway, with the exports
   * still unverified counted as such (their passes keep failing and report themselves). Default
   * 300000.
   */
  deadlineMs?: number;
  /** Receives each summary once; called synchronously, so it must not throw. */
  onSummary(summary: RestartSummary): void;
}

interface Window {
  backend: BackendName;
  startedAt: number;
  exports: number;
  pending: Set<string>;
  verified: number;
  repaired: number;
  cancelDeadline: () => void;
}

/**
 * Tracks the replay after a target restart. One window at a time: a restart while a replay is
 * still running summarizes that one first. Keys are partition keys (namespace/name).
 */
export class RestartRepairs {
  readonly #o: RestartRepairsOptions;
  #window: Window | undefined;

  constructor(o: RestartRepairsOptions) {
    this.#o = o;
  }

  /**
   * The target of `backend` restarted with the partitions `exported` exported on it: their next
   * verification is expected to repair their exports. With none, nothing is tracked or reported.
   */
  begin(backend: BackendName, exported: Iterable<string>): void {
    this.#finish();
    const pending = new Set(exported);
    if (pending.size === 0) return;
    this.#window = {
      backend,
      startedAt: this.#o.clock.now(),
      exports: pending.size,
      pending,
      verified: 0,
      repaired: 0,
      cancelDeadline: this.#o.clock.setTimeout(() => this.#finish(), this.#o.deadlineMs ?? 300_000),
    };
  }

  /**
   * A pass of partition `key` on `backend` verified its export, `repaired` telling whether it had
   * to repair it. True when a known restart explains the repair: the partition was exported on
   * the restarted target and this is its first verification since. The last one awaited makes
   * the summary.
   */
  verified(key: string, backend: BackendName, repaired: boolean): boolean {
    const w = this.#window;
    if (!w || w.backend !== backend || !w.pending.delete(key)) return false;
    w.verified++;
    if (repaired) w.repaired++;
    if (w.pending.size === 0) this.#finish();
    return true;
  }

  /** Partition `key` is no longer exported (deleted, deprovisioned): the replay stops awaiting it. */
  dropped(key: string): void {
    const w = this.#window;
    if (w?.pending.delete(key) && w.pending.size === 0) this.#finish();
  }

  /** Stops tracking without a summary (the agent is stopping; an unfinished count would mislead). */
  close(): void {
    this.#window?.cancelDeadline();
    this.#window = undefined;
  }

  #finish(): void {
    const w = this.#window;
    if (!w) return;
    this.#window = undefined;
    w.cancelDeadline();
    this.#o.onSummary({
      backend: w.backend,
      exports: w.exports,
      verified: w.verified,
      repaired: w.repaired,
      unverified: w.pending.size,
      seconds: (this.#o.clock.now() - w.startedAt) / 1000,
    });
  }
}
