// A BlockFileHandler over bytes in memory, counting what reached it: the handler the FUSE tests
// and the bench serve, and a model of what a real handler must do.
import { type BlockFileHandler, BlockIoError } from "./block-files.ts";

/** What reached a MemoryBlockHandler, per kind of request. */
export interface BlockCounts {
  reads: number;
  writes: number;
  flushes: number;
  discards: number;
  writeZeroes: number;
  discardedBytes: number;
}

/**
 * A handler over a zero-filled buffer of `size` bytes (a multiple of 512). `fail`, when set,
 * answers every request with that errno instead (as a target that lost the namespace would);
 * `gate`, when set, is awaited by every request before it is served (a target that stalls).
 */
export class MemoryBlockHandler implements BlockFileHandler {
  readonly bytes: Uint8Array;
  readonly counts: BlockCounts = {
    reads: 0,
    writes: 0,
    flushes: 0,
    discards: 0,
    writeZeroes: 0,
    discardedBytes: 0,
  };
  fail: number | undefined;
  gate: Promise<void> | undefined;
  /** Requests that arrived and have not been answered yet (waiting at the gate included). */
  inFlight = 0;

  constructor(size: number) {
    if (size % 512 !== 0) throw new RangeError(`size ${size} is not a multiple of 512`);
    this.bytes = new Uint8Array(size);
  }

  size(): number {
    return this.bytes.length;
  }

  async #enter(): Promise<void> {
    if (this.gate) await this.gate;
    if (this.fail !== undefined) throw new BlockIoError(this.fail);
  }

  async #serve<T>(f: () => T): Promise<T> {
    this.inFlight++;
    try {
      await this.#enter();
      return f();
    } finally {
      this.inFlight--;
    }
  }

  read(offset: number, length: number): Promise<Uint8Array> {
    return this.#serve(() => {
      this.counts.reads++;
      return this.bytes.slice(offset, offset + length);
    });
  }

  write(offset: number, data: Uint8Array): Promise<void> {
    return this.#serve(() => {
      this.counts.writes++;
      this.bytes.set(data, offset);
    });
  }

  flush(): Promise<void> {
    return this.#serve(() => {
      this.counts.flushes++;
    });
  }

  discard(offset: number, length: number): Promise<void> {
    return this.#serve(() => {
      this.counts.discards++;
      this.counts.discardedBytes += length;
      this.bytes.fill(0, offset, offset + length);
    });
  }

  writeZeroes(offset: number, length: number): Promise<void> {
    return this.#serve(() => {
      this.counts.writeZeroes++;
      this.bytes.fill(0, offset, offset + length);
    });
  }
}
