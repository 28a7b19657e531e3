// A FIFO async mutex: the kernel target funnels every configfs mutation of one node through one,
// because configfs changes are multi-step and two interleaved reconciles would undo each other.

/**
 * Runs callbacks one at a time in call order. A callback that throws releases the lock and its
 * error reaches only its own caller. Not reentrant: calling run() from inside a callback on the
 * same mutex deadlocks.
 */
export class AsyncMutex {
  #tail: Promise<void> = Promise.resolve();

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
