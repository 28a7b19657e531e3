// The reporter's ticker on a Clock: one pass right away, then one `periodMs` after each pass
// ends, until the signal aborts. Tests drive it with ManualClock instead of waiting.
import type { Clock } from "../../lib/clock.ts";

/** Default period between reporter passes. */
export const DEFAULT_REPORT_PERIOD_MS = 30_000;

/**
 * Calls `pass` repeatedly with a fixed delay between the end of one call and the start of the
 * next (passes never overlap). Resolves once `signal` aborts: immediately when it is already
 * aborted, otherwise after the pass in flight (if any) ends. `pass` must not reject; if it does,
 * the rejection ends the loop and is returned to the caller.
 */
export async function runPeriodically(
  clock: Clock,
  periodMs: number,
  signal: AbortSignal,
  pass: () => Promise<void>,
): Promise<void> {
  if (!(periodMs > 0)) throw new RangeError(`period must be positive, got ${periodMs}`);
  while (!signal.aborted) {
    await pass();
    if (signal.aborted) return;
    try {
      await clock.sleep(periodMs, signal);
    } catch {
      return; // aborted while waiting
    }
  }
}
