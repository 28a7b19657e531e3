// NVMe DH-HMAC-CHAP (NVMe Base Specification, "DH-HMAC-CHAP protocol"): the DHHC-1 secret
// representation, key generation, the key transformation and the host and controller responses,
// with the augmented challenge when a DH group is used. Pure functions over bytes.
import { createHash, createHmac, randomBytes } from "node:crypto";
import { StorageError } from "../errors.ts";

/** Hash function identifiers of the HashID field (and of the secret's transformation hash). */
export type HashId = 1 | 2 | 3;
/** The secret's transformation hash: 0 = the key is used as it is. */
export type KeyHashId = 0 | HashId;

interface HashInfo {
  readonly name: "sha256" | "sha384" | "sha512";
  readonly length: 32 | 48 | 64;
}

/** Hash ids to their function and digest length (= challenge and response length). */
export const DHCHAP_HASHES: Readonly<Record<HashId, HashInfo>> = {
  1: { name: "sha256", length: 32 },
  2: { name: "sha384", length: 48 },
  3: { name: "sha512", length: 64 },
};

/** The HMAC names Linux nvmet's configfs dhchap_hash takes. */
export const DHCHAP_HMAC_NAMES: Readonly<Record<HashId, string>> = {
  1: "hmac(sha256)",
  2: "hmac(sha384)",
  3: "hmac(sha512)",
};

/** The hash info for `id`; StorageError invalid for anything but 1..3. */
export function dhchapHash(id: number): HashInfo {
  const h = DHCHAP_HASHES[id as HashId];
  if (!h) throw new StorageError("invalid", `DH-HMAC-CHAP hash id ${id} is not defined`);
  return h;
}

/** A parsed DH-HMAC-CHAP secret: the key bytes and the hash that transforms them. */
export interface DhchapKey {
  readonly hash: KeyHashId;
  readonly key: Buffer;
}

const SECRET = /^DHHC-1:(\d\d):([A-Za-z0-9+/]+={0,2}):$/;

/**
 * Parses "DHHC-1:<hh>:<base64 of key || CRC-32(key) little-endian>:". Refuses, with StorageError
 * invalid and a message that never contains the key, what nvme-cli's check-dhchap-key refuses:
 * another header, hh above 03, a key that is not 32, 48 or 64 bytes, a key whose length differs
 * from the transformation hash's digest length (hh 01..03), a CRC mismatch. Surrounding
 * whitespace (a key file's trailing newline) is ignored.
 */
export function parseDhchapSecret(secret: string): DhchapKey {
  const m = SECRET.exec(secret.trim());
  if (!m) throw new StorageError("invalid", "a DH-HMAC-CHAP secret has the form DHHC-1:<hh>:<base64>:");
  const hash = Number(m[1]);
  if (hash > 3) throw new StorageError("invalid", `DH-HMAC-CHAP secret hash id ${hash} is not defined`);
  const raw = Buffer.from(m[2] as string, "base64");
  if (raw.length !== 36 && raw.length !== 52 && raw.length !== 68) {
    throw new StorageError("invalid", `DH-HMAC-CHAP key of ${raw.length - 4} bytes (32, 48 or 64 expected)`);
  }
  const key = raw.subarray(0, raw.length - 4);
  if (hash !== 0 && key.length !== dhchapHash(hash).length) {
    throw new StorageError(
      "invalid",
      `a ${key.length}-byte DH-HMAC-CHAP key cannot use transformation hash ${dhchapHash(hash).name}`,
    );
  }
  if (raw.readUInt32LE(key.length) !== crc32(key))
    throw new StorageError("invalid", "DH-HMAC-CHAP key CRC mismatch");
  return { hash: hash as KeyHashId, key: Buffer.from(key) };
}

/** The DHHC-1 text of `k` (the inverse of parseDhchapSecret). */
export function formatDhchapSecret(k: DhchapKey): string {
  const crc = Buffer.alloc(4);
  crc.writeUInt32LE(crc32(k.key));
  return `DHHC-1:0${k.hash}:${Buffer.concat([k.key, crc]).toString("base64")}:`;
}

/**
 * A new random secret in DHHC-1 form. `hash` is the transformation hash (default 0, none);
 * `length` defaults to that hash's digest length, or 32 with none. StorageError invalid for a
 * length that does not fit the hash. `random` is the entropy source (crypto.randomBytes).
 */
export function generateDhchapSecret(
  opts: { hash?: KeyHashId; length?: 32 | 48 | 64; random?: (n: number) => Buffer } = {},
): string {
  const hash = opts.hash ?? 0;
  const length = opts.length ?? (hash === 0 ? 32 : dhchapHash(hash).length);
  if (![32, 48, 64].includes(length) || (hash !== 0 && length !== dhchapHash(hash).length)) {
    throw new StorageError("invalid", `a ${length}-byte key cannot use transformation hash ${hash}`);
  }
  const key = (opts.random ?? randomBytes)(length);
  if (key.length !== length) throw new StorageError("internal", "short random read");
  return formatDhchapSecret({ hash, key });
}

/**
 * The transformed key: HMAC with the secret's hash, keyed by the secret, over the NQN (host NQN
 * for the host key, subsystem NQN for the controller key) and "NVMe-over-Fabrics"; the key as it
 * is when the secret's hash is 0.
 */
export function transformDhchapKey(k: DhchapKey, nqn: string): Buffer {
  if (k.hash === 0) return Buffer.from(k.key);
  return createHmac(dhchapHash(k.hash).name, k.key).update(nqn).update("NVMe-over-Fabrics").digest();
}

/**
 * The augmented challenge of a DH exchange: HMAC over the challenge keyed by the hash of the
 * shared DH value (both with the negotiated hash).
 */
export function augmentedChallenge(hash: HashId, sharedValue: Uint8Array, challenge: Uint8Array): Buffer {
  const h = dhchapHash(hash).name;
  return createHmac(h, createHash(h).update(sharedValue).digest()).update(challenge).digest();
}

/** Inputs of one response computation. */
export interface ResponseInput {
  /** The negotiated hash (HashID of the challenge). */
  readonly hash: HashId;
  /** The transformed key (transformDhchapKey) of the side that answers. */
  readonly transformedKey: Uint8Array;
  /** The challenge as received (C1 for the host, C2 for the controller). */
  readonly challenge: Uint8Array;
  /** The challenge's sequence number (S1, S2). */
  readonly seqnum: number;
  readonly transactionId: number;
  readonly hostnqn: string;
  readonly subnqn: string;
  /** The shared DH value; when given the challenge is augmented first. */
  readonly sharedValue?: Uint8Array;
}

/**
 * The host's response R1 = HMAC(Kh, C1' || S1 (LE32) || T_ID (LE16) || SC_C (0) || "HostHost" ||
 * host NQN || 0x00 || subsystem NQN), C1' the (augmented) challenge.
 */
export function hostResponse(i: ResponseInput): Buffer {
  return respond(i, "HostHost", i.hostnqn, i.subnqn);
}

/**
 * The controller's response R2 = HMAC(Kc, C2' || S2 || T_ID || SC_C (0) || "Controller" ||
 * subsystem NQN || 0x00 || host NQN).
 */
export function controllerResponse(i: ResponseInput): Buffer {
  return respond(i, "Controller", i.subnqn, i.hostnqn);
}

function respond(i: ResponseInput, label: string, first: string, second: string): Buffer {
  const h = dhchapHash(i.hash);
  if (i.challenge.length !== h.length) {
    throw new StorageError("invalid", `challenge of ${i.challenge.length} bytes for ${h.name}`);
  }
  const challenge = i.sharedValue ? augmentedChallenge(i.hash, i.sharedValue, i.challenge) : i.challenge;
  const fixed = Buffer.alloc(7);
  fixed.writeUInt32LE(i.seqnum >>> 0, 0);
  fixed.writeUInt16LE(i.transactionId & 0xffff, 4);
  // fixed[6]: SC_C, secure channel concatenation, not used.
  return createHmac(h.name, i.transformedKey)
    .update(challenge)
    .update(fixed)
    .update(label)
    .update(first)
    .update(Buffer.from([0]))
    .update(second)
    .digest();
}

/** Constant-time comparison of two responses. */
export function responsesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let k = 0; k < a.length; k++) diff |= (a[k] as number) ^ (b[k] as number);
  return diff === 0;
}

let crcTable: Uint32Array | undefined;

/** CRC-32 (IEEE 802.3, reflected, as zlib and the kernel's ~crc32(~0) compute it). */
export function crc32(data: Uint8Array): number {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const byte of data) crc = (crcTable[(crc ^ byte) & 0xff] as number) ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}
