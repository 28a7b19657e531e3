// Per-device serialisation of ledger writes inside one process. Not needed for safety (the API
// server's resourceVersion check arbitrates every write); it keeps this process's own workers
// from conflicting with each other on a popular device.

/** Runs tasks one at a time per key, in call order; different keys run concurrently. */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<unknown>>();

  /** Runs `task` after every earlier task of `key` settled; resolves or rejects with its result. */
  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    const next = prev.then(task, task);
    const tail = next.catch(() => {});
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return next;
  }

  /** Keys with a task running or waiting. */
  get size(): number {
    return this.#tails.size;
  }
}
