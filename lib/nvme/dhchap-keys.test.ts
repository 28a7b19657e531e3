// The per-volume key layout: data keys valid for a Secret, one pair per host, lookups that miss
// for an absent host, and generated pairs in DHHC-1 form with the class's hash.
import { expect, test } from "bun:test";
import { parseDhchapSecret } from "./dhchap.ts";
import {
  deriveHostKeyPair,
  dhchapSecretName,
  generateHostKeyPair,
  hostEntryKeys,
  hostKeyPairFrom,
} from "./dhchap-keys.ts";

const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";

test("entry names are Secret data keys, distinct per host, stable", () => {
  const [a, b] = [hostEntryKeys(H1), hostEntryKeys(H2)];
  for (const k of [...Object.values(a), ...Object.values(b)]) expect(k).toMatch(/^[-._a-zA-Z0-9]+$/);
  expect(a.secret).not.toBe(b.secret);
  expect(hostEntryKeys(H1)).toEqual(a);
  expect(dhchapSecretName("pvc-1234")).toBe("dhchap-pvc-1234");
});

test("generated pairs carry the class hash; bidirectional adds a distinct controller secret", () => {
  const uni = generateHostKeyPair("unidirectional", "sha384");
  expect(uni.ctrlSecret).toBeUndefined();
  expect(parseDhchapSecret(uni.secret).hash).toBe(2);
  const bi = generateHostKeyPair("bidirectional", "sha256");
  expect(parseDhchapSecret(bi.secret).hash).toBe(1);
  expect(parseDhchapSecret(bi.ctrlSecret as string).hash).toBe(1);
  expect(bi.ctrlSecret).not.toBe(bi.secret);
});

test("a host's pair is read back from the Secret's data; another host finds nothing", () => {
  const pair = generateHostKeyPair("bidirectional", "sha512");
  const k = hostEntryKeys(H1);
  const data = { [k.secret]: pair.secret, [k.ctrlSecret]: pair.ctrlSecret as string, [k.hostNqn]: H1 };
  expect(hostKeyPairFrom(data, H1)).toEqual(pair);
  expect(hostKeyPairFrom(data, H2)).toBeUndefined();
  expect(hostKeyPairFrom({ [k.secret]: pair.secret }, H1)).toEqual({ secret: pair.secret });
});

test("derived pairs: one per host whatever the volume, distinct per host and master, valid DHHC-1", () => {
  const m1 = new Uint8Array(32).fill(7);
  const m2 = new Uint8Array(32).fill(8);
  const a = deriveHostKeyPair(m1, "bidirectional", H1);
  expect(deriveHostKeyPair(m1, "bidirectional", H1)).toEqual(a);
  expect(deriveHostKeyPair(m1, "unidirectional", H1)).toEqual({ secret: a.secret });
  expect(deriveHostKeyPair(m1, "bidirectional", H2).secret).not.toBe(a.secret);
  expect(deriveHostKeyPair(m2, "bidirectional", H1).secret).not.toBe(a.secret);
  expect(a.ctrlSecret).not.toBe(a.secret);
  expect(parseDhchapSecret(a.secret)).toMatchObject({ hash: 1 });
  expect(parseDhchapSecret(a.ctrlSecret as string).key).toHaveLength(32);
  expect(() => deriveHostKeyPair(new Uint8Array(16), "unidirectional", H1)).toThrow("at least 32 bytes");
});
