// CSI node id (the Kubernetes Node name) -> the host NQN the target ACL admits: the node's own
// /etc/nvme/hostnqn, which the node plugin writes onto its Node as an annotation at startup. NodeStage
// connects only as that identity, so the controller authorizes exactly it and never invents one.
import * as k8s from "@kubernetes/client-node";
import * as v from "valibot";
import type { KubeConnection } from "./connection.ts";
import { kubeError } from "./resource.ts";

/** Node annotation holding the node's NVMe host NQN, written by the DISTORT node plugin. */
export const HOST_NQN_ANNOTATION = "storage.distort.io/host-nqn";

const NqnSchema = v.pipe(v.string(), v.maxLength(223), v.regex(/^nqn\.\d{4}-\d{2}\.[^:]+:.+$/));

/** What the controller needs to know of a node. */
export interface NodeRecord {
  /** The registered host NQN; undefined when none (or an invalid one) is on the Node. */
  hostNQN?: string;
  labels: Record<string, string>;
}

/** The registered host NQN among a Node's annotations, if valid. */
export function hostNQNOf(annotations: Readonly<Record<string, string>> | undefined): string | undefined {
  const nqn = annotations?.[HOST_NQN_ANNOTATION];
  return nqn !== undefined && v.is(NqnSchema, nqn) ? nqn : undefined;
}

/** Looks CSI node ids up. */
export interface NodeDirectory {
  /** The node, or undefined when no such node exists. Errors when the lookup itself fails. */
  get(nodeId: string): Promise<NodeRecord | undefined>;
}

/** NodeDirectory over Kubernetes Node objects (RBAC: get nodes). */
export function kubeNodeDirectory(conn: KubeConnection): NodeDirectory {
  const core = conn.api(k8s.CoreV1Api);
  return {
    async get(nodeId) {
      try {
        const node = await core.readNode({ name: nodeId });
        const hostNQN = hostNQNOf(node.metadata?.annotations);
        return { ...(hostNQN ? { hostNQN } : {}), labels: node.metadata?.labels ?? {} };
      } catch (err) {
        const e = kubeError(err, `get node ${nodeId}`);
        if (e.kind === "not-found") return undefined;
        throw e;
      }
    },
  };
}

/**
 * Records `hostNQN` on Node `nodeName` (merge patch, only when it differs; RBAC: get and patch
 * nodes) and returns the Node's labels. Idempotent. StorageError "not-found" when the Node does
 * not exist.
 */
export async function registerHostNQN(
  conn: KubeConnection,
  nodeName: string,
  hostNQN: string,
): Promise<Record<string, string>> {
  const core = conn.api(k8s.CoreV1Api);
  try {
    const node = await core.readNode({ name: nodeName });
    if (node.metadata?.annotations?.[HOST_NQN_ANNOTATION] !== hostNQN) {
      await core.patchNode(
        { name: nodeName, body: { metadata: { annotations: { [HOST_NQN_ANNOTATION]: hostNQN } } } },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
      );
    }
    return node.metadata?.labels ?? {};
  } catch (err) {
    throw kubeError(err, `register the host NQN on node ${nodeName}`);
  }
}
