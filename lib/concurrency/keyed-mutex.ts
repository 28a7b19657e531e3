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
    return before.then(async () => {
      try {
        return await fn();
      } finally {
        release();
        if (this.#tails.get(key) === tail) this.#tails.delete(key);
      }
    });
  }

  /** Keys with a running or waiting task; for tests, metrics and diagnostics. */
  get heldKeys(): number {
    return this.#tails.size;
  }
}
