// The in-process guard against concurrent operations on one volume: CSI says a second call for a
// volume that already has one in flight answers ABORTED, and the CO retries it later.
import { aborted } from "../errors.ts";

/**
 * A set of keys with an operation running. One instance per controller service (no module state).
 * Only guards this process; across replicas the API server's optimistic concurrency does.
 */
export class InFlight {
  private readonly running = new Map<string, string>();

  /**
   * Runs `fn` holding `key`; throws ABORTED at once, without running `fn`, when another operation
   * holds it. The key is released however `fn` ends.
   */
  async run<T>(key: string, operation: string, fn: () => Promise<T>): Promise<T> {
    const holder = this.running.get(key);
    if (holder !== undefined) {
      throw aborted(`an operation on volume ${key} is already in progress (${holder}); retry later`, {
        volume: key,
        inFlight: holder,
      });
    }
    this.running.set(key, operation);
    try {
      return await fn();
    } finally {
      this.running.delete(key);
    }
  }

  /** Keys currently held (for tests and debugging). */
  keys(): string[] {
    return [...this.running.keys()];
  }
}
