// A FIFO async mutex: serialises multi-step operations that await in between, such as every
// configfs mutation of one kernel target or the metadata writes inside one SPDK emulator.

/**
 * Runs callbacks one at a time, in call order, inside one process. A callback that throws
 * (synchronously too) or rejects releases the lock, and its error reaches only its own caller.
 * Not reentrant: calling run() from inside a callback on the same mutex deadlocks.
 */
export class Mutex {
  #tail: Promise<void> = Promise.resolve();

  /** Runs `fn` after every earlier holder finished; resolves or rejects with its outcome. */
  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.#tail.then(fn);
    // The next waiter starts once this one settles, whatever the outcome.
    this.#tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}
