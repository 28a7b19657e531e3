// At most one Node RPC per volume at a time. CSI asks plugins to answer ABORTED when an operation
// on the same volume is already pending, so the caller retries later instead of queueing.
import { aborted } from "../errors.ts";

/** Per-key exclusion that refuses instead of waiting. One instance per service; not shared across processes. */
export class InFlight {
  readonly #busy = new Set<string>();

  /**
   * Runs `fn` while holding `key`. Rejects with StorageError "busy" (ABORTED) at once when `key`
   * is held; the key is released when `fn` settles, whatever its outcome.
   */
  async run<T>(key: string, what: string, fn: () => Promise<T>): Promise<T> {
    if (this.#busy.has(key)) {
      throw aborted(`an operation on volume ${key} is already in progress; ${what} retries later`, {
        volume: key,
      });
    }
    this.#busy.add(key);
    try {
      return await fn();
    } finally {
      this.#busy.delete(key);
    }
  }
}
