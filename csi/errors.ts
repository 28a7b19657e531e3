// How the CSI services phrase failures: StorageError constructors named after the CSI outcome they
// produce (lib/grpc/status.ts maps the kind to the wire code), and valibot issues turned into one
// readable sentence for INVALID_ARGUMENT answers.
import * as v from "valibot";
import { type ErrorKind, StorageError } from "../lib/errors.ts";

/** INVALID_ARGUMENT: the request itself is malformed or asks for something DISTORT never offers. */
export function invalidArgument(message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError("invalid", message, { details });
}

/** NOT_FOUND: the volume (or node) named by the request does not exist. */
export function notFound(message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError("not-found", message, { details });
}

/** ALREADY_EXISTS: same name or same publication, different and incompatible parameters. */
export function alreadyExists(message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError("already-exists", message, { details });
}

/** FAILED_PRECONDITION: a valid request the current state forbids (another node holds the volume). */
export function failedPrecondition(message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError("precondition", message, { details });
}

/** ABORTED: another operation on the same volume is in flight, or the object changed under us. */
export function aborted(message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError("busy", message, { details });
}

/**
 * An error of any kind with details; for the few places that pick the kind from data (a
 * placement verdict, a partition's failure reason).
 */
export function csiError(kind: ErrorKind, message: string, details?: Record<string, unknown>): StorageError {
  return new StorageError(kind, message, { details });
}

/**
 * One sentence out of valibot issues: "<what>: <path>: <message>; ...". The first three issues are
 * kept; callers learn about the rest after fixing those.
 */
export function describeIssues(what: string, issues: readonly v.BaseIssue<unknown>[]): string {
  const parts = issues.slice(0, 3).map((i) => {
    const path = v.getDotPath(i);
    return path ? `${path}: ${i.message}` : i.message;
  });
  const more = issues.length > 3 ? ` (and ${issues.length - 3} more)` : "";
  return `${what}: ${parts.join("; ")}${more}`;
}
