// Per-key serialisation: the parted volume manager changes one disk's partition table at a time,
// while different disks proceed in parallel.

/**
 * run(key, fn) waits for every earlier callback with the same key, then runs fn. FIFO per key; a
 * callback that throws still releases its key. Not reentrant for the same key. Keys with nothing
 * queued are forgotten, so the map does not grow with every disk ever seen.
 */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<void>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    const result = prev.then(fn);
    const tail = result.then(
      () => undefined,
      () => undefined,
    );
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return result;
  }

  /** Keys with a callback running or waiting; for tests and metrics. */
  get busyKeys(): number {
    return this.#tails.size;
  }
}
