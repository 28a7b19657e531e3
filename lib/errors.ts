// The one error family of DISTORT: every failure that crosses a module boundary is a StorageError
// with a kind. Servers map kinds to wire codes in one place (lib/grpc/status.ts for gRPC).

/** What went wrong, independent of the transport that reports it. */
export type ErrorKind =
  | "invalid" // the caller sent something malformed (CSI INVALID_ARGUMENT)
  | "not-found" // the named thing does not exist (NOT_FOUND)
  | "already-exists" // same name, different parameters (ALREADY_EXISTS)
  | "precondition" // valid request, wrong state: another writer holds the volume (FAILED_PRECONDITION)
  | "busy" // an operation on the same object is in flight (ABORTED)
  | "exhausted" // no capacity or quota (RESOURCE_EXHAUSTED)
  | "out-of-range" // capacity outside what the backend can do (OUT_OF_RANGE)
  | "unavailable" // a dependency is down; retrying later may work (UNAVAILABLE)
  | "timeout" // the deadline ran out before the operation completed (DEADLINE_EXCEEDED)
  | "conflict" // optimistic-concurrency conflict; re-read and retry (ABORTED)
  | "unimplemented" // the operation is not offered (UNIMPLEMENTED)
  | "internal"; // a bug or an unexpected reply (INTERNAL)

/** Kinds worth retrying without any change to the request. */
const TRANSIENT: ReadonlySet<ErrorKind> = new Set(["busy", "unavailable", "timeout", "conflict"]);

export class StorageError extends Error {
  override readonly name = "StorageError";
  readonly kind: ErrorKind;
  /** Structured context for logs (volume, node, nqn...). Never put secrets here. */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(
    kind: ErrorKind,
    message: string,
    opts: { cause?: unknown; details?: Record<string, unknown> } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.kind = kind;
    this.details = opts.details ?? {};
  }

  /** True when the same request may succeed later without change. */
  get transient(): boolean {
    return TRANSIENT.has(this.kind);
  }
}

/** Wraps anything thrown into a StorageError, keeping an existing one as it is. */
export function asStorageError(err: unknown, fallback: ErrorKind = "internal"): StorageError {
  if (err instanceof StorageError) return err;
  if (err instanceof Error) return new StorageError(fallback, err.message, { cause: err });
  return new StorageError(fallback, String(err));
}

/** The message of any thrown value, for logs and conditions. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
