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

  async read(offset: number, length: number): Promise<Uint8Array> {
    await this.#enter();
    this.counts.reads++;
    return this.bytes.slice(offset, offset + length);
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    await this.#enter();
    this.counts.writes++;
    this.bytes.set(data, offset);
  }

  async flush(): Promise<void> {
    await this.#enter();
    this.counts.flushes++;
  }

  async discard(offset: number, length: number): Promise<void> {
    await this.#enter();
    this.counts.discards++;
    this.counts.discardedBytes += length;
    this.bytes.fill(0, offset, offset + length);
  }

  async writeZeroes(offset: number, length: number): Promise<void> {
    await this.#enter();
    this.counts.writeZeroes++;
    this.bytes.fill(0, offset, offset + length);
  }
}
