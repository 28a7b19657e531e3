// The in-band authentication messages carried by Authentication Send/Receive (NVMe Base
// Specification, "Authentication Protocols"): AUTH_Negotiate, DH-HMAC-CHAP_Challenge, _Reply,
// _Success1, _Success2 and AUTH_Failure1/2, encoded byte for byte as the specification lays them out.
import { StorageError } from "../errors.ts";

/** AUTH_Type of common messages (negotiate, failures). */
export const AUTH_COMMON = 0x00;
/** AUTH_Type of DH-HMAC-CHAP messages. */
export const AUTH_DHCHAP = 0x01;
/** AUTH_ID of the DH-HMAC-CHAP protocol in a negotiate descriptor. */
export const DHCHAP_AUTH_ID = 0x01;

/** Message identifiers (AUTH_Id). */
export const AuthMessageId = {
  negotiate: 0x00,
  challenge: 0x01,
  reply: 0x02,
  success1: 0x03,
  success2: 0x04,
  failure2: 0xf0,
  failure1: 0xf1,
} as const;

/** AUTH_Failure reason code: authentication failure. */
export const FAILURE_REASON_FAILED = 0x01;

/** AUTH_Failure reason code explanations. */
export const FailureExplanation = {
  failed: 0x01,
  notUsable: 0x02,
  concatMismatch: 0x03,
  hashUnusable: 0x04,
  dhgroupUnusable: 0x05,
  incorrectPayload: 0x06,
  incorrectMessage: 0x07,
} as const;

/** One authentication message, decoded. Byte fields are raw. */
export type AuthMessage =
  | {
      readonly kind: "negotiate";
      readonly tid: number;
      /** Secure channel concatenation (0: none). */
      readonly scC: number;
      /** DH-HMAC-CHAP descriptors (one in practice): offered hash and DH group ids. */
      readonly protocols: readonly {
        readonly hashes: readonly number[];
        readonly dhgroups: readonly number[];
      }[];
    }
  | {
      readonly kind: "challenge";
      readonly tid: number;
      readonly hashId: number;
      readonly dhgroupId: number;
      readonly seqnum: number;
      readonly challenge: Buffer;
      readonly dhValue: Buffer;
    }
  | {
      readonly kind: "reply";
      readonly tid: number;
      readonly response: Buffer;
      /** C2 when the host asks the controller to authenticate too (CVALID). */
      readonly ctrlChallenge: Buffer | undefined;
      /** S2; 0 without a controller challenge. */
      readonly seqnum: number;
      readonly dhValue: Buffer;
    }
  | {
      readonly kind: "success1";
      readonly tid: number;
      readonly hashLength: number;
      readonly response: Buffer | undefined;
    }
  | { readonly kind: "success2"; readonly tid: number }
  | {
      readonly kind: "failure1" | "failure2";
      readonly tid: number;
      readonly reason: number;
      readonly explanation: number;
    };

/** Encodes `m` in its specification layout (little-endian fields, reserved bytes zero). */
export function encodeAuthMessage(m: AuthMessage): Buffer {
  switch (m.kind) {
    case "negotiate": {
      const b = Buffer.alloc(8 + 64 * m.protocols.length);
      head(b, AUTH_COMMON, AuthMessageId.negotiate, m.tid);
      b[6] = m.scC;
      b[7] = m.protocols.length;
      m.protocols.forEach((p, k) => {
        const at = 8 + 64 * k;
        if (p.hashes.length > 30 || p.dhgroups.length > 30)
          throw new StorageError("invalid", "id list too long");
        b[at] = DHCHAP_AUTH_ID;
        b[at + 2] = p.hashes.length;
        b[at + 3] = p.dhgroups.length;
        b.set(p.hashes, at + 4);
        b.set(p.dhgroups, at + 4 + 30);
      });
      return b;
    }
    case "challenge": {
      const b = Buffer.alloc(16 + m.challenge.length + m.dhValue.length);
      head(b, AUTH_DHCHAP, AuthMessageId.challenge, m.tid);
      b[6] = m.challenge.length;
      b[8] = m.hashId;
      b[9] = m.dhgroupId;
      b.writeUInt16LE(m.dhValue.length, 10);
      b.writeUInt32LE(m.seqnum >>> 0, 12);
      m.challenge.copy(b, 16);
      m.dhValue.copy(b, 16 + m.challenge.length);
      return b;
    }
    case "reply": {
      const hl = m.response.length;
      const b = Buffer.alloc(16 + 2 * hl + m.dhValue.length);
      head(b, AUTH_DHCHAP, AuthMessageId.reply, m.tid);
      b[6] = hl;
      b[8] = m.ctrlChallenge ? 1 : 0;
      b.writeUInt16LE(m.dhValue.length, 10);
      b.writeUInt32LE(m.seqnum >>> 0, 12);
      m.response.copy(b, 16);
      m.ctrlChallenge?.copy(b, 16 + hl);
      m.dhValue.copy(b, 16 + 2 * hl);
      return b;
    }
    case "success1": {
      const b = Buffer.alloc(16 + (m.response ? m.response.length : 0));
      head(b, AUTH_DHCHAP, AuthMessageId.success1, m.tid);
      b[6] = m.hashLength;
      b[8] = m.response ? 1 : 0;
      m.response?.copy(b, 16);
      return b;
    }
    case "success2": {
      const b = Buffer.alloc(16);
      head(b, AUTH_DHCHAP, AuthMessageId.success2, m.tid);
      return b;
    }
    case "failure1":
    case "failure2": {
      const b = Buffer.alloc(8);
      head(b, AUTH_COMMON, m.kind === "failure1" ? AuthMessageId.failure1 : AuthMessageId.failure2, m.tid);
      b[6] = m.reason;
      b[7] = m.explanation;
      return b;
    }
  }
}

/**
 * Decodes one message. StorageError invalid for an unknown type/id pair or lengths that do not
 * add up (the receiver answers those with a failure, incorrect payload).
 */
export function decodeAuthMessage(b: Buffer): AuthMessage {
  if (b.length < 8) throw bad("message shorter than its header");
  const type = b[0] as number;
  const id = b[1] as number;
  const tid = b.readUInt16LE(4);
  if (type === AUTH_COMMON && id === AuthMessageId.negotiate) {
    const napd = b[7] as number;
    if (b.length < 8 + 64 * napd) throw bad("negotiate descriptors truncated");
    const protocols = [];
    for (let k = 0; k < napd; k++) {
      const at = 8 + 64 * k;
      if (b[at] !== DHCHAP_AUTH_ID) continue;
      const halen = b[at + 2] as number;
      const dhlen = b[at + 3] as number;
      if (halen > 30 || dhlen > 30) throw bad("id list too long");
      protocols.push({
        hashes: [...b.subarray(at + 4, at + 4 + halen)],
        dhgroups: [...b.subarray(at + 34, at + 34 + dhlen)],
      });
    }
    return { kind: "negotiate", tid, scC: b[6] as number, protocols };
  }
  if (type === AUTH_COMMON && (id === AuthMessageId.failure1 || id === AuthMessageId.failure2)) {
    return {
      kind: id === AuthMessageId.failure1 ? "failure1" : "failure2",
      tid,
      reason: b[6] as number,
      explanation: b[7] as number,
    };
  }
  if (type !== AUTH_DHCHAP) throw bad(`unknown message ${type}/${id}`);
  if (b.length < 16) throw bad("message shorter than its header");
  const hl = b[6] as number;
  switch (id) {
    case AuthMessageId.challenge: {
      const dhvlen = b.readUInt16LE(10);
      if (b.length !== 16 + hl + dhvlen) throw bad("challenge length");
      return {
        kind: "challenge",
        tid,
        hashId: b[8] as number,
        dhgroupId: b[9] as number,
        seqnum: b.readUInt32LE(12),
        challenge: Buffer.from(b.subarray(16, 16 + hl)),
        dhValue: Buffer.from(b.subarray(16 + hl)),
      };
    }
    case AuthMessageId.reply: {
      const dhvlen = b.readUInt16LE(10);
      if (b.length !== 16 + 2 * hl + dhvlen) throw bad("reply length");
      return {
        kind: "reply",
        tid,
        response: Buffer.from(b.subarray(16, 16 + hl)),
        ctrlChallenge: b[8] ? Buffer.from(b.subarray(16 + hl, 16 + 2 * hl)) : undefined,
        seqnum: b.readUInt32LE(12),
        dhValue: Buffer.from(b.subarray(16 + 2 * hl)),
      };
    }
    case AuthMessageId.success1: {
      const rvalid = b[8] !== 0;
      if (b.length !== 16 + (rvalid ? hl : 0)) throw bad("success1 length");
      return {
        kind: "success1",
        tid,
        hashLength: hl,
        response: rvalid ? Buffer.from(b.subarray(16, 16 + hl)) : undefined,
      };
    }
    case AuthMessageId.success2:
      return { kind: "success2", tid };
    default:
      throw bad(`unknown DH-HMAC-CHAP message ${id}`);
  }
}

function head(b: Buffer, type: number, id: number, tid: number): void {
  b[0] = type;
  b[1] = id;
  b.writeUInt16LE(tid & 0xffff, 4);
}

function bad(what: string): StorageError {
  return new StorageError("invalid", `authentication message: ${what}`);
}
