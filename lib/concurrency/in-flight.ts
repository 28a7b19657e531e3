// The in-process guard against concurrent operations on one object: CSI (and the DPF plugin API
// after it) asks that a second call for a volume with an operation already pending fails at once
// with ABORTED, so the caller retries later instead of queueing behind it.

import { StorageError } from "../errors.ts";

/**
 * A set of keys with an operation running, refusing instead of waiting. One instance per service
 * (no module state); it guards only this process, across replicas the API server's optimistic
 * concurrency does. The refusal is StorageError "busy", which every server maps to ABORTED.
 */
export class InFlight {
  readonly #running = new Map<string, string>();
  readonly #noun: string;

  /** `noun` names what a key is, in messages and as the details key ("volume" by default). */
  constructor(noun = "volume") {
    this.#noun = noun;
  }

  /**
   * Runs `fn` holding `key` for `operation`. Rejects with StorageError "busy" at once, without
   * running `fn`, when another operation holds `key`; the message names the holder. The key is
   * released however `fn` ends (a synchronous throw included).
   */
  async run<T>(key: string, operation: string, fn: () => Promise<T>): Promise<T> {
    const holder = this.#running.get(key);
    if (holder !== undefined) {
      throw new StorageError(
        "busy",
        `an operation on ${this.#noun} ${key} is already in progress (${holder}); ${operation} retries later`,
        { details: { [this.#noun]: key, inFlight: holder, operation } },
      );
    }
    this.#running.set(key, operation);
    try {
      return await fn();
    } finally {
      this.#running.delete(key);
    }
  }

  /** Keys currently held (for tests and debugging). */
  keys(): string[] {
    return [...this.#running.keys()];
  }
}
