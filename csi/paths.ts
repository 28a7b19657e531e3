// Lexical validation of the host paths CSI callers hand the node service (staging, target and
// volume paths). Pure: runs before any filesystem or NVMe side effect, so a bad path never reaches
// mount, mkdir or rm.
import { StorageError } from "../lib/errors.ts";

/** Longest path accepted, in bytes: Linux's PATH_MAX. CSI requires at least 128. */
export const MAX_PATH_BYTES = 4096;

/**
 * What is wrong with `path` as an absolute, canonical, non-root host path, or undefined when
 * nothing is. Canonical means lexically final: no empty, "." or ".." segment and no trailing
 * separator, so the path names exactly one place without resolving anything. Symlinks are not
 * looked at (that would be a side effect); callers that must not follow them check separately.
 */
export function pathProblem(path: string): string | undefined {
  if (path.length === 0) return "is empty";
  if (path.includes("\0")) return "contains a NUL byte";
  if (Buffer.byteLength(path) > MAX_PATH_BYTES) return `is longer than ${MAX_PATH_BYTES} bytes`;
  if (!path.startsWith("/")) return "is not absolute";
  if (path === "/") return "is the root directory";
  if (path.endsWith("/")) return "ends with a separator";
  for (const segment of path.slice(1).split("/")) {
    if (segment === "") return "contains an empty segment (//)";
    if (segment === "." || segment === "..") return `contains a "${segment}" segment`;
  }
  return undefined;
}

/**
 * Returns `path` when it passes pathProblem(); otherwise throws StorageError "invalid" (gRPC
 * INVALID_ARGUMENT) naming the request field, e.g. "staging_target_path is not absolute".
 */
export function requireCanonicalPath(field: string, path: string): string {
  const problem = pathProblem(path);
  if (problem !== undefined) {
    throw new StorageError("invalid", `${field} ${problem}`, { details: { field } });
  }
  return path;
}
