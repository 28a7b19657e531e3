// The finite-field Diffie-Hellman groups of DH-HMAC-CHAP (RFC 7919 ffdhe2048..8192, generator 2,
// NVMe DH group ids 1..5) and the exponentiations on them: key pairs and the shared value.
import { randomBytes } from "node:crypto";
import { StorageError } from "../errors.ts";

/** NVMe DH group identifiers: 0 is the NULL group (no exchange), 1..5 are ffdhe2048..ffdhe8192. */
export type DhGroupId = 0 | 1 | 2 | 3 | 4 | 5;

/** One RFC 7919 group. */
export interface FfdheGroup {
  readonly id: Exclude<DhGroupId, 0>;
  readonly name: string;
  readonly bits: number;
  /**
   * Private exponent length: twice the group's security strength (112..200 bits), as Linux's
   * safe-prime DH key generation picks it.
   */
  readonly privateBits: number;
  readonly primeHex: string;
}

/** The groups by NVMe DH group id. Primes as OpenSSL 3.0 ships them (pinned by test). */
export const FFDHE_GROUPS: Readonly<Record<Exclude<DhGroupId, 0>, FfdheGroup>> = {
  1: {
    id: 1,
    name: "ffdhe2048",
    bits: 2048,
    privateBits: 224,
    primeHex:
      "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695a9e13641146433fbcc939dce249b3ef9" +
      "7d2fe363630c75d8f681b202aec4617ad3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
      "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797abc0ab182b324fb61d108a94bb2c8e3fb" +
      "b96adab760d7f4681d4f42a3de394df4ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
      "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005c58ef1837d1683b2c6f34a26c1b2effa" +
      "886b423861285c97ffffffffffffffff",
  },
  2: {
    id: 2,
    name: "ffdhe3072",
    bits: 3072,
    privateBits: 256,
    primeHex:
      "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695a9e13641146433fbcc939dce249b3ef9" +
      "7d2fe363630c75d8f681b202aec4617ad3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
      "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797abc0ab182b324fb61d108a94bb2c8e3fb" +
      "b96adab760d7f4681d4f42a3de394df4ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
      "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005c58ef1837d1683b2c6f34a26c1b2effa" +
      "886b4238611fcfdcde355b3b6519035bbc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
      "aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff5cae82ab9c9df69ee86d2bc522363a0d" +
      "abc521979b0deada1dbf9a42d5c4484e0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b66c62e37ffffffffffffffff",
  },
  3: {
    id: 3,
    name: "ffdhe4096",
    bits: 4096,
    privateBits: 304,
    primeHex:
      "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695a9e13641146433fbcc939dce249b3ef9" +
      "7d2fe363630c75d8f681b202aec4617ad3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
      "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797abc0ab182b324fb61d108a94bb2c8e3fb" +
      "b96adab760d7f4681d4f42a3de394df4ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
      "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005c58ef1837d1683b2c6f34a26c1b2effa" +
      "886b4238611fcfdcde355b3b6519035bbc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
      "aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff5cae82ab9c9df69ee86d2bc522363a0d" +
      "abc521979b0deada1dbf9a42d5c4484e0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
      "7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a7135c886efb4318aed6a1e012d9e6832" +
      "a907600a918130c46dc778f971ad0038092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
      "8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e655f6affffffffffffffff",
  },
  4: {
    id: 4,
    name: "ffdhe6144",
    bits: 6144,
    privateBits: 352,
    primeHex:
      "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695a9e13641146433fbcc939dce249b3ef9" +
      "7d2fe363630c75d8f681b202aec4617ad3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
      "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797abc0ab182b324fb61d108a94bb2c8e3fb" +
      "b96adab760d7f4681d4f42a3de394df4ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
      "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005c58ef1837d1683b2c6f34a26c1b2effa" +
      "886b4238611fcfdcde355b3b6519035bbc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
      "aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff5cae82ab9c9df69ee86d2bc522363a0d" +
      "abc521979b0deada1dbf9a42d5c4484e0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
      "7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a7135c886efb4318aed6a1e012d9e6832" +
      "a907600a918130c46dc778f971ad0038092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
      "8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e0dd9020bfd64b645036c7a4e677d2c38532a3a23ba4442caf53ea6" +
      "3bb454329b7624c8917bdd64b1c0fd4cb38e8c334c701c3acdad0657fccfec719b1f5c3e4e46041f388147fb4cfdb477" +
      "a52471f7a9a96910b855322edb6340d8a00ef092350511e30abec1fff9e3a26e7fb29f8c183023c3587e38da0077d9b4" +
      "763e4e4b94b2bbc194c6651e77caf992eeaac0232a281bf6b3a739c1226116820ae8db5847a67cbef9c9091b462d538c" +
      "d72b03746ae77f5e62292c311562a846505dc82db854338ae49f5235c95b91178ccf2dd5cacef403ec9d1810c6272b04" +
      "5b3b71f9dc6b80d63fdd4a8e9adb1e6962a69526d43161c1a41d570d7938dad4a40e329cd0e40e65ffffffffffffffff",
  },
  5: {
    id: 5,
    name: "ffdhe8192",
    bits: 8192,
    privateBits: 400,
    primeHex:
      "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695a9e13641146433fbcc939dce249b3ef9" +
      "7d2fe363630c75d8f681b202aec4617ad3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
      "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797abc0ab182b324fb61d108a94bb2c8e3fb" +
      "b96adab760d7f4681d4f42a3de394df4ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
      "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005c58ef1837d1683b2c6f34a26c1b2effa" +
      "886b4238611fcfdcde355b3b6519035bbc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
      "aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff5cae82ab9c9df69ee86d2bc522363a0d" +
      "abc521979b0deada1dbf9a42d5c4484e0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
      "7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a7135c886efb4318aed6a1e012d9e6832" +
      "a907600a918130c46dc778f971ad0038092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
      "8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e0dd9020bfd64b645036c7a4e677d2c38532a3a23ba4442caf53ea6" +
      "3bb454329b7624c8917bdd64b1c0fd4cb38e8c334c701c3acdad0657fccfec719b1f5c3e4e46041f388147fb4cfdb477" +
      "a52471f7a9a96910b855322edb6340d8a00ef092350511e30abec1fff9e3a26e7fb29f8c183023c3587e38da0077d9b4" +
      "763e4e4b94b2bbc194c6651e77caf992eeaac0232a281bf6b3a739c1226116820ae8db5847a67cbef9c9091b462d538c" +
      "d72b03746ae77f5e62292c311562a846505dc82db854338ae49f5235c95b91178ccf2dd5cacef403ec9d1810c6272b04" +
      "5b3b71f9dc6b80d63fdd4a8e9adb1e6962a69526d43161c1a41d570d7938dad4a40e329ccff46aaa36ad004cf600c838" +
      "1e425a31d951ae64fdb23fcec9509d43687feb69edd1cc5e0b8cc3bdf64b10ef86b63142a3ab8829555b2f747c932665" +
      "cb2c0f1cc01bd70229388839d2af05e454504ac78b7582822846c0ba35c35f5c59160cc046fd8251541fc68c9c86b022" +
      "bb7099876a460e7451a8a93109703fee1c217e6c3826e52c51aa691e0e423cfc99e9e31650c1217b624816cdad9a95f9" +
      "d5b8019488d9c0a0a1fe3075a577e23183f81d4a3f2fa4571efc8ce0ba8a4fe8b6855dfe72b0a66eded2fbabfbe58a30" +
      "fafabe1c5d71a87e2f741ef8c1fe86fea6bbfde530677f0d97d11d49f7a8443d0822e506a9f4614e011e2a94838ff88c" +
      "d68c8bb7c5c6424cffffffffffffffff",
  },
};

/** Names as Linux nvmet and nvme-cli spell them (configfs dhchap_dhgroup, --dhchap-dhgroup). */
export const DH_GROUP_NAMES: Readonly<Record<DhGroupId, string>> = {
  0: "null",
  1: "ffdhe2048",
  2: "ffdhe3072",
  3: "ffdhe4096",
  4: "ffdhe6144",
  5: "ffdhe8192",
};

/** A DH key pair in one group; `publicValue` is big-endian, padded to the prime's length. */
export interface DhKeyPair {
  readonly group: FfdheGroup;
  readonly privateKey: bigint;
  readonly publicValue: Buffer;
}

/** The group for `id`; StorageError invalid for the NULL group or an unknown id. */
export function ffdheGroup(id: number): FfdheGroup {
  const g = FFDHE_GROUPS[id as Exclude<DhGroupId, 0>];
  if (!g) throw new StorageError("invalid", `DH group ${id} is not an FFDHE group`);
  return g;
}

const primes = new Map<number, bigint>();
function prime(g: FfdheGroup): bigint {
  let p = primes.get(g.id);
  if (p === undefined) {
    p = BigInt(`0x${g.primeHex}`);
    primes.set(g.id, p);
  }
  return p;
}

/**
 * A key pair in `group`: x random of group.privateBits bits (or the given one, for test vectors)
 * and the public value 2^x mod p.
 */
export function dhKeyPair(group: FfdheGroup, privateKey?: bigint): DhKeyPair {
  let x = privateKey;
  while (x === undefined || x < 2n) {
    x = BigInt(`0x${randomBytes(group.privateBits / 8).toString("hex")}`);
  }
  return { group, privateKey: x, publicValue: toBytes(pow2Mod(x, prime(group)), group.bits / 8) };
}

/**
 * The shared value peer^x mod p, big-endian, padded to the prime's length (what Linux's kpp
 * returns and hashes). StorageError invalid for a peer value outside 1 < y < p-1 or of the wrong
 * length, as the kernel's public-key check refuses it.
 */
export function dhSharedValue(own: DhKeyPair, peerPublic: Uint8Array): Buffer {
  const p = prime(own.group);
  const size = own.group.bits / 8;
  if (peerPublic.length !== size) {
    throw new StorageError("invalid", `DH value of ${peerPublic.length} bytes for ${own.group.name}`);
  }
  const y = BigInt(`0x${Buffer.from(peerPublic).toString("hex")}`);
  if (y <= 1n || y >= p - 1n) throw new StorageError("invalid", "DH value out of range");
  return toBytes(modPow(y, own.privateKey, p), size);
}

/**
 * 2^exp mod p, left to right: each bit squares, and a set bit doubles, which is a shift and at
 * most one subtraction rather than a multiplication and a division.
 */
function pow2Mod(exp: bigint, mod: bigint): bigint {
  const bits = exp.toString(2);
  let result = 1n;
  for (let i = 0; i < bits.length; i++) {
    result = (result * result) % mod;
    if (bits.charCodeAt(i) === 49 /* "1" */) {
      result <<= 1n;
      if (result >= mod) result -= mod;
    }
  }
  return result;
}

/**
 * base^exp mod p, left to right with a sliding window of up to 4 bits over precomputed odd
 * powers: about one multiplication per 5 exponent bits besides the squarings, where plain
 * square-and-multiply needs one per set bit.
 */
function modPow(base: bigint, exp: bigint, mod: bigint): bigint {
  const b = base % mod;
  const b2 = (b * b) % mod;
  const odd = [b]; // odd[i] = b^(2i+1)
  for (let i = 1; i < 8; i++) odd.push(((odd[i - 1] as bigint) * b2) % mod);
  const bits = exp.toString(2);
  let result = 1n;
  let i = 0;
  while (i < bits.length) {
    if (bits[i] === "0") {
      result = (result * result) % mod;
      i++;
      continue;
    }
    // The longest window of at most 4 bits from i that ends in a 1.
    let j = Math.min(i + 4, bits.length);
    while (bits[j - 1] === "0") j--;
    for (let k = i; k < j; k++) result = (result * result) % mod;
    result = (result * (odd[(Number.parseInt(bits.slice(i, j), 2) - 1) / 2] as bigint)) % mod;
    i = j;
  }
  return result;
}

function toBytes(n: bigint, size: number): Buffer {
  return Buffer.from(n.toString(16).padStart(size * 2, "0"), "hex");
}
