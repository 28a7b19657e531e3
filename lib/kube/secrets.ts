// Reading one value of a Secret, as a port: the agent (DH-HMAC-CHAP target keys) and the DPU
// plugin (initiator keys) need secret material and nothing else from the Secret API.
import * as k8s from "@kubernetes/client-node";
import type { KubeConnection } from "./connection.ts";
import { kubeError } from "./resource.ts";

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
