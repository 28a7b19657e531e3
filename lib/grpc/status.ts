// The one place where DISTORT errors become gRPC status codes. Handlers throw StorageError (or a
// ConnectError when they must pick the code themselves); everything leaves the server through here.

import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorKind, StorageError } from "../errors";

/** StorageError kind -> gRPC code, following the CSI spec's error tables. */
export const KIND_TO_CODE: Readonly<Record<ErrorKind, Code>> = {
  invalid: Code.InvalidArgument,
  "not-found": Code.NotFound,
  "already-exists": Code.AlreadyExists,
  precondition: Code.FailedPrecondition,
  busy: Code.Aborted,
  conflict: Code.Aborted,
  exhausted: Code.ResourceExhausted,
  "out-of-range": Code.OutOfRange,
  unavailable: Code.Unavailable,
  timeout: Code.DeadlineExceeded,
  unimplemented: Code.Unimplemented,
  internal: Code.Internal,
};

/**
 * Converts anything a handler threw into the ConnectError the server sends. A ConnectError passes
 * through unchanged (the handler chose the code); a StorageError gets its kind's code and its own
 * message (callers such as csi-sanity and the CO log it); anything else is INTERNAL with the
 * thrown message. The original error stays reachable as `cause` for logs.
 */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof StorageError)
    return new ConnectError(err.message, KIND_TO_CODE[err.kind], undefined, undefined, err);
  const message = err instanceof Error ? err.message : String(err);
  return new ConnectError(message, Code.Internal, undefined, undefined, err);
}

/** The gRPC status name for logs, e.g. "NOT_FOUND" (Code.NotFound). "OK" for 0. */
export function codeName(code: Code | 0): string {
  if (code === 0) return "OK";
  return (Code[code] ?? "UNKNOWN").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}
