// DH-HMAC-CHAP for an export: the secret named by the partition's targetOptions.dhchapSecretRef
// (a Secret in the partition's namespace) is demanded from every host its ACL admits. The secret
// is read when needed and never stored in any object or log.
import * as k8s from "@kubernetes/client-node";
import type { NVMePartition } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import type { HostKeys } from "../backends/types.ts";

export interface SecretReader {
  /** The value of `key` in Secret namespace/name, or undefined when the Secret or key is missing. */
  read(namespace: string, name: string, key: string): Promise<string | undefined>;
}

export function kubeSecretReader(conn: KubeConnection): SecretReader {
  const core = conn.api(k8s.CoreV1Api);
  return {
    async read(namespace, name, key) {
      try {
        const s = await core.readNamespacedSecret({ name, namespace });
        const b64 = s.data?.[key];
        return b64 === undefined ? undefined : Buffer.from(b64, "base64").toString("utf8");
      } catch (err) {
        const e = kubeError(err, `read Secret ${namespace}/${name}`);
        if (e.kind === "not-found") return undefined;
        throw e;
      }
    },
  };
}

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
