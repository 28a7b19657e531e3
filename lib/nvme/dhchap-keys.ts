// Where a volume's DH-HMAC-CHAP keys and TLS PSKs live: one Secret per volume (named after its
// PersistentVolume, so the StorageClass can template it as the node-stage secret), one set of
// entries per host NQN. The CSI controller writes them, the agent installs them on the target,
// kubelet hands them to the CSI node at NodeStage. One layout, shared by all three.
import { createHash, hkdfSync } from "node:crypto";
import { DHCHAP_HASHES, formatDhchapSecret, generateDhchapSecret, type HashId } from "./dhchap.ts";

/** DH-HMAC-CHAP modes a StorageClass may ask for. */
export const DHCHAP_MODES = ["none", "unidirectional", "bidirectional"] as const;
export type DhchapMode = (typeof DHCHAP_MODES)[number];

/** HMAC hashes of the exchange (and of the secrets' transformation). */
export const DHCHAP_HASH_NAMES = ["sha256", "sha384", "sha512"] as const;
export type DhchapHashName = (typeof DHCHAP_HASH_NAMES)[number];

/** DH groups of the exchange; "null" is no Diffie-Hellman (plain HMAC-CHAP). */
export const DHCHAP_DHGROUPS = [
  "null",
  "ffdhe2048",
  "ffdhe3072",
  "ffdhe4096",
  "ffdhe6144",
  "ffdhe8192",
] as const;
export type DhchapDhgroup = (typeof DHCHAP_DHGROUPS)[number];

const HASH_IDS: Record<DhchapHashName, HashId> = { sha256: 1, sha384: 2, sha512: 3 };

/** Prefix of the Secret name; the StorageClass templates `dhchap-${pv.name}`. */
export const DHCHAP_SECRET_PREFIX = "dhchap-";

/** The StorageClass template of the node-stage secret name, as external-provisioner expands it. */
export const DHCHAP_NODE_STAGE_SECRET_TEMPLATE = `${DHCHAP_SECRET_PREFIX}\${pv.name}`;

/** The Secret holding the keys of the volume whose PersistentVolume is `pvName`. */
export function dhchapSecretName(pvName: string): string {
  return `${DHCHAP_SECRET_PREFIX}${pvName}`;
}

/**
 * The data keys of one host's entries. A host NQN is not a valid data key (":" is not allowed),
 * so entries are named by a digest of it; `<id>.hostnqn` records the NQN itself (not secret).
 */
export function hostEntryKeys(hostNqn: string): {
  secret: string;
  ctrlSecret: string;
  hostNqn: string;
  psk: string;
} {
  const id = createHash("sha256").update(hostNqn).digest("hex").slice(0, 32);
  return { secret: `${id}.key`, ctrlSecret: `${id}.ctrl`, hostNqn: `${id}.hostnqn`, psk: `${id}.psk` };
}

/**
 * One host's NVMe/TCP TLS PSK (interchange form, lib/nvme/tls-psk.ts) from a Secret's decoded
 * data, or undefined when the host has none. It lives beside the host's DH-HMAC-CHAP pair in the
 * same volume Secret, so it travels the same way (agent, node-stage secrets).
 */
export function hostPskFrom(data: Readonly<Record<string, string>>, hostNqn: string): string | undefined {
  const psk = data[hostEntryKeys(hostNqn).psk]?.trim();
  return psk ? psk : undefined;
}

/**
 * A new key pair for one host: the host's secret, and the controller's when bidirectional. Both
 * are transformed with the class's hash (DHHC-1:0<n>:), so each side derives its response key
 * from its own NQN as NVMe's DH-HMAC-CHAP defines.
 */
export function generateHostKeyPair(
  mode: Exclude<DhchapMode, "none">,
  hash: DhchapHashName,
): { secret: string; ctrlSecret?: string } {
  const id = HASH_IDS[hash];
  const secret = generateDhchapSecret({ hash: id });
  return mode === "bidirectional" ? { secret, ctrlSecret: generateDhchapSecret({ hash: id }) } : { secret };
}

/**
 * One host's secrets from a Secret's decoded data, or undefined when the host has no entry (it
 * must not be admitted then). `ctrlSecret` is there for bidirectional volumes.
 */
export function hostKeyPairFrom(
  data: Readonly<Record<string, string>>,
  hostNqn: string,
): { secret: string; ctrlSecret?: string } | undefined {
  const k = hostEntryKeys(hostNqn);
  const secret = data[k.secret]?.trim();
  if (!secret) return undefined;
  const ctrl = data[k.ctrlSecret]?.trim();
  return ctrl ? { secret, ctrlSecret: ctrl } : { secret };
}

/** The Secret (release namespace) holding the master key per-host pairs are derived from. */
export const DHCHAP_MASTER_SECRET = "distort-dhchap-master";
/** Its data key. */
export const DHCHAP_MASTER_KEY = "master";

/**
 * A host's pair derived from `master` (HKDF-SHA256, info = role and host NQN): the same host gets
 * the same pair on every volume, as a backend that keeps one key per host (nvmet's
 * hosts/<nqn>/dhchap_key) needs, without a per-host object whose lifetime would outlast every
 * volume. The transformation hash is fixed (sha256) so classes with different hashes still agree
 * on the key; the exchange hash is the target's setting.
 */
export function deriveHostKeyPair(
  master: Uint8Array,
  mode: Exclude<DhchapMode, "none">,
  hostNqn: string,
): { secret: string; ctrlSecret?: string } {
  if (master.length < 32) throw new Error("the DH-HMAC-CHAP master key must be at least 32 bytes");
  const derive = (role: string) =>
    formatDhchapSecret({
      hash: 1,
      key: Buffer.from(
        hkdfSync("sha256", master, "distort dhchap", `${role}\0${hostNqn}`, DHCHAP_HASHES[1].length),
      ),
    });
  const secret = derive("host");
  return mode === "bidirectional" ? { secret, ctrlSecret: derive("ctrl") } : { secret };
}
