// CSI node id -> the host NQN the target ACL admits: the node's own /etc/nvme/hostnqn. The node
// plugin and the DPU plugin report it inside their node ID (lib/csi-node-id.ts), which kubelet
// stores in the node's CSINode; node authorization lets only that node's kubelet write it. Nothing
// else names a host NQN: a Node annotation (which anything holding `patch nodes` could write) is
// never read. NodeStage connects only as that identity, so the controller never invents one.
import * as k8s from "@kubernetes/client-node";
import { parseNodeId } from "../csi-node-id.ts";
import { DRIVER_NAME } from "../volume-context.ts";
import type { KubeConnection } from "./connection.ts";
import { kubeError } from "./resource.ts";

/**
 * The Node annotation earlier releases' node plugins wrote their host NQN into. Nothing reads or
 * writes it now; tests use the name to show it is ignored and never written.
 */
export const LEGACY_HOST_NQN_ANNOTATION = "storage.distort.io/host-nqn";

/** What the controller needs to know of a node. */
export interface NodeRecord {
  /**
   * The DISTORT node ID kubelet stored in the node's CSINode (node authorization: only that
   * node's kubelet writes it); undefined when the node plugin never registered there.
   */
  registeredNodeId?: string;
  labels: Record<string, string>;
}

/** Looks CSI node ids up. */
export interface NodeDirectory {
  /** The Node of that name, or undefined when none exists. Errors when the lookup itself fails. */
  get(nodeName: string): Promise<NodeRecord | undefined>;
  /**
   * Names of the Nodes that claim `hostNQN` in the DISTORT node ID their CSINode carries. Two
   * distinct names mean two machines present one initiator identity, which the target could not
   * tell apart.
   */
  claiming(hostNQN: string): Promise<string[]>;
}

/** NodeDirectory over Kubernetes Node objects (RBAC: get nodes). */
export function kubeNodeDirectory(conn: KubeConnection): NodeDirectory {
  const core = conn.api(k8s.CoreV1Api);
  return {
    async get(nodeId) {
      try {
        const node = await core.readNode({ name: nodeId });
        const registeredNodeId = await csiNodeId(conn, nodeId);
        return {
          ...(registeredNodeId ? { registeredNodeId } : {}),
          labels: node.metadata?.labels ?? {},
        };
      } catch (err) {
        const e = kubeError(err, `get node ${nodeId}`);
        if (e.kind === "not-found") return undefined;
        throw e;
      }
    },
    async claiming(hostNQN) {
      const names = new Set<string>();
      try {
        for (const n of (await conn.api(k8s.StorageV1Api).listCSINode()).items) {
          for (const d of n.spec.drivers ?? []) {
            if (d.name === DRIVER_NAME && d.nodeID && parseNodeId(d.nodeID).hostNQN === hostNQN)
              names.add(n.metadata?.name ?? "");
          }
        }
      } catch (err) {
        throw kubeError(err, `find the nodes claiming host NQN ${hostNQN}`);
      }
      return [...names].sort();
    },
  };
}

/** DISTORT's node ID in CSINode `nodeName`, or undefined (no CSINode, or DISTORT not in it). */
async function csiNodeId(conn: KubeConnection, nodeName: string): Promise<string | undefined> {
  try {
    const n = await conn.api(k8s.StorageV1Api).readCSINode({ name: nodeName });
    return n.spec.drivers?.find((d) => d.name === DRIVER_NAME)?.nodeID || undefined;
  } catch (err) {
    const e = kubeError(err, `get csinode ${nodeName}`);
    if (e.kind === "not-found") return undefined;
    throw e;
  }
}

/** The labels of Node `nodeName` (RBAC: get nodes). StorageError "not-found" when it does not exist. */
export async function nodeLabels(conn: KubeConnection, nodeName: string): Promise<Record<string, string>> {
  try {
    return (await conn.api(k8s.CoreV1Api).readNode({ name: nodeName })).metadata?.labels ?? {};
  } catch (err) {
    throw kubeError(err, `read node ${nodeName}`);
  }
}

/**
 * The handles of `driver`'s CSI volumes a Node's status names: attached here by the attach/detach
 * controller (status.volumesAttached) and in use by kubelet (status.volumesInUse). Both name a
 * CSI volume "kubernetes.io/csi/<driver>^<volume handle>"; other drivers' entries are left out.
 */
export async function nodeVolumeClaims(
  conn: KubeConnection,
  nodeName: string,
  driver: string,
): Promise<{ uid?: string; attached: Set<string>; inUse: Set<string> }> {
  let node: k8s.V1Node;
  try {
    node = await conn.api(k8s.CoreV1Api).readNode({ name: nodeName });
  } catch (err) {
    throw kubeError(err, `read node ${nodeName}`);
  }
  const prefix = `kubernetes.io/csi/${driver}^`;
  const handles = (names: readonly (string | undefined)[]) =>
    new Set(names.flatMap((n) => (n?.startsWith(prefix) ? [n.slice(prefix.length)] : [])));
  return {
    ...(node.metadata?.uid ? { uid: node.metadata.uid } : {}),
    attached: handles((node.status?.volumesAttached ?? []).map((a) => a.name)),
    inUse: handles(node.status?.volumesInUse ?? []),
  };
}
