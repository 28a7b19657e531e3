// The allocated (data) ranges of a sparse file, read with lseek SEEK_DATA / SEEK_HOLE through
// bun:ffi: how the agent learns which clusters a shallow copy wrote into its destination file.

import { dlopen, read } from "bun:ffi";
import { closeSync, fstatSync, openSync } from "node:fs";
import { StorageError } from "../errors.ts";

/** One range of a file that holds data; everything between two ranges is a hole. */
export interface AllocatedRange {
  readonly offset: number;
  readonly length: number;
}

// Linux's whence values and errno numbers (the only platform this runs on).
const SEEK_DATA = 3;
const SEEK_HOLE = 4;
const ENXIO = 6;

const SYMBOLS = {
  lseek: { args: ["i32", "i64", "i32"], returns: "i64" },
  __errno_location: { args: [], returns: "ptr" },
} as const;

const LIBC_NAMES = ["libc.so.6", `libc.musl-${process.arch === "arm64" ? "aarch64" : "x86_64"}.so.1`];

/** Opens libc for one call; the caller closes it. Undefined when no C library can be loaded. */
function openLibc(): ReturnType<typeof dlopen<typeof SYMBOLS>> | undefined {
  for (const name of LIBC_NAMES) {
    try {
      return dlopen(name, SYMBOLS);
    } catch {
      // try the next name
    }
  }
  return undefined;
}

/**
 * The ranges of `path` that hold data, in file order, merged where adjacent, as the kernel
 * reports them (SEEK_DATA then SEEK_HOLE from each range's end; data still in the page cache
 * counts). Ranges are whole file system blocks: a byte written anywhere in a block makes the
 * block data. An empty or all-hole file gives []. A file system without hole tracking reports the
 * whole file as one range, which over-reports and never under-reports.
 *
 * Synchronous and read-only; safe to call concurrently with writers, whose data appears or not
 * depending on timing. Throws StorageError: "not-found" when the file does not exist,
 * "precondition" when it may not be opened (EACCES/EPERM), "unimplemented" off Linux or without a
 * loadable libc, "internal" for any other open, stat or lseek failure.
 */
export function allocatedRanges(path: string): AllocatedRange[] {
  if (process.platform !== "linux") {
    throw new StorageError(
      "unimplemented",
      `allocated ranges need Linux's SEEK_DATA, not ${process.platform}`,
    );
  }
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const kind =
      code === "ENOENT" ? "not-found" : code === "EACCES" || code === "EPERM" ? "precondition" : "internal";
    throw new StorageError(kind, `cannot open ${path} to read its allocated ranges: ${code ?? String(err)}`, {
      cause: err,
      details: { path },
    });
  }
  try {
    const size = fstatSync(fd).size;
    if (size === 0) return [];
    const lib = openLibc();
    if (lib === undefined)
      throw new StorageError("unimplemented", "libc is not available to bun:ffi on this host");
    try {
      return scan(lib.symbols, fd, size, path);
    } finally {
      lib.close();
    }
  } catch (err) {
    if (err instanceof StorageError) throw err;
    throw new StorageError("internal", `cannot read the allocated ranges of ${path}: ${String(err)}`, {
      cause: err,
      details: { path },
    });
  } finally {
    closeSync(fd);
  }
}

type Libc = ReturnType<typeof dlopen<typeof SYMBOLS>>["symbols"];

function scan(c: Libc, fd: number, size: number, path: string): AllocatedRange[] {
  const errno = () => {
    const p = c.__errno_location();
    return p === null ? 0 : read.i32(p, 0);
  };
  const fail = (whence: string, at: number, e: number) =>
    new StorageError("internal", `lseek(${whence}) at ${at} of ${path} failed with errno ${e}`, {
      details: { path, errno: e },
    });
  const out: AllocatedRange[] = [];
  let at = 0;
  while (at < size) {
    const data = Number(c.lseek(fd, at, SEEK_DATA));
    if (data < 0) {
      const e = errno();
      if (e === ENXIO) break; // no data at or after `at`
      throw fail("SEEK_DATA", at, e);
    }
    if (data >= size) break;
    const hole = Number(c.lseek(fd, data, SEEK_HOLE));
    if (hole < 0) throw fail("SEEK_HOLE", data, errno());
    const end = Math.min(hole, size);
    const last = out[out.length - 1];
    if (last && last.offset + last.length === data)
      out[out.length - 1] = { offset: last.offset, length: end - last.offset };
    else out.push({ offset: data, length: end - data });
    at = end;
  }
  return out;
}
