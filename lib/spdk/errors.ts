// Error replies from SPDK's JSON-RPC server as StorageErrors. SPDK signals the same condition with
// different codes depending on the method (and different conditions with the same code), so the
// kind is derived from method, code and message together, following what v25.05.1 really sends.

import { type ErrorKind, StorageError } from "../errors.ts";
import { nqnProblem, UUID_NQN_PREFIX } from "./nqn.ts";

/** errno values SPDK returns as `code = -errno, message = strerror(errno)`, with their meaning. */
const ERRNO: ReadonlyMap<number, { text: string; kind: ErrorKind }> = new Map([
  [1, { text: "Operation not permitted", kind: "precondition" }], // base bdev claimed, key file mode
  [2, { text: "No such file or directory", kind: "not-found" }],
  [5, { text: "Input/output error", kind: "internal" }],
  [6, { text: "No such device or address", kind: "not-found" }],
  [12, { text: "Cannot allocate memory", kind: "exhausted" }],
  [13, { text: "Permission denied", kind: "precondition" }],
  [16, { text: "Device or resource busy", kind: "busy" }],
  [17, { text: "File exists", kind: "already-exists" }],
  [19, { text: "No such device", kind: "not-found" }],
  [22, { text: "Invalid argument", kind: "invalid" }],
  [28, { text: "No space left on device", kind: "exhausted" }],
  [34, { text: "Numerical result out of range", kind: "out-of-range" }],
  [95, { text: "Operation not supported", kind: "unimplemented" }],
  [107, { text: "Transport endpoint is not connected", kind: "unavailable" }],
  [110, { text: "Connection timed out", kind: "timeout" }],
  [111, { text: "Connection refused", kind: "unavailable" }],
  [114, { text: "Operation already in progress", kind: "already-exists" }],
  [126, { text: "Required key not available", kind: "not-found" }],
] as const);

const ERRNO_BY_TEXT: ReadonlyMap<string, number> = new Map(
  [...ERRNO.entries()].map(([errno, e]) => [e.text.toLowerCase(), errno]),
);

const ATTACH = "bdev_nvme_attach_controller";
/** nvmf methods whose generic "Invalid parameters" most likely means "already there". */
const NVMF_ADDS = new Set(["nvmf_subsystem_add_ns", "nvmf_subsystem_add_listener"]);

/**
 * The StorageError kind of an SPDK error reply. Pure. `params` (the request's params, optional)
 * only sharpens two replies whose message does not say which of two causes applies.
 *
 * Rules, from the v25.05.1 transcripts and SPDK's handlers:
 * - -32601 → unimplemented (method absent in this build or not in --rpcs-allowed);
 *   -32600 / -32700 → internal (the envelope is built by our client, so it is our bug).
 * - -1 → precondition: either the wrong startup phase ("Method may only be called before/after
 *   framework is initialized …") or EPERM (base bdev already claimed, key file mode).
 * - negative errno → by errno: -17 (lvols, lvstores, bdevs, keys) and -114 (controller attached
 *   twice) → already-exists; -19, -2, -6, -126 → not-found; -16 → busy; -28/-12 → exhausted;
 *   -22 → invalid, unless the message says "already exists"/"does not exist" (bdev_nvme).
 *   On bdev_nvme_attach_controller, -5 → precondition (the target refused this host NQN) and
 *   -19 → unavailable over a fabric (nothing listens at that address) but not-found for trtype
 *   PCIe (no controller at that PCI address: the drive is missing or not bound to SPDK).
 * - -32602: a strerror text (async lvol failures: "File exists", "No space left on device") →
 *   by errno; "… not found" → not-found; "Invalid transport type" → unimplemented; the generic
 *   "Invalid parameters" from nvmf methods → already-exists for add_ns/add_listener (callers
 *   list first, so the subsystem and bdev are known to exist), invalid for create_subsystem,
 *   not-found for everything else (delete/remove/get of something that is not there); else invalid.
 * - -32603: "Transport type … already exists" → already-exists; "Unable to create subsystem X" →
 *   already-exists when X is a well-formed NQN, else invalid; "Internal error" from
 *   nvmf_subsystem_add_host → already-exists (invalid when the host is a `:uuid:` NQN without a
 *   real UUID), from nvmf_subsystem_remove_host → not-found; decode failures → invalid; "another
 *   state change" / "being destroyed" → busy; a strerror text → by errno; else internal.
 * SNAP's SPDK (v23.01) sends some errno codes positive and appends "\n" to some messages: both
 * are normalised first.
 */
export function classifySpdkError(
  method: string,
  code: number,
  message: string,
  params?: unknown,
): ErrorKind {
  const msg = message.trim();
  const c = code > 0 && code < 4096 ? -code : code;
  switch (c) {
    case -32700:
    case -32600:
      return "internal";
    case -32601:
      return "unimplemented";
    case -32602:
      return invalidParamsKind(method, msg);
    case -32603:
      return internalErrorKind(method, msg, params);
    case -1:
      return "precondition";
  }
  if (method === ATTACH && c === -5) return "precondition";
  // Over PCIe, -19 is spdk_nvme_connect finding no controller at that address (SPDK logs "No
  // controller was found with provided trid"): the drive is missing or not bound to SPDK's
  // driver. Nothing short of an operator or a hotplug changes that, so it is not transient.
  if (method === ATTACH && c === -19) return isPcie(params) ? "not-found" : "unavailable";
  if (c === -22) {
    if (/already exists/i.test(msg)) return "already-exists";
    if (/does not exist/i.test(msg)) return "not-found";
    return "invalid";
  }
  return ERRNO.get(-c)?.kind ?? "internal";
}

function invalidParamsKind(method: string, msg: string): ErrorKind {
  const errno = ERRNO_BY_TEXT.get(msg.toLowerCase());
  if (errno !== undefined) return (ERRNO.get(errno) as { kind: ErrorKind }).kind;
  if (/\bnot found\b/i.test(msg)) return "not-found";
  if (/^Invalid transport type/i.test(msg)) return "unimplemented";
  if (msg === "Invalid parameters" && method.startsWith("nvmf_")) {
    if (NVMF_ADDS.has(method)) return "already-exists";
    if (method === "nvmf_create_subsystem" || method === "nvmf_create_transport") return "invalid";
    return "not-found";
  }
  return "invalid";
}

function internalErrorKind(method: string, msg: string, params: unknown): ErrorKind {
  if (/already exists/i.test(msg)) return "already-exists";
  const create = /^Unable to create subsystem (.*)$/s.exec(msg);
  if (create) return nqnProblem((create[1] as string).trim()) === undefined ? "already-exists" : "invalid";
  if (/spdk_json_decode_object failed|requires no parameters/i.test(msg)) return "invalid";
  if (/another state change|try again later|already being destroyed/i.test(msg)) return "busy";
  if (/timeout reached|timed out/i.test(msg)) return "timeout";
  if (msg === "Internal error" && method === "nvmf_subsystem_add_host") {
    const host = hostParam(params);
    return host?.startsWith(UUID_NQN_PREFIX) && nqnProblem(host) !== undefined ? "invalid" : "already-exists";
  }
  if (msg === "Internal error" && method === "nvmf_subsystem_remove_host") return "not-found";
  const errno = ERRNO_BY_TEXT.get(msg.toLowerCase());
  if (errno !== undefined) return (ERRNO.get(errno) as { kind: ErrorKind }).kind;
  return "internal";
}

/** The request named a local PCIe controller (trtype "PCIe", any case). */
function isPcie(params: unknown): boolean {
  if (typeof params !== "object" || params === null) return false;
  const trtype = (params as { trtype?: unknown }).trtype;
  return typeof trtype === "string" && trtype.toLowerCase() === "pcie";
}

/** The traddr of the request, when it is a string. */
function traddrParam(params: unknown): string | undefined {
  if (typeof params !== "object" || params === null) return undefined;
  const a = (params as { traddr?: unknown }).traddr;
  return typeof a === "string" ? a : undefined;
}

function hostParam(params: unknown): string | undefined {
  if (typeof params !== "object" || params === null) return undefined;
  const host = (params as { host?: unknown }).host;
  return typeof host === "string" ? host : undefined;
}

/**
 * What an operator needs to know that SPDK's message does not say, or undefined. Pure; used in
 * SpdkError's message so logs and conditions explain the ambiguous replies. `params` (the
 * request's) tells a PCIe attach from a fabric one and names the PCI address.
 */
export function spdkErrorHint(
  method: string,
  code: number,
  message: string,
  kind: ErrorKind,
  params?: unknown,
): string | undefined {
  const msg = message.trim();
  const c = code > 0 && code < 4096 ? -code : code;
  if (method === ATTACH && c === -5) {
    return "the target refused the connection: this host NQN is not allowed on the subsystem (not in its hosts list, allow_any_host false)";
  }
  if (method === ATTACH && c === -19 && isPcie(params)) {
    const at = traddrParam(params);
    return `no NVMe controller was found at PCI address ${at ?? "(not given)"}: the drive is missing, or not bound to a driver SPDK can use (vfio-pci or uio_pci_generic); SPDK logs "No controller was found with provided trid"`;
  }
  if (method === ATTACH && c === -19) return "nothing is listening at that address and port";
  if (c === -32601) return "this SPDK build does not offer the method (or it is not in --rpcs-allowed)";
  if (c === -1 && /framework is initialized/i.test(msg)) return "the target is in the wrong startup phase";
  if (c === -1 && method === "bdev_lvol_create_lvstore") {
    return "the base bdev is already claimed (it holds an lvstore or is exported as a namespace)";
  }
  if (c === -32602 && msg === "Invalid parameters" && NVMF_ADDS.has(method)) {
    return "SPDK answers the same for a duplicate, an unknown subsystem, a missing bdev or transport; re-read the subsystem to tell them apart";
  }
  if (c === -32602 && msg === "Invalid parameters" && kind === "not-found") {
    return "SPDK reports a subsystem, namespace or listener that does not exist as invalid parameters";
  }
  if (c === -32603 && method === "nvmf_create_subsystem" && kind === "already-exists") {
    return "a subsystem with this NQN most likely exists already (SPDK also says this when it has no free subsystem slot)";
  }
  if (c === -32603 && msg === "Internal error" && method === "nvmf_subsystem_add_host") {
    return kind === "invalid"
      ? `a host NQN starting "${UUID_NQN_PREFIX}" must end in a real UUID`
      : "the host is most likely allowed on this subsystem already";
  }
  if (c === -32603 && msg === "Internal error" && method === "nvmf_subsystem_remove_host") {
    return "the host is not in the subsystem's list";
  }
  return undefined;
}

/**
 * An error reply from SPDK: the code and message exactly as SPDK sent them, the method that failed,
 * and a StorageError kind from classifySpdkError. The message names the method and adds a hint
 * where SPDK's own text is ambiguous. Carries no request parameters (they may name key files).
 */
export class SpdkError extends StorageError {
  readonly code: number;
  readonly method: string;
  readonly spdkMessage: string;

  constructor(method: string, code: number, spdkMessage: string, opts: { params?: unknown } = {}) {
    const kind = classifySpdkError(method, code, spdkMessage, opts.params);
    const hint = spdkErrorHint(method, code, spdkMessage, kind, opts.params);
    const text = `${method} failed: SPDK error ${code} "${spdkMessage.trim()}"${hint ? ` (${hint})` : ""}`;
    super(kind, text, { details: { method, code, spdkMessage } });
    this.code = code;
    this.method = method;
    this.spdkMessage = spdkMessage;
  }
}
