// A keyed FIFO mutex: at most one task per key runs at a time, waiters run in arrival order, and
// tasks under different keys run concurrently. Serialises mutations of one SPDK object, one disk's
// partition table, one device's ledger writes.

/**
 * Per-key FIFO mutual exclusion for async tasks, inside one process. Not reentrant: a task that
 * calls run() again with its own key waits for itself forever. A task that throws (synchronously
 * too) or rejects releases the key like one that succeeds, and its error reaches only its own
 * caller. Memory is held only for keys with a running or waiting task.
 */
export class KeyedMutex {
  // The promise that settles when the last task queued under the key has finished.
  readonly #tails = new Map<string, Promise<void>>();
  // Tasks running or waiting per key (absent: none).
  readonly #counts = new Map<string, number>();

  /**
   * Runs `fn` once every task queued earlier under `key` has finished, and settles with its
   * outcome.
   */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const before = this.#tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const done = new Promise<void>((resolve) => {
      release = resolve;
    });
    const tail = before.then(() => done);
    this.#tails.set(key, tail);
    this.#counts.set(key, (this.#counts.get(key) ?? 0) + 1);
    return before.then(async () => {
      try {
        return await fn();
      } finally {
        release();
        if (this.#tails.get(key) === tail) this.#tails.delete(key);
        const n = (this.#counts.get(key) ?? 1) - 1;
        if (n > 0) this.#counts.set(key, n);
        else this.#counts.delete(key);
      }
    });
  }

  /** Tasks running or waiting under `key` (0 when none); for tests and diagnostics. */
  pending(key: string): number {
    return this.#counts.get(key) ?? 0;
  }

  /** Keys with a running or waiting task; for tests, metrics and diagnostics. */
  get heldKeys(): number {
    return this.#tails.size;
  }
}
