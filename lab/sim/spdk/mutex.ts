// A FIFO async mutex: serialises multi-step operations that await in between (metadata writes
// with cluster allocation, listener binding) inside one emulator.

/** Runs critical sections one after another, in call order. */
export class Mutex {
  #tail: Promise<void> = Promise.resolve();

  /** Runs `fn` after every earlier holder finished; resolves or rejects with its outcome. */
  run<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.#tail.then(fn);
    this.#tail = next.then(
      () => undefined,
      () => undefined,
    );
    return next;
  }
}
