// Errors shaped like node:fs errors (code, errno, syscall, path), so code written against the real
// configfs sees exactly what a failing syscall would give it.
import { constants } from "node:os";

export type ErrnoCode = keyof typeof constants.errno;

/** What a failing node:fs call rejects with. */
export interface ErrnoError extends Error {
  code: ErrnoCode;
  errno: number;
  syscall: string;
  path: string;
}

/** An error as node:fs would raise it for `syscall` on `path` failing with `code`. */
export function errnoError(code: ErrnoCode, syscall: string, path: string, why?: string): ErrnoError {
  const err = new Error(`${code}: ${why ?? code.toLowerCase()}, ${syscall} '${path}'`) as ErrnoError;
  err.code = code;
  err.errno = -(constants.errno[code] ?? 0);
  err.syscall = syscall;
  err.path = path;
  return err;
}
