// The few libc calls node:fs lacks, through bun:ffi: fallocate to punch holes (how a simulated
// drive deallocates blocks), lseek SEEK_DATA (to copy sparse files without reading their holes) and
// ioctl (loop device status). libc is opened on first use; where it cannot be (no glibc or musl
// found), callers get `undefined` and fall back.
import { dlopen, read } from "bun:ffi";

const SYMBOLS = {
  fallocate: { args: ["i32", "i32", "i64", "i64"], returns: "i32" },
  ioctl: { args: ["i32", "u64", "ptr"], returns: "i32" },
  lseek: { args: ["i32", "i64", "i32"], returns: "i64" },
  __errno_location: { args: [], returns: "ptr" },
} as const;

type Libc = ReturnType<typeof dlopen<typeof SYMBOLS>>["symbols"];

const CANDIDATES = ["libc.so.6", `libc.musl-${process.arch === "arm64" ? "aarch64" : "x86_64"}.so.1`];
let loaded: Libc | null | undefined;

function libc(): Libc | null {
  if (loaded !== undefined) return loaded;
  loaded = null;
  for (const name of CANDIDATES) {
    try {
      loaded = dlopen(name, SYMBOLS).symbols;
      break;
    } catch {
      // try the next name
    }
  }
  return loaded;
}

/** A failed libc call: `errno` is the positive C errno. */
export class LibcError extends Error {
  override readonly name = "LibcError";
  constructor(
    readonly call: string,
    readonly errno: number,
  ) {
    super(`${call} failed with errno ${errno}`);
  }
}

function errno(c: Libc): number {
  const p = c.__errno_location();
  return p === null ? 0 : read.i32(p, 0);
}

const FALLOC_FL_KEEP_SIZE = 0x01;
const FALLOC_FL_PUNCH_HOLE = 0x02;

/**
 * Punches a hole of `length` bytes at `offset` into the file open as `fd` (the range reads as
 * zeros afterwards, its blocks are freed, the file keeps its size). Returns false when libc is
 * not available or the file system cannot punch holes (EOPNOTSUPP), so the caller writes zeros
 * instead; throws LibcError for any other failure.
 */
export function punchHole(fd: number, offset: number, length: number): boolean {
  const c = libc();
  if (c === null) return false;
  if (c.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) === 0) return true;
  const e = errno(c);
  if (e === 95) return false;
  throw new LibcError("fallocate", e);
}

const SEEK_DATA = 3;
const SEEK_HOLE = 4;
const ENXIO = 6;

/**
 * The byte ranges holding data within [offset, offset+length) of the file open as `fd`, as
 * [start, length] pairs in file order (lseek SEEK_DATA / SEEK_HOLE, which also count data still in
 * the page cache). Holes in between read as zeros. Undefined when libc is not available or the file
 * system cannot tell (the caller then treats the whole range as data); throws LibcError otherwise.
 */
export function dataRanges(fd: number, offset: number, length: number): [number, number][] | undefined {
  const c = libc();
  if (c === null) return undefined;
  const end = offset + length;
  const out: [number, number][] = [];
  let at = offset;
  while (at < end) {
    const data = Number(c.lseek(fd, at, SEEK_DATA));
    if (data < 0) {
      const e = errno(c);
      if (e === ENXIO) break; // no data at or after `at`
      if (e === 22 || e === 95) return undefined; // EINVAL / EOPNOTSUPP: no SEEK_DATA here
      throw new LibcError("lseek", e);
    }
    if (data >= end) break;
    const hole = Number(c.lseek(fd, data, SEEK_HOLE));
    if (hole < 0) throw new LibcError("lseek", errno(c));
    const stop = Math.min(hole, end);
    out.push([data, stop - data]);
    at = stop;
  }
  return out;
}

/**
 * ioctl(fd, request, buf) with an in/out argument buffer. Throws LibcError on failure, and an
 * Error when libc is not available.
 */
export function ioctl(fd: number, request: number, buf: Buffer): void {
  const c = libc();
  if (c === null) throw new Error("libc is not available to bun:ffi on this host");
  if (c.ioctl(fd, request, buf) !== 0) throw new LibcError("ioctl", errno(c));
}
