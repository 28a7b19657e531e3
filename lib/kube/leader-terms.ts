// Controllers that run only while this process leads: each leadership term starts them afresh
// (new caches, new state) and ends them the moment the Lease is lost, as controller-runtime's
// Manager does for leader-elected runnables. Without election, one term runs until stop().
import type { Clock } from "../clock.ts";
import { errorMessage } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { KubeConnection } from "./connection.ts";
import { type LeaderElectionOptions, LeaderElector } from "./leader.ts";

/** What one term started; stop() must wait for in-flight work and be idempotent. */
export interface Term {
  stop(): Promise<void>;
}

export interface LeaderTermsOptions {
  conn: KubeConnection;
  clock: Clock;
  logger: Logger;
  /** The Lease to hold; undefined runs one term at once, unconditionally. */
  election?: Omit<LeaderElectionOptions, "clock" | "logger" | "onStartedLeading" | "onStoppedLeading">;
  /**
   * Starts a term; resolves once its controllers run. `signal` aborts when leadership is lost (or
   * on stop), possibly before it resolves. A rejection not caused by the abort is logged and ends
   * the term; with election the process keeps campaigning.
   */
  start(signal: AbortSignal): Promise<Term>;
  /** Called with true when a term begins, false when it has fully stopped (for a metric). */
  onLeading?(leading: boolean): void;
}

export interface LeaderTerms {
  /** A term is under way (starting, running or stopping). */
  readonly leading: boolean;
  /** Not leading (a standby serves probes), or leading with the term's controllers running. */
  readonly ready: boolean;
  /** Ends the current term (waiting for its stop) and the campaign, releasing the Lease. */
  stop(): Promise<void>;
}

/** Starts campaigning (or the single term) at once and returns. */
export function runLeaderTerms(opts: LeaderTermsOptions): LeaderTerms {
  const log = opts.logger;
  let leading = false;
  let running: Term | undefined;

  async function term(signal: AbortSignal): Promise<void> {
    leading = true;
    opts.onLeading?.(true);
    let started: Term | undefined;
    try {
      started = await opts.start(signal);
      running = started;
      log.info("controllers running");
      await new Promise<void>((resolve) => {
        if (signal.aborted) resolve();
        else signal.addEventListener("abort", () => resolve(), { once: true });
      });
    } catch (err) {
      if (!signal.aborted) log.error("controllers failed", { err: errorMessage(err) });
    } finally {
      running = undefined;
      await started?.stop();
      leading = false;
      opts.onLeading?.(false);
      log.info("controllers stopped");
    }
  }

  let stop: () => Promise<void>;
  if (opts.election) {
    const elector = new LeaderElector(opts.conn, {
      ...opts.election,
      clock: opts.clock,
      logger: log,
      onStartedLeading: term,
    });
    elector.start();
    stop = () => elector.stop();
  } else {
    log.warn("leader election disabled: controllers run in this process unconditionally");
    const ctl = new AbortController();
    const done = term(ctl.signal);
    stop = async () => {
      ctl.abort();
      await done;
    };
  }
  let stopping: Promise<void> | undefined;
  return {
    get leading() {
      return leading;
    },
    get ready() {
      return !leading || running !== undefined;
    },
    stop() {
      stopping ??= stop();
      return stopping;
    },
  };
}
