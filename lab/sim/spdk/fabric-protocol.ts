// The wire protocol of the simulated NVMe-oF fabric: length-prefixed frames, each a JSON header
// plus optional raw bytes, carrying connect of an admin or I/O queue (host NQN against the target's
// ACL, then DH-HMAC-CHAP when the host has a key; an I/O queue naming its controller), namespace identity, keep-alive, the block commands
// (read, write, flush, deallocate, write zeroes) and namespace and ANA change notices.
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

/** Encodes one frame: u32 BE length of the rest, u32 BE header length, header JSON, payload. */
export function encodeFrame(msg: Message, payload: Uint8Array = new Uint8Array(0)): Buffer {
  const header = Buffer.from(JSON.stringify(msg));
  const out = Buffer.alloc(8 + header.length + payload.length);
  out.writeUInt32BE(4 + header.length + payload.length, 0);
  out.writeUInt32BE(header.length, 4);
  header.copy(out, 8);
  out.set(payload, 8 + header.length);
  return out;
}

/** Protocol violation by the peer; the connection is dropped. */
export class FrameError extends Error {}

/** Reassembles frames from a byte stream. */
export class FrameDecoder {
  #buf: Buffer = Buffer.alloc(0);

  /** Adds received bytes and returns the frames completed by them; FrameError on garbage. */
  push(chunk: Uint8Array): Frame[] {
    this.#buf = this.#buf.length === 0 ? Buffer.from(chunk) : Buffer.concat([this.#buf, chunk]);
    const frames: Frame[] = [];
    while (this.#buf.length >= 4) {
      const len = this.#buf.readUInt32BE(0);
      if (len < 4) throw new FrameError(`frame length ${len}`);
      if (this.#buf.length < 4 + len) break;
      const hlen = this.#buf.readUInt32BE(4);
      if (hlen > len - 4) throw new FrameError(`header length ${hlen}`);
      const header = this.#buf.subarray(8, 8 + hlen).toString("utf8");
      const payload = Buffer.from(this.#buf.subarray(8 + hlen, 4 + len));
      this.#buf = this.#buf.subarray(4 + len);
      let parsed: unknown;
      try {
        parsed = JSON.parse(header);
      } catch {
        throw new FrameError("header is not JSON");
      }
      const r = v.safeParse(MessageSchema, parsed);
      if (!r.success) throw new FrameError(`unknown message ${header.slice(0, 80)}`);
      frames.push({ msg: r.output, payload });
    }
    return frames;
  }
}
