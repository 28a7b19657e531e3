// DH-HMAC-CHAP and TLS PSKs for an export: per-host key pairs and PSKs from the volume's key Secret
// (targetOptions.dhchap, written by the CSI controller at publish), or the one secret named by
// targetOptions.dhchapSecretRef, demanded from every host the ACL admits. Secrets are read when
// needed and never stored in any object or log.
import type { NVMePartition } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import type { SecretReader } from "../../lib/kube/secrets.ts";
import { hostEntryKeys, hostKeyPairFrom } from "../../lib/nvme/dhchap-keys.ts";
import { isInterchangePsk } from "../../lib/nvme/tls-psk.ts";
import type { HostKey, HostKeys, HostPsks } from "../backends/types.ts";

export type { SecretReader };

const DHCHAP_SECRET = /^DHHC-1:0[0-3]:[A-Za-z0-9+/]{44,}={0,2}:$/;

/**
 * The keys for `hosts`, or undefined when the partition asks for no authentication. Throws
 * StorageError("precondition") when the Secret or its key is missing and "invalid" when the value
 * is not a DH-HMAC-CHAP secret, so the export is never opened without the authentication asked for.
 */
export async function hostKeysFor(
  p: NVMePartition,
  hosts: readonly string[],
  secrets: SecretReader | undefined,
): Promise<HostKeys | undefined> {
  const ref = p.spec.targetOptions?.dhchapSecretRef;
  if (!ref) return undefined;
  const ns = p.metadata.namespace as string;
  if (!secrets) throw new StorageError("unimplemented", "this agent cannot read Secrets for DH-HMAC-CHAP");
  const value = (await secrets.read(ns, ref.name, ref.key))?.trim();
  if (value === undefined) {
    throw new StorageError(
      "precondition",
      `Secret ${ns}/${ref.name} has no key ${ref.key} (DH-HMAC-CHAP secret for ${p.metadata.name})`,
    );
  }
  if (!DHCHAP_SECRET.test(value)) {
    throw new StorageError(
      "invalid",
      `Secret ${ns}/${ref.name} key ${ref.key} is not a DH-HMAC-CHAP secret (DHHC-1:<hash>:<base64>:)`,
    );
  }
  return new Map(hosts.map((h) => [h, value]));
}

/** The hosts an export admits and the keys they authenticate with. */
export interface KeyedAcl {
  readonly hosts: string[];
  readonly keys: HostKeys | undefined;
  /** TLS exports (targetOptions.tls): each admitted host's PSK. */
  readonly psks?: HostPsks;
}

/**
 * The ACL to set for `hosts` on a partition: all of them, unkeyed, without DH-HMAC-CHAP; with
 * per-host keys (targetOptions.dhchap), only the hosts whose pair the volume's Secret holds (a
 * host without one is left out, never admitted unkeyed, and is admitted by a later pass once the
 * CSI controller wrote it). A TLS partition (targetOptions.tls) admits only hosts whose PSK the
 * Secret holds, and returns the PSKs. Revoking needs no Secret: with no host left nothing is read.
 */
export async function keyedAclFor(
  p: NVMePartition,
  hosts: readonly string[],
  secrets: SecretReader | undefined,
): Promise<KeyedAcl> {
  const acl = await dhchapAclFor(p, hosts, secrets);
  const tls = p.spec.targetOptions?.tls;
  if (!tls || acl.hosts.length === 0) return acl;
  if (!secrets) throw new StorageError("unimplemented", "this agent cannot read Secrets for TLS PSKs");
  const ns = p.metadata.namespace as string;
  // A host without its PSK is left out (never admitted without TLS: the listeners take nothing
  // else), and admitted by a later pass once the CSI controller wrote it.
  const psks = new Map<string, string>();
  for (const h of acl.hosts) {
    const psk = (await secrets.read(ns, tls.secretName, hostEntryKeys(h).psk))?.trim();
    if (psk === undefined) continue;
    if (!isInterchangePsk(psk)) {
      throw new StorageError(
        "invalid",
        `Secret ${ns}/${tls.secretName} holds a value for host ${h} that is not an NVMe/TCP TLS PSK (NVMeTLSkey-1:<hh>:<base64>:)`,
      );
    }
    psks.set(h, psk);
  }
  return { hosts: acl.hosts.filter((h) => psks.has(h)), keys: acl.keys, psks };
}

/** keyedAclFor without TLS: the hosts and their DH-HMAC-CHAP keys. */
async function dhchapAclFor(
  p: NVMePartition,
  hosts: readonly string[],
  secrets: SecretReader | undefined,
): Promise<KeyedAcl> {
  const dh = p.spec.targetOptions?.dhchap;
  if (!dh) return { hosts: [...hosts], keys: await hostKeysFor(p, hosts, secrets) };
  if (hosts.length === 0) return { hosts: [], keys: undefined };
  if (!secrets) throw new StorageError("unimplemented", "this agent cannot read Secrets for DH-HMAC-CHAP");
  const ns = p.metadata.namespace as string;
  const keys = new Map<string, HostKey>();
  for (const h of hosts) {
    const k = hostEntryKeys(h);
    const data: Record<string, string> = {};
    const secret = await secrets.read(ns, dh.secretName, k.secret);
    if (secret === undefined) continue;
    data[k.secret] = secret;
    if (dh.mode === "bidirectional") {
      const ctrl = await secrets.read(ns, dh.secretName, k.ctrlSecret);
      // Bidirectional without the controller's key would be a weaker export than asked for.
      if (ctrl === undefined) continue;
      data[k.ctrlSecret] = ctrl;
    }
    const pair = hostKeyPairFrom(data, h);
    if (!pair) continue;
    for (const s of [pair.secret, pair.ctrlSecret]) {
      if (s !== undefined && !DHCHAP_SECRET.test(s)) {
        throw new StorageError(
          "invalid",
          `Secret ${ns}/${dh.secretName} holds a value for host ${h} that is not a DH-HMAC-CHAP secret`,
        );
      }
    }
    keys.set(h, { ...pair, hash: dh.hash, dhgroup: dh.dhgroup });
  }
  return { hosts: hosts.filter((h) => keys.has(h)), keys };
}
