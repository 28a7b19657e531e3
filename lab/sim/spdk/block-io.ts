// Byte-addressed block I/O behind every emulated bdev: an extent of a (sparse) file for drives and
// AIO bdevs, zero-filled memory for malloc bdevs, a window onto another device. Lvol and fabric
// bdevs implement the same port. Also a sparse-aware copy between devices.
import { closeSync, fstatSync, openSync, readSync, writeSync } from "node:fs";
import { dataRanges, punchHole } from "./libc.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** A byte range of a file: `length` bytes from `offset` of `path`. */
export interface FileExtent {
  readonly path: string;
  readonly offset: number;
  readonly length: number;
}

/**
 * The data path of a bdev. Offsets and lengths are bytes; callers keep them inside `sizeBytes`
 * (out of range is ErrnoError EINVAL). Failures are ErrnoError (EIO for a gone device).
 * Implementations may be called concurrently; each call is applied atomically.
 */
export interface BlockIo {
  /** Current size in bytes (lvols and fabric namespaces can be resized). */
  readonly sizeBytes: number;
  read(offset: number, length: number): Promise<Buffer>;
  write(offset: number, data: Uint8Array): Promise<void>;
  /**
   * Makes the range read as zeros, freeing its space where the medium can (a hole punched into a
   * file, like an NVMe deallocate on a drive whose DLFEAT promises zeros). Optional: callers
   * without it write zeros.
   */
  deallocate?(offset: number, length: number): Promise<void>;
  /**
   * Where every byte of the device lies as one extent of one file, when it does: reading or
   * writing that extent directly (as the lab's loop devices do) is the same as this device's
   * read and write. Undefined when the bytes are elsewhere (RAM, several extents, a remote target).
   */
  fileExtent?(): FileExtent | undefined;
  /**
   * The parts of [offset, offset+length) that may hold non-zero bytes, as [start, length] pairs in
   * order; everything else reads as zeros. Optional: without it the whole range may hold data.
   */
  dataRanges?(offset: number, length: number): Promise<(readonly [number, number])[]>;
}

/** Zeros `length` bytes at `offset` of `io`: deallocate when it can, else written in 1 MiB pieces. */
export async function zeroRange(io: BlockIo, offset: number, length: number): Promise<void> {
  if (length === 0) return;
  if (io.deallocate) return io.deallocate(offset, length);
  return writeZeros(io, offset, length);
}

const COPY_CHUNK = 4 * 1024 * 1024;
let zeroChunk = Buffer.alloc(0);

function isZero(b: Buffer): boolean {
  if (zeroChunk.length < b.length) zeroChunk = Buffer.alloc(b.length);
  return b.equals(zeroChunk.subarray(0, b.length));
}

/**
 * Copies `length` bytes from `srcOffset` of `src` to `dstOffset` of `dst`, which must read as zeros
 * there already (a new sparse file, a deallocated range): only the source's data ranges are read
 * and only their non-zero chunks written, so holes stay holes and a mostly empty volume copies fast.
 */
export async function copyRange(
  src: BlockIo,
  srcOffset: number,
  dst: BlockIo,
  dstOffset: number,
  length: number,
): Promise<void> {
  const ranges = src.dataRanges ? await src.dataRanges(srcOffset, length) : [[srcOffset, length] as const];
  for (const [start, n] of ranges) {
    for (let at = start; at < start + n; at += COPY_CHUNK) {
      const bytes = await src.read(at, Math.min(COPY_CHUNK, start + n - at));
      if (!isZero(bytes)) await dst.write(dstOffset + (at - srcOffset), bytes);
    }
  }
}

async function writeZeros(io: BlockIo, offset: number, length: number): Promise<void> {
  const zeros = Buffer.alloc(Math.min(length, 1 << 20));
  for (let done = 0; done < length; done += zeros.length) {
    await io.write(offset + done, zeros.subarray(0, Math.min(zeros.length, length - done)));
  }
}

/** Throws EINVAL unless [offset, offset+length) lies within [0, size). */
export function checkRange(offset: number, length: number, size: number): void {
  if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0) {
    throw new ErrnoError(Errno.EINVAL, `bad range ${offset}+${length}`);
  }
  if (offset + length > size) throw new ErrnoError(Errno.EINVAL, `range ${offset}+${length} beyond ${size}`);
}

/**
 * A window [base, base+size) of a file opened once. Synchronous positional I/O keeps every call
 * atomic and ordered, which is what a simulator needs more than throughput. close() makes later
 * calls fail with EIO, as I/O to a removed device does.
 */
export class FileExtentIo implements BlockIo {
  #fd: number | undefined;

  constructor(
    readonly path: string,
    readonly base: number,
    readonly sizeBytes: number,
    opts: { readonly?: boolean } = {},
  ) {
    this.#fd = openSync(path, opts.readonly ? "r" : "r+");
  }

  /** A file opened whole, sized by its current length. */
  static whole(path: string, opts: { readonly?: boolean } = {}): FileExtentIo {
    const fd = openSync(path, "r");
    const size = fstatSync(fd).size;
    closeSync(fd);
    return new FileExtentIo(path, 0, size, opts);
  }

  async read(offset: number, length: number): Promise<Buffer> {
    const fd = this.#open();
    checkRange(offset, length, this.sizeBytes);
    const out = Buffer.alloc(length);
    let done = 0;
    try {
      while (done < length) {
        const n = readSync(fd, out, done, length - done, this.base + offset + done);
        if (n === 0) break; // a sparse tail past EOF reads as zeros, already in `out`
        done += n;
      }
    } catch (err) {
      throw new ErrnoError(Errno.EIO, (err as Error).message);
    }
    return out;
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    const fd = this.#open();
    checkRange(offset, data.length, this.sizeBytes);
    let done = 0;
    try {
      while (done < data.length) {
        done += writeSync(fd, data, done, data.length - done, this.base + offset + done);
      }
    } catch (err) {
      // A read-only AIO file lands here too: the write fails like a rejected command.
      throw new ErrnoError(Errno.EIO, (err as Error).message);
    }
  }

  async deallocate(offset: number, length: number): Promise<void> {
    const fd = this.#open();
    checkRange(offset, length, this.sizeBytes);
    if (length === 0) return;
    let punched: boolean;
    try {
      punched = punchHole(fd, this.base + offset, length);
    } catch (err) {
      throw new ErrnoError(Errno.EIO, (err as Error).message);
    }
    if (!punched) await writeZeros(this, offset, length);
  }

  async dataRanges(offset: number, length: number): Promise<(readonly [number, number])[]> {
    const fd = this.#open();
    checkRange(offset, length, this.sizeBytes);
    let found: [number, number][] | undefined;
    try {
      found = dataRanges(fd, this.base + offset, length);
    } catch (err) {
      throw new ErrnoError(Errno.EIO, (err as Error).message);
    }
    if (found === undefined) return [[offset, length]];
    return found.map(([at, n]) => [at - this.base, n] as const);
  }

  /** The window itself, while the file is open. */
  fileExtent(): FileExtent | undefined {
    if (this.#fd === undefined) return undefined;
    return { path: this.path, offset: this.base, length: this.sizeBytes };
  }

  /** Releases the file; idempotent. */
  close(): void {
    if (this.#fd !== undefined) closeSync(this.#fd);
    this.#fd = undefined;
  }

  #open(): number {
    if (this.#fd === undefined) throw new ErrnoError(Errno.EIO, `${this.path} is closed`);
    return this.#fd;
  }
}

const CHUNK = 1 << 20;

/**
 * Zero-initialised RAM, allocated in 1 MiB chunks on first write (malloc bdevs, and the bytes of
 * lvols on a RAM lvstore). Fixed in size unless resize() is called.
 */
/** A null bdev's medium: writes are dropped, every read is zeros (bdev_null). */
export class NullIo implements BlockIo {
  constructor(readonly sizeBytes: number) {}

  async read(offset: number, length: number): Promise<Buffer> {
    if (offset < 0 || length < 0 || offset + length > this.sizeBytes)
      throw new ErrnoError(Errno.EINVAL, "I/O beyond the end of the null bdev");
    return Buffer.alloc(length);
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    if (offset < 0 || offset + data.length > this.sizeBytes)
      throw new ErrnoError(Errno.EINVAL, "I/O beyond the end of the null bdev");
  }

  async deallocate(): Promise<void> {}

  async dataRanges(): Promise<(readonly [number, number])[]> {
    return [];
  }
}

export class MemoryIo implements BlockIo {
  readonly #chunks = new Map<number, Buffer>();
  #size: number;

  constructor(sizeBytes: number) {
    this.#size = sizeBytes;
  }

  get sizeBytes(): number {
    return this.#size;
  }

  /** Sets the size; bytes cut off by a shrink read as zeros if it grows again. */
  resize(sizeBytes: number): void {
    for (const [chunk, c] of this.#chunks) {
      const start = chunk * CHUNK;
      if (start >= sizeBytes) this.#chunks.delete(chunk);
      else if (start + CHUNK > sizeBytes) c.fill(0, sizeBytes - start);
    }
    this.#size = sizeBytes;
  }

  async dataRanges(offset: number, length: number): Promise<(readonly [number, number])[]> {
    checkRange(offset, length, this.sizeBytes);
    const out: [number, number][] = [];
    this.#walk(offset, length, (chunk, at, _pos, n) => {
      if (!this.#chunks.has(chunk)) return;
      const start = chunk * CHUNK + at;
      const last = out[out.length - 1];
      if (last && last[0] + last[1] === start) last[1] += n;
      else out.push([start, n]);
    });
    return out;
  }

  async read(offset: number, length: number): Promise<Buffer> {
    checkRange(offset, length, this.sizeBytes);
    const out = Buffer.alloc(length);
    this.#walk(offset, length, (chunk, at, pos, n) => {
      const c = this.#chunks.get(chunk);
      if (c) c.copy(out, pos, at, at + n);
    });
    return out;
  }

  async deallocate(offset: number, length: number): Promise<void> {
    checkRange(offset, length, this.sizeBytes);
    this.#walk(offset, length, (chunk, at, _pos, n) => {
      if (n === CHUNK) this.#chunks.delete(chunk);
      else this.#chunks.get(chunk)?.fill(0, at, at + n);
    });
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    checkRange(offset, data.length, this.sizeBytes);
    const src = Buffer.from(data.buffer, data.byteOffset, data.length);
    this.#walk(offset, data.length, (chunk, at, pos, n) => {
      let c = this.#chunks.get(chunk);
      if (!c) {
        c = Buffer.alloc(CHUNK);
        this.#chunks.set(chunk, c);
      }
      src.copy(c, at, pos, pos + n);
    });
  }

  #walk(
    offset: number,
    length: number,
    fn: (chunk: number, at: number, pos: number, n: number) => void,
  ): void {
    let pos = 0;
    while (pos < length) {
      const abs = offset + pos;
      const chunk = Math.floor(abs / CHUNK);
      const at = abs - chunk * CHUNK;
      const n = Math.min(CHUNK - at, length - pos);
      fn(chunk, at, pos, n);
      pos += n;
    }
  }
}

/**
 * The bytes [offset, offset+sizeBytes) of another device, shown from 0: a thick lvol's run of
 * clusters on its lvstore's base. Its file extent is the inner device's, shifted, when it has one.
 */
export class WindowIo implements BlockIo {
  constructor(
    readonly inner: BlockIo,
    readonly offset: number,
    readonly sizeBytes: number,
  ) {
    checkRange(offset, sizeBytes, inner.sizeBytes);
  }

  read(offset: number, length: number): Promise<Buffer> {
    checkRange(offset, length, this.sizeBytes);
    return this.inner.read(this.offset + offset, length);
  }

  write(offset: number, data: Uint8Array): Promise<void> {
    checkRange(offset, data.length, this.sizeBytes);
    return this.inner.write(this.offset + offset, data);
  }

  deallocate(offset: number, length: number): Promise<void> {
    checkRange(offset, length, this.sizeBytes);
    return zeroRange(this.inner, this.offset + offset, length);
  }

  fileExtent(): FileExtent | undefined {
    const e = this.inner.fileExtent?.();
    if (e === undefined) return undefined;
    return { path: e.path, offset: e.offset + this.offset, length: this.sizeBytes };
  }

  async dataRanges(offset: number, length: number): Promise<(readonly [number, number])[]> {
    checkRange(offset, length, this.sizeBytes);
    if (!this.inner.dataRanges) return [[offset, length]];
    const found = await this.inner.dataRanges(this.offset + offset, length);
    return found.map(([at, n]) => [at - this.offset, n] as const);
  }
}
