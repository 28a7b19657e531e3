// Test support for I/O held across reconnects on a ManualClock: the clock is stepped timer by
// timer, and after each step the real fabric gets time (bounded) to finish the reconnect attempt
// the timer may have started, so simulated seconds never outrun real round trips.
import type { ManualClock } from "../../../lib/clock.ts";
import { call } from "./raw-rpc-client.ts";

export interface HoldClock {
  /** Lets fabric traffic and timers' continuations run (real time; the clock stays put). */
  settle(): Promise<void>;
  /** Waits (real time, at most 1 s) for I/O the clock has released to finish on the fabric. */
  until(cond: () => boolean): Promise<void>;
  /**
   * Advances the clock by `ms`, timer by timer, waiting after each until no controller of the
   * host reads resetting or the states stop changing (a refused attempt with
   * reconnect_delay_sec 0 keeps reading resetting).
   */
  advance(ms: number): Promise<void>;
}

/** A HoldClock over `clock` for the emulated host whose RPC socket is `hostSocket()`. */
export function holdClock(clock: ManualClock, hostSocket: () => string): HoldClock {
  const settle = () => Bun.sleep(8);
  async function quiet(): Promise<void> {
    let last = "";
    let same = 0;
    for (let i = 0; i < 100; i++) {
      await Bun.sleep(2);
      const now = JSON.stringify(await call(hostSocket(), "bdev_nvme_get_controllers"));
      if (!now.includes('"resetting"')) return;
      same = now === last ? same + 1 : 0;
      if (same >= 4) return;
      last = now;
    }
  }
  return {
    settle,
    async until(cond) {
      for (let i = 0; i < 200 && !cond(); i++) await Bun.sleep(5);
    },
    async advance(ms) {
      const end = clock.now() + ms;
      for (;;) {
        const due = clock.nextDue();
        if (due === undefined || due > end) break;
        clock.advance(due - clock.now());
        await quiet();
      }
      clock.advance(end - clock.now());
      await settle();
    },
  };
}

/** Tracks a promise's outcome without awaiting it. */
export function track<T>(p: Promise<T>) {
  const out: { done: boolean; error: unknown; value: T | undefined } = {
    done: false,
    error: undefined,
    value: undefined,
  };
  p.then(
    (v) => Object.assign(out, { done: true, value: v }),
    (e) => Object.assign(out, { done: true, error: e }),
  );
  return out;
}
