// DH-HMAC-CHAP pinned by values computed outside DISTORT: DHHC-1 secrets printed and judged by
// Debian's nvme-cli 2.3 (gen-dhchap-key / check-dhchap-key), responses and DH values from
// testdata/dhchap-vectors.py (Python hmac/hashlib/pow, primes from OpenSSL 3.0.19).
import { describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  augmentedChallenge,
  controllerResponse,
  crc32,
  formatDhchapSecret,
  generateDhchapSecret,
  type HashId,
  hostResponse,
  parseDhchapSecret,
  responsesEqual,
  transformDhchapKey,
} from "./dhchap.ts";
import { AuthMessageId, decodeAuthMessage, encodeAuthMessage } from "./dhchap-messages.ts";
import { dhKeyPair, dhSharedValue, FFDHE_GROUPS, ffdheGroup } from "./ffdhe.ts";

interface NullCase {
  hash: HashId;
  keyHash: number;
  hostSecret: string;
  ctrlSecret: string;
  transformedHostKey: string;
  transformedCtrlKey: string;
  c1: string;
  c2: string;
  hostResponse: string;
  ctrlResponse: string;
}
interface DhCase extends Omit<NullCase, "keyHash" | "transformedHostKey" | "transformedCtrlKey"> {
  dhgroup: 1 | 2;
  primeSha256: string;
  hostPrivate: string;
  ctrlPrivate: string;
  hostPublicSha256: string;
  ctrlPublicSha256: string;
  sharedSha256: string;
  augmentedC1: string;
  augmentedC2: string;
}
const V = JSON.parse(readFileSync(join(import.meta.dir, "testdata", "dhchap-vectors.json"), "utf8")) as {
  hostnqn: string;
  subnqn: string;
  seq1: number;
  seq2: number;
  tid: number;
  null: NullCase[];
  dh: DhCase[];
  primeSha256: Record<string, string>;
};

const hex = (s: string) => Buffer.from(s, "hex");
const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const NQN = "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-4978-8a1b-2c3d4e5f6a7b";

// `nvme gen-dhchap-key -s <hex> -l <len> -m <hh> [-n NQN]` (nvme-cli 2.3, libnvme 1.3), secret
// 00 01 02 ... (len bytes). With -m 1..3 nvme-cli prints the key already transformed with -n.
const NVME_CLI_GEN = [
  { hh: 0, len: 32, nqn: undefined, out: "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:" },
  { hh: 1, len: 32, nqn: NQN, out: "DHHC-1:01:kDUcKPyAUxGsi6JC8EJXGYo3jE2kwbTgQYwsaCFmXtjqQ+IO:" },
  {
    hh: 2,
    len: 48,
    nqn: NQN,
    out: "DHHC-1:02:maa38QzFv3o1em7Xie7In3Q7NqoAhuw4ISMdCxqGbpQmO0uPYQAtXlppwXY9b3xsocqZtw==:",
  },
  {
    hh: 3,
    len: 64,
    nqn: NQN,
    out: "DHHC-1:03:ros1vselRuc8a9aXOTaoFZB4ZuXyd2B+od6RficJvU1Uy3BtGT6UQ0CAEU8/Y0g3lpyGz1w/uJuNkZRGCnEKvjYaoEc=:",
  },
] as const;

// `nvme check-dhchap-key -k <key>`: what it prints for each.
const NVME_CLI_CHECK: readonly [string, string][] = [
  [NVME_CLI_GEN[0].out, "Key is valid (HMAC 0, length 32, CRC 91267e8a)"],
  [NVME_CLI_GEN[1].out, "Key is valid (HMAC 1, length 32, CRC 0ee243ea)"],
  [
    "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaA:",
    "CRC mismatch (key 80267e8a, crc 91267e8a)",
  ],
  ["DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=:", "Invalid key length 28"],
  ["DHHC-1:04:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:", "Invalid HMAC identifier 4"],
  [
    "DHHC-1:01:maa38QzFv3o1em7Xie7In3Q7NqoAhuw4ISMdCxqGbpQmO0uPYQAtXlppwXY9b3xsocqZtw==:",
    "Invalid key length for SHA(256)",
  ],
  ["DHHC-2:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:", "Invalid key header"],
  ["DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR", "Base64 decoding failed"],
];

describe("DHHC-1 secrets, as nvme-cli writes and checks them", () => {
  test("nvme-cli's raw secret parses to the bytes given and formats back to the same text", () => {
    const k = parseDhchapSecret(NVME_CLI_GEN[0].out);
    expect(k).toEqual({ hash: 0, key: Buffer.from(Array.from({ length: 32 }, (_, i) => i)) });
    expect(formatDhchapSecret(k)).toBe(NVME_CLI_GEN[0].out);
    expect(crc32(k.key).toString(16)).toBe("91267e8a");
  });

  test("nvme-cli's -m/-n output is our transformation of the same secret", () => {
    for (const g of NVME_CLI_GEN.slice(1)) {
      const secret = Buffer.from(Array.from({ length: g.len }, (_, i) => i));
      const transformed = transformDhchapKey({ hash: g.hh as HashId, key: secret }, g.nqn as string);
      expect(formatDhchapSecret({ hash: g.hh as HashId, key: transformed })).toBe(g.out);
      expect(parseDhchapSecret(g.out).key.equals(transformed)).toBe(true);
    }
  });

  test("what check-dhchap-key accepts parses; what it refuses is refused", () => {
    for (const [key, verdict] of NVME_CLI_CHECK) {
      if (verdict.startsWith("Key is valid")) {
        const k = parseDhchapSecret(key);
        const crc = Buffer.from(key.split(":")[2] as string, "base64").readUInt32LE(k.key.length);
        expect(
          `Key is valid (HMAC ${k.hash}, length ${k.key.length}, CRC ${crc.toString(16).padStart(8, "0")})`,
        ).toBe(verdict);
      } else {
        expect(() => parseDhchapSecret(key)).toThrow();
      }
    }
    // A trailing newline (a key file) is tolerated; the message never carries the key.
    expect(parseDhchapSecret(`${NVME_CLI_GEN[0].out}\n`).hash).toBe(0);
    try {
      parseDhchapSecret(NVME_CLI_CHECK[2]?.[0] as string);
    } catch (err) {
      expect(String(err)).not.toContain("AAECAwQF");
    }
  });

  test("generated secrets have the hash's length, a valid CRC and fresh bytes", () => {
    for (const hash of [0, 1, 2, 3] as const) {
      const s = generateDhchapSecret({ hash });
      const k = parseDhchapSecret(s);
      expect(k.hash).toBe(hash);
      expect(k.key.length).toBe([32, 32, 48, 64][hash] as number);
    }
    expect(parseDhchapSecret(generateDhchapSecret({ length: 64 })).key.length).toBe(64);
    expect(generateDhchapSecret()).not.toBe(generateDhchapSecret());
    expect(() => generateDhchapSecret({ hash: 1, length: 48 })).toThrow();
    const fixed = generateDhchapSecret({
      random: (n) => Buffer.from(Array.from({ length: n }, (_, i) => i)),
    });
    expect(fixed).toBe(NVME_CLI_GEN[0].out);
  });
});

describe("responses (independent vectors)", () => {
  test.each(V.null.map((c) => [c.hash, c.keyHash, c] as const))(
    "NULL DH group, hash %d, key transformation %d",
    (_h, _kh, c) => {
      const hk = parseDhchapSecret(c.hostSecret);
      const ck = parseDhchapSecret(c.ctrlSecret);
      const thk = transformDhchapKey(hk, V.hostnqn);
      const tck = transformDhchapKey(ck, V.subnqn);
      expect(thk.toString("hex")).toBe(c.transformedHostKey);
      expect(tck.toString("hex")).toBe(c.transformedCtrlKey);
      const common = { hash: c.hash, transactionId: V.tid, hostnqn: V.hostnqn, subnqn: V.subnqn };
      const r1 = hostResponse({ ...common, transformedKey: thk, challenge: hex(c.c1), seqnum: V.seq1 });
      const r2 = controllerResponse({ ...common, transformedKey: tck, challenge: hex(c.c2), seqnum: V.seq2 });
      expect(r1.toString("hex")).toBe(c.hostResponse);
      expect(r2.toString("hex")).toBe(c.ctrlResponse);
      expect(responsesEqual(r1, hex(c.hostResponse))).toBe(true);
      // Any other host NQN, sequence number or transaction gives another response.
      expect(
        hostResponse({ ...common, transformedKey: thk, challenge: hex(c.c1), seqnum: V.seq1 + 1 }),
      ).not.toEqual(r1);
      expect(
        hostResponse({
          ...common,
          hostnqn: `${V.hostnqn}x`,
          transformedKey: thk,
          challenge: hex(c.c1),
          seqnum: V.seq1,
        }),
      ).not.toEqual(r1);
    },
  );

  test.each(V.dh.map((c) => [c.dhgroup, c.hash, c] as const))("DH group %d, hash %d", (_g, _h, c) => {
    const group = ffdheGroup(c.dhgroup);
    expect(sha256(hex(group.primeHex))).toBe(c.primeSha256);
    const host = dhKeyPair(group, BigInt(`0x${c.hostPrivate}`));
    const ctrl = dhKeyPair(group, BigInt(`0x${c.ctrlPrivate}`));
    expect(sha256(host.publicValue)).toBe(c.hostPublicSha256);
    expect(sha256(ctrl.publicValue)).toBe(c.ctrlPublicSha256);
    const shared = dhSharedValue(host, ctrl.publicValue);
    expect(dhSharedValue(ctrl, host.publicValue).equals(shared)).toBe(true);
    expect(sha256(shared)).toBe(c.sharedSha256);
    expect(augmentedChallenge(c.hash, shared, hex(c.c1)).toString("hex")).toBe(c.augmentedC1);
    expect(augmentedChallenge(c.hash, shared, hex(c.c2)).toString("hex")).toBe(c.augmentedC2);
    const common = {
      hash: c.hash,
      transactionId: V.tid,
      hostnqn: V.hostnqn,
      subnqn: V.subnqn,
      sharedValue: shared,
    };
    const thk = transformDhchapKey(parseDhchapSecret(c.hostSecret), V.hostnqn);
    const tck = transformDhchapKey(parseDhchapSecret(c.ctrlSecret), V.subnqn);
    expect(
      hostResponse({ ...common, transformedKey: thk, challenge: hex(c.c1), seqnum: V.seq1 }).toString("hex"),
    ).toBe(c.hostResponse);
    expect(
      controllerResponse({ ...common, transformedKey: tck, challenge: hex(c.c2), seqnum: V.seq2 }).toString(
        "hex",
      ),
    ).toBe(c.ctrlResponse);
  });
});

describe("FFDHE groups", () => {
  test("the primes are OpenSSL's RFC 7919 primes", () => {
    for (const g of Object.values(FFDHE_GROUPS)) {
      expect(sha256(hex(g.primeHex))).toBe(V.primeSha256[String(g.id)] as string);
      expect(g.primeHex.length * 4).toBe(g.bits);
      // RFC 7919: the top and bottom 64 bits are all ones.
      expect(g.primeHex.slice(0, 16)).toBe("ffffffffffffffff");
      expect(g.primeHex.slice(-16)).toBe("ffffffffffffffff");
    }
  });

  test("random key pairs agree on the shared value; bad peer values are refused", () => {
    const g = ffdheGroup(1);
    const a = dhKeyPair(g);
    const b = dhKeyPair(g);
    expect(a.publicValue.length).toBe(256);
    expect(dhSharedValue(a, b.publicValue).equals(dhSharedValue(b, a.publicValue))).toBe(true);
    expect(() => dhSharedValue(a, Buffer.alloc(256))).toThrow();
    expect(() => dhSharedValue(a, Buffer.alloc(255, 1))).toThrow();
    expect(() => dhSharedValue(a, hex(g.primeHex))).toThrow();
    expect(() => ffdheGroup(0)).toThrow();
  });
});

describe("authentication messages", () => {
  test("negotiate carries the hash and DH group lists at the specification's offsets", () => {
    const b = encodeAuthMessage({
      kind: "negotiate",
      tid: 0x1234,
      scC: 0,
      protocols: [{ hashes: [1, 2, 3], dhgroups: [0, 1, 2, 3, 4, 5] }],
    });
    expect(b.length).toBe(72);
    expect([...b.subarray(0, 12)]).toEqual([0, 0, 0, 0, 0x34, 0x12, 0, 1, 1, 0, 3, 6]);
    // idlist starts at byte 12: hash ids in idlist[0..29], DH group ids from idlist[30].
    expect([...b.subarray(12, 15)]).toEqual([1, 2, 3]);
    expect([...b.subarray(42, 48)]).toEqual([0, 1, 2, 3, 4, 5]);
    expect(decodeAuthMessage(b)).toEqual({
      kind: "negotiate",
      tid: 0x1234,
      scC: 0,
      protocols: [{ hashes: [1, 2, 3], dhgroups: [0, 1, 2, 3, 4, 5] }],
    });
  });

  test("challenge, reply, success and failure round-trip with their header bytes", () => {
    const c1 = Buffer.alloc(32, 0xc1);
    const dh = Buffer.alloc(256, 0xd1);
    const ch = encodeAuthMessage({
      kind: "challenge",
      tid: 7,
      hashId: 1,
      dhgroupId: 1,
      seqnum: 0x01020304,
      challenge: c1,
      dhValue: dh,
    });
    expect([...ch.subarray(0, 16)]).toEqual([1, 1, 0, 0, 7, 0, 32, 0, 1, 1, 0, 1, 4, 3, 2, 1]);
    expect(decodeAuthMessage(ch)).toMatchObject({
      kind: "challenge",
      seqnum: 0x01020304,
      challenge: c1,
      dhValue: dh,
    });
    const reply = encodeAuthMessage({
      kind: "reply",
      tid: 7,
      response: Buffer.alloc(32, 0xaa),
      ctrlChallenge: Buffer.alloc(32, 0xc2),
      seqnum: 9,
      dhValue: dh,
    });
    expect(reply.length).toBe(16 + 64 + 256);
    expect([reply[1], reply[6], reply[8]]).toEqual([AuthMessageId.reply, 32, 1]);
    expect(decodeAuthMessage(reply)).toMatchObject({
      kind: "reply",
      seqnum: 9,
      ctrlChallenge: Buffer.alloc(32, 0xc2),
    });
    const s1 = encodeAuthMessage({ kind: "success1", tid: 7, hashLength: 32, response: undefined });
    expect(decodeAuthMessage(s1)).toEqual({ kind: "success1", tid: 7, hashLength: 32, response: undefined });
    expect(decodeAuthMessage(encodeAuthMessage({ kind: "success2", tid: 7 }))).toEqual({
      kind: "success2",
      tid: 7,
    });
    const f = encodeAuthMessage({ kind: "failure1", tid: 7, reason: 1, explanation: 1 });
    expect([...f]).toEqual([0, 0xf1, 0, 0, 7, 0, 1, 1]);
    expect(decodeAuthMessage(f)).toEqual({ kind: "failure1", tid: 7, reason: 1, explanation: 1 });
    expect(() => decodeAuthMessage(ch.subarray(0, 40))).toThrow();
    expect(() => decodeAuthMessage(Buffer.from([9, 9, 0, 0, 0, 0, 0, 0]))).toThrow();
  });
});
