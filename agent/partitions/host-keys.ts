// DH-HMAC-CHAP for an export: the secret named by the partition's targetOptions.dhchapSecretRef
// (a Secret in the partition's namespace) is demanded from every host its ACL admits. The secret
// is read when needed and never stored in any object or log.
import type { NVMePartition } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import type { SecretReader } from "../../lib/kube/secrets.ts";
import type { HostKeys } from "../backends/types.ts";

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
