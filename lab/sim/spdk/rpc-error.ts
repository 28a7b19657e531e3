// JSON-RPC error replies as SPDK v25.05.1 words them: the reserved JSON-RPC codes, SPDK's own
// invalid-state code, and errno-style failures whose message is the C library's strerror text.

/** JSON-RPC and SPDK error codes the emulator answers with. */
export const RpcCode = {
  /** SPDK_JSONRPC_ERROR_PARSE_ERROR, which some bdev modules (raid) send for undecodable params. */
  parseError: -32700,
  invalidRequest: -32600,
  methodNotFound: -32601,
  invalidParams: -32602,
  internalError: -32603,
  /** SPDK_JSONRPC_ERROR_INVALID_STATE: the method is not allowed before/after framework init. */
  invalidState: -1,
} as const;

/** Linux errno values the emulated target reports, by name. */
export const Errno = {
  EPERM: 1,
  ENOENT: 2,
  EIO: 5,
  ENXIO: 6,
  ENOMEM: 12,
  EACCES: 13,
  EBUSY: 16,
  EEXIST: 17,
  ENODEV: 19,
  ENOTDIR: 20,
  EINVAL: 22,
  ENOSPC: 28,
  EOPNOTSUPP: 95,
  EADDRNOTAVAIL: 99,
  ETIMEDOUT: 110,
  ECONNREFUSED: 111,
  EALREADY: 114,
  EREMOTEIO: 121,
  ENOKEY: 126,
} as const;

/**
 * The errno the fabric carries for an NVMe path status (Status Code Type 3h: an ANA
 * inaccessible, persistent loss or transition answer). An initiator may retry it on another path.
 */
export const PATH_ERRNO = Errno.EREMOTEIO;

const STRERROR: Readonly<Record<number, string>> = {
  1: "Operation not permitted",
  2: "No such file or directory",
  5: "Input/output error",
  6: "No such device or address",
  12: "Cannot allocate memory",
  13: "Permission denied",
  16: "Device or resource busy",
  17: "File exists",
  19: "No such device",
  20: "Not a directory",
  22: "Invalid argument",
  28: "No space left on device",
  95: "Operation not supported",
  99: "Cannot assign requested address",
  110: "Connection timed out",
  111: "Connection refused",
  114: "Operation already in progress",
  121: "Remote I/O error",
  126: "Required key not available",
};

/** glibc's strerror() text for a positive errno; unknown values read like glibc's fallback. */
export function strerror(errno: number): string {
  return STRERROR[errno] ?? `Unknown error ${errno}`;
}

/**
 * An error reply: thrown by method handlers and models, turned into `{"code","message"}` by the
 * RPC server. Anything else thrown by a handler becomes -32603 "Internal error".
 */
export class RpcError extends Error {
  override readonly name = "RpcError";
  readonly code: number;

  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }

  /** The errno-style reply SPDK sends for `rc = -errno`: code -errno, message strerror(errno). */
  static errno(errno: number): RpcError {
    return new RpcError(-errno, strerror(errno));
  }

  /** A fixed JSON-RPC code whose message is strerror(errno), as async lvol failures report. */
  static coded(code: number, errno: number): RpcError {
    return new RpcError(code, strerror(errno));
  }

  /** -32602 "Invalid parameters", the generic answer of most nvmf methods. */
  static invalidParams(): RpcError {
    return new RpcError(RpcCode.invalidParams, "Invalid parameters");
  }

  /** -32603 "Internal error". */
  static internal(): RpcError {
    return new RpcError(RpcCode.internalError, "Internal error");
  }
}

/**
 * A failure inside a model that carries an errno (for example ENOSPC while allocating a cluster).
 * Handlers translate it into the reply their SPDK counterpart would send.
 */
export class ErrnoError extends Error {
  override readonly name = "ErrnoError";
  readonly errno: number;

  constructor(errno: number, detail?: string) {
    super(detail ? `${strerror(errno)}: ${detail}` : strerror(errno));
    this.errno = errno;
  }
}

/** The errno of an ErrnoError, or EIO for anything else (an I/O path that failed unexpectedly). */
export function errnoOf(err: unknown): number {
  return err instanceof ErrnoError ? err.errno : Errno.EIO;
}
