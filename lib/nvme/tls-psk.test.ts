// TLS PSK interchange format, identity and derivations against vectors computed outside this code:
// CRCs as nvme-cli 2.3's `nvme check-tls-key` printed them, HKDF outputs from Python's hmac module
// (RFC 5869 written out by hand, TLS 1.3 HkdfLabel as SPDK's nvme_tcp.h builds it).
import { expect, test } from "bun:test";
import {
  formatInterchangePsk,
  generateInterchangePsk,
  isInterchangePsk,
  parseInterchangePsk,
  pskIdentity,
  retainedPsk,
  tlsPsk,
} from "./tls-psk.ts";

const KEY32 = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
const KEY48 = Buffer.from(Array.from({ length: 48 }, (_, i) => i));
const HOST = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUB = "nqn.2026-02.io.distort:volume-vol-0123456789abcdef";

test("interchange text of bytes 0..31 and 0..47 (nvme check-tls-key: CRC 91267e8a, 05202171)", () => {
  const a = formatInterchangePsk({ hash: 1, key: KEY32 });
  expect(a).toBe("NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:");
  expect(Buffer.from(a.split(":")[2] as string, "base64").readUInt32LE(32)).toBe(0x91267e8a);
  const b = formatInterchangePsk({ hash: 2, key: KEY48 });
  expect(b).toBe("NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:");
  expect(Buffer.from(b.split(":")[2] as string, "base64").readUInt32LE(48)).toBe(0x05202171);
  expect(parseInterchangePsk(`${a}\n`)).toEqual({ hash: 1, key: KEY32 });
});

test("refusals: CRC, length against hh, header, undefined hh; messages hold no key", () => {
  const good = formatInterchangePsk({ hash: 1, key: KEY32 });
  const badCrc = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8AAAAA:";
  expect(() => parseInterchangePsk(badCrc)).toThrow(/CRC-32/);
  expect(() => parseInterchangePsk(good.replace(":01:", ":02:"))).toThrow(/does not fit/);
  expect(() => parseInterchangePsk(good.replace(":01:", ":03:"))).toThrow(/not defined/);
  expect(() => parseInterchangePsk(good.replace("NVMeTLSkey-1", "DHHC-1"))).toThrow(/form/);
  expect(() => parseInterchangePsk(good.slice(0, -1))).toThrow(/form/);
  try {
    parseInterchangePsk(badCrc);
  } catch (err) {
    expect(String(err)).not.toContain("AAEC");
  }
  expect(isInterchangePsk(good)).toBe(true);
  expect(isInterchangePsk(badCrc)).toBe(false);
});

test("hh 00 takes the length from the key and uses it as the retained PSK", () => {
  const k = parseInterchangePsk(formatInterchangePsk({ hash: 0, key: KEY48 }));
  expect(k).toEqual({ hash: 0, key: KEY48 });
  expect(retainedPsk(k, HOST)).toEqual(KEY48);
});

test("identity, retained PSK and TLS PSK (independently computed)", () => {
  expect(pskIdentity(HOST, SUB)).toBe(`NVMe0R01 ${HOST} ${SUB}`);
  expect(pskIdentity(HOST, SUB, 2)).toBe(`NVMe0R02 ${HOST} ${SUB}`);
  const r = retainedPsk({ hash: 1, key: KEY32 }, HOST);
  expect(r.toString("hex")).toBe("2777170cfb82b52c5ec8cb00cc26fa9145d942315f2c892822b0772f5debe85d");
  expect(tlsPsk(r, pskIdentity(HOST, SUB)).toString("hex")).toBe(
    "5c434583c7b16840c326c0f38d2eb8331c716f378b75bafd5f0406c5ac66d0fe",
  );
  expect(retainedPsk({ hash: 2, key: KEY48 }, HOST).toString("hex")).toBe(
    "9199e9844a95310712a6436350cb36769e36bb02461989493acb7f9419f9d1ca81374a176479e87994f6c7c17c5f2800",
  );
  // Bound to the host: another NQN derives another key.
  expect(retainedPsk({ hash: 1, key: KEY32 }, `${HOST}x`)).not.toEqual(r);
});

test("generated PSKs parse, are 32 bytes with hh 01, and differ", () => {
  const a = generateInterchangePsk();
  const b = generateInterchangePsk();
  expect(parseInterchangePsk(a).key.length).toBe(32);
  expect(a.startsWith("NVMeTLSkey-1:01:")).toBe(true);
  expect(a).not.toBe(b);
  expect(parseInterchangePsk(generateInterchangePsk(2)).key.length).toBe(48);
});
