// The wire protocol of the simulated NVMe-oF fabric: length-prefixed frames carrying connect of an
// admin or I/O queue (host NQN against the target's ACL, then DH-HMAC-CHAP when the host has a key;
// an I/O queue naming its controller), namespace identity and change notices as JSON headers, and
// the block commands (read, write, flush, deallocate, write zeroes), keep-alive and their
// completions as fixed binary capsules; either may be followed by raw data bytes.
import * as v from "valibot";

/** Namespace identity as a controller reports it (Identify Namespace, reduced). */
export const NamespaceInfoSchema = v.object({
  nsid: v.number(),
  uuid: v.string(),
  /** 32 uppercase hex digits. */
  nguid: v.string(),
  blockSize: v.number(),
  numBlocks: v.number(),
});
export type NamespaceInfo = v.InferOutput<typeof NamespaceInfoSchema>;

/** Controller identity (Identify Controller, reduced). */
export const ControllerInfoSchema = v.object({
  cntlid: v.number(),
  vendorId: v.string(),
  modelNumber: v.string(),
  serialNumber: v.string(),
  firmwareRevision: v.string(),
  subnqn: v.string(),
  nvmeVersion: v.string(),
  /** ONCS Dataset Management: every namespace's bdev supports unmap (nvmf_ctrlr_dsm_supported). */
  dsm: v.optional(v.boolean()),
});
export type ControllerInfo = v.InferOutput<typeof ControllerInfoSchema>;

/** ANA states as the ANA log page reports them per group (NVMe base spec 8.20). */
export const AnaStateSchema = v.picklist([
  "optimized",
  "non_optimized",
  "inaccessible",
  "persistent_loss",
  "change",
]);
export type AnaState = v.InferOutput<typeof AnaStateSchema>;

/** Every message either side sends. `tag` pairs a reply with its request. */
export const MessageSchema = v.variant("op", [
  v.object({
    op: v.literal("connect"),
    tag: v.number(),
    subnqn: v.string(),
    hostnqn: v.string(),
    hostid: v.string(),
    /** The initiator's source address, as the target reports its peer. */
    peerAddress: v.string(),
    peerPort: v.string(),
    /** Queue ID: 0 (default) the admin queue, which creates a controller; >0 an I/O queue. */
    qid: v.optional(v.number()),
    /** For an I/O queue: the controller it belongs to (the cntlid its admin queue got). */
    cntlid: v.optional(v.number()),
    /** Keep Alive Timeout in ms (admin queue); 0 or absent: none. */
    kato: v.optional(v.number()),
  }),
  v.object({
    op: v.literal("read"),
    tag: v.number(),
    nsid: v.number(),
    offset: v.number(),
    length: v.number(),
  }),
  v.object({ op: v.literal("write"), tag: v.number(), nsid: v.number(), offset: v.number() }),
  v.object({ op: v.literal("flush"), tag: v.number(), nsid: v.number() }),
  /** Dataset Management with the Deallocate attribute, one range. */
  v.object({
    op: v.literal("discard"),
    tag: v.number(),
    nsid: v.number(),
    offset: v.number(),
    length: v.number(),
  }),
  v.object({
    op: v.literal("write_zeroes"),
    tag: v.number(),
    nsid: v.number(),
    offset: v.number(),
    length: v.number(),
  }),
  v.object({ op: v.literal("keep_alive"), tag: v.number() }),
  v.object({
    op: v.literal("connected"),
    tag: v.number(),
    ctrlr: ControllerInfoSchema,
    namespaces: v.array(NamespaceInfoSchema),
    /** The ANA state of the listener this controller connected through (ana_reporting subsystems). */
    anaState: v.optional(AnaStateSchema),
  }),
  /** CONNECT refused: unknown subsystem, listener not allowed or host not allowed. */
  v.object({ op: v.literal("rejected"), tag: v.number(), reason: v.string() }),
  v.object({ op: v.literal("data"), tag: v.number() }),
  /** CONNECT accepted, but the host must authenticate first (AUTHREQ.ATR); then it connects again. */
  v.object({ op: v.literal("auth_required"), tag: v.number() }),
  /** Authentication Send: the payload is one message (lib/nvme/dhchap-messages.ts); reply ok. */
  v.object({ op: v.literal("auth_send"), tag: v.number() }),
  /** Authentication Receive: the reply is "data" carrying one message. */
  v.object({ op: v.literal("auth_receive"), tag: v.number() }),
  /**
   * Stand-in for a TLS 1.3 ClientHello with one external PSK (fabric-tls.ts): the PSK identity,
   * the client's nonce and its binder (hex). Only as the first frame on a secure listener.
   */
  v.object({
    op: v.literal("tls_client_hello"),
    tag: v.number(),
    identity: v.string(),
    nonce: v.string(),
    binder: v.string(),
  }),
  /** The server's answer: its nonce and its Finished MAC (hex) over both nonces. */
  v.object({ op: v.literal("tls_server_hello"), tag: v.number(), nonce: v.string(), finished: v.string() }),
  v.object({ op: v.literal("ok"), tag: v.number() }),
  v.object({ op: v.literal("error"), tag: v.number(), errno: v.number() }),
  /** Unsolicited: the ANA state of this controller's listener changed (an ANA change AEN). */
  v.object({ op: v.literal("ana"), anaState: AnaStateSchema }),
  /** Unsolicited: the namespace list changed (added, removed or resized). */
  v.object({ op: v.literal("namespaces"), namespaces: v.array(NamespaceInfoSchema) }),
]);
export type Message = v.InferOutput<typeof MessageSchema>;

/** A decoded frame. */
export interface Frame {
  readonly msg: Message;
  readonly payload: Buffer;
}

/**
 * The second word of a binary capsule frame, where a JSON frame has its header length (which can
 * never be this large: a frame is at most MAX_FRAME bytes).
 */
const CAPSULE_MARK = 0xffffffff;
/** Capsule bytes after the two leading words: opcode, 3 reserved, tag, nsid or errno, reserved, offset, length. */
const CAPSULE_SIZE = 32;
/** The largest frame either side accepts (a command carries at most the FUSE max_write, 1 MiB). */
export const MAX_FRAME = 64 * 1024 * 1024;

type CapsuleOp =
  | "read"
  | "write"
  | "flush"
  | "discard"
  | "write_zeroes"
  | "keep_alive"
  | "data"
  | "ok"
  | "error";

// NVMe opcodes for the commands (NVM command set: Flush 00h, Write 01h, Read 02h, Write Zeroes 08h,
// Dataset Management 09h; admin Keep Alive 18h); the completions have codes of their own.
const OPCODE: Record<CapsuleOp, number> = {
  flush: 0x00,
  write: 0x01,
  read: 0x02,
  write_zeroes: 0x08,
  discard: 0x09,
  keep_alive: 0x18,
  data: 0xc0,
  ok: 0xc1,
  error: 0xc2,
};
const OP_OF = new Map<number, CapsuleOp>(Object.entries(OPCODE).map(([k, v]) => [v, k as CapsuleOp]));

const u32 = (n: unknown): n is number =>
  typeof n === "number" && Number.isInteger(n) && n >= 0 && n <= 0xffffffff;
const u53 = (n: unknown): n is number => typeof n === "number" && Number.isSafeInteger(n) && n >= 0;

/**
 * The capsule for `msg` when it is a block command, keep-alive or completion whose numbers fit
 * (tag, nsid and errno 32 bits, offset and length safe integers); undefined otherwise (JSON then).
 */
function capsuleOf(msg: Message): Buffer | undefined {
  const op = OPCODE[msg.op as CapsuleOp];
  if (op === undefined || !("tag" in msg) || !u32(msg.tag)) return undefined;
  const m = msg as { nsid?: number; errno?: number; offset?: number; length?: number };
  const word = msg.op === "error" ? m.errno : (m.nsid ?? 0);
  const offset = m.offset ?? 0;
  const length = m.length ?? 0;
  if (!u32(word) || !u53(offset) || !u53(length)) return undefined;
  const c = Buffer.alloc(CAPSULE_SIZE);
  c[0] = op;
  c.writeUInt32BE(msg.tag, 4);
  c.writeUInt32BE(word, 8);
  c.writeBigUInt64BE(BigInt(offset), 16);
  c.writeBigUInt64BE(BigInt(length), 24);
  return c;
}

/** The message a capsule stands for, with exactly the fields its JSON form has. */
function messageOfCapsule(c: Buffer): Message {
  const op = OP_OF.get(c[0] as number);
  if (op === undefined) throw new FrameError(`unknown capsule opcode ${c[0]}`);
  const tag = c.readUInt32BE(4);
  const word = c.readUInt32BE(8);
  const offset = Number(c.readBigUInt64BE(16));
  const length = Number(c.readBigUInt64BE(24));
  if (!u53(offset) || !u53(length)) throw new FrameError("capsule offset or length out of range");
  switch (op) {
    case "read":
    case "discard":
    case "write_zeroes":
      return { op, tag, nsid: word, offset, length };
    case "write":
      return { op, tag, nsid: word, offset };
    case "flush":
      return { op, tag, nsid: word };
    case "error":
      return { op, tag, errno: word };
    default:
      return { op, tag };
  }
}

/**
 * Encodes one frame: u32 BE length of the rest, then either (block commands, keep-alive and their
 * completions) the mark 0xffffffff and a 32-byte binary capsule, or (everything else) u32 BE
 * header length and the header's JSON; then the payload.
 */
export function encodeFrame(msg: Message, payload: Uint8Array = new Uint8Array(0)): Buffer {
  return Buffer.concat(encodeFrameParts(msg, payload, Number.POSITIVE_INFINITY));
}

/** Payloads from this size on are written after their header rather than copied behind it. */
const SEPARATE_PAYLOAD = 32 * 1024;

/**
 * The same frame as encodeFrame, as byte runs to write in order: the header with a payload smaller
 * than `separateFrom` bytes copied behind it, or the header and the caller's payload itself
 * (not copied; it must not change until written).
 */
export function encodeFrameParts(
  msg: Message,
  payload: Uint8Array = new Uint8Array(0),
  separateFrom = SEPARATE_PAYLOAD,
): Uint8Array[] {
  const capsule = capsuleOf(msg);
  const header = capsule ?? Buffer.from(JSON.stringify(msg));
  const apart = payload.length >= separateFrom;
  const out = Buffer.allocUnsafe(8 + header.length + (apart ? 0 : payload.length));
  out.writeUInt32BE(4 + header.length + payload.length, 0);
  out.writeUInt32BE(capsule ? CAPSULE_MARK : header.length, 4);
  header.copy(out, 8);
  if (apart) return [out, payload];
  out.set(payload, 8 + header.length);
  return [out];
}

/** Protocol violation by the peer; the connection is dropped. */
export class FrameError extends Error {}

const EMPTY = Buffer.alloc(0);

/** Decodes one whole frame (length word included). */
function decodeFrame(f: Buffer): Frame {
  const len = f.length - 4;
  const second = f.readUInt32BE(4);
  if (second === CAPSULE_MARK) {
    if (len < 4 + CAPSULE_SIZE) throw new FrameError(`capsule frame of ${len} bytes`);
    return { msg: messageOfCapsule(f.subarray(8, 8 + CAPSULE_SIZE)), payload: f.subarray(8 + CAPSULE_SIZE) };
  }
  if (second > len - 4) throw new FrameError(`header length ${second}`);
  const header = f.subarray(8, 8 + second).toString("utf8");
  let parsed: unknown;
  try {
    parsed = JSON.parse(header);
  } catch {
    throw new FrameError("header is not JSON");
  }
  const r = v.safeParse(MessageSchema, parsed);
  if (!r.success) throw new FrameError(`unknown message ${header.slice(0, 80)}`);
  return { msg: r.output, payload: f.subarray(8 + second) };
}

/**
 * Reassembles frames from a byte stream, copying each byte at most once: a frame inside one chunk
 * is decoded in place (its payload is a view of that chunk, so pushed chunks must not be reused
 * by the caller; socket chunks never are), one spanning chunks is gathered into its own buffer.
 */
export class FrameDecoder {
  /** The start of a frame shorter than its length word. */
  #head: Buffer = EMPTY;
  /** The frame being gathered, and how much of it has arrived. */
  #frame: Buffer | undefined;
  #filled = 0;

  /** Adds received bytes and returns the frames completed by them; FrameError on garbage. */
  push(chunk: Uint8Array): Frame[] {
    let data = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const frames: Frame[] = [];
    while (data.length > 0) {
      if (this.#frame) {
        const n = Math.min(this.#frame.length - this.#filled, data.length);
        data.copy(this.#frame, this.#filled, 0, n);
        this.#filled += n;
        data = data.subarray(n);
        if (this.#filled < this.#frame.length) break;
        const whole = this.#frame;
        this.#frame = undefined;
        frames.push(decodeFrame(whole));
        continue;
      }
      if (this.#head.length > 0) {
        data = Buffer.concat([this.#head, data]);
        this.#head = EMPTY;
      }
      if (data.length < 8) {
        this.#head = Buffer.from(data);
        break;
      }
      const len = data.readUInt32BE(0);
      if (len < 4 || len > MAX_FRAME) throw new FrameError(`frame length ${len}`);
      if (data.length >= 4 + len) {
        frames.push(decodeFrame(data.subarray(0, 4 + len)));
        data = data.subarray(4 + len);
        continue;
      }
      this.#frame = Buffer.allocUnsafe(4 + len);
      data.copy(this.#frame, 0);
      this.#filled = data.length;
      break;
    }
    return frames;
  }
}
