// Health and readiness of the plugin: healthy while its own state directory works, ready once it
// has initialised and while SNAP answers a JSON-RPC round trip. Shared by Probe and /readyz.
import { type Clock, realClock } from "../lib/clock.ts";
import { errorMessage } from "../lib/errors.ts";
import type { Logger } from "../lib/log.ts";
import type { SpdkMethods } from "../lib/spdk/methods.ts";
import type { DeviceStore } from "./devices/state-store.ts";

export interface ReadinessOptions {
  methods: SpdkMethods;
  store: DeviceStore;
  logger: Logger;
  clock?: Clock;
  /** Deadline of the SNAP round trip a probe makes. Default 3000 ms. */
  probeTimeoutMs?: number;
  /** Further work initialisation must finish, in order. */
  initSteps?: readonly { readonly name: string; readonly run: () => Promise<void> }[];
}

/** A readiness verdict with the reason when not ready. */
export interface ReadyState {
  readonly ready: boolean;
  readonly reason?: string;
}

/**
 * Tracks initialisation and answers probes. A SNAP that does not answer makes the plugin not
 * ready rather than unhealthy: restarting the plugin would not bring SNAP back. A state directory
 * that cannot be used is unhealthy (check() throws), as a restart or an operator must fix it.
 */
export class Readiness {
  readonly #o: ReadinessOptions;
  readonly #clock: Clock;
  #initialised = false;
  #last: boolean | undefined;

  constructor(o: ReadinessOptions) {
    this.#o = o;
    this.#clock = o.clock ?? realClock;
  }

  get initialised(): boolean {
    return this.#initialised;
  }

  /**
   * Initialises: the state directory must work, SNAP must answer once (spdk_get_version) and the
   * init steps must succeed. Retries the whole sequence (each part is idempotent) with backoff
   * (0.2 s doubling to 5 s) until it succeeds or `signal` aborts.
   */
  async initialise(signal?: AbortSignal): Promise<void> {
    let delay = 200;
    for (;;) {
      let step = "state directory";
      try {
        await this.#o.store.check();
        step = "SNAP round trip";
        const version = await this.#o.methods.spdkGetVersion({ timeoutMs: this.#o.probeTimeoutMs ?? 3000 });
        for (const s of this.#o.initSteps ?? []) {
          step = s.name;
          await s.run();
        }
        this.#initialised = true;
        this.#o.logger.info("plugin initialised", { snapVersion: version.version });
        return;
      } catch (err) {
        this.#o.logger.warn("plugin not initialised yet", { step, err: errorMessage(err), retryMs: delay });
      }
      await this.#clock.sleep(delay, signal);
      delay = Math.min(delay * 2, 5000);
    }
  }

  /** Throws when unhealthy; otherwise ready or not, with the reason. Logs transitions only. */
  async check(): Promise<ReadyState> {
    await this.#o.store.check();
    let state: ReadyState;
    if (!this.#initialised) state = { ready: false, reason: "initialising" };
    else {
      try {
        await this.#o.methods.spdkGetVersion({ timeoutMs: this.#o.probeTimeoutMs ?? 3000 });
        state = { ready: true };
      } catch (err) {
        state = { ready: false, reason: `SNAP does not answer: ${errorMessage(err)}` };
      }
    }
    if (state.ready !== this.#last) {
      this.#last = state.ready;
      if (state.ready) this.#o.logger.info("plugin ready");
      else this.#o.logger.warn("plugin not ready", { reason: state.reason });
    }
    return state;
  }
}
