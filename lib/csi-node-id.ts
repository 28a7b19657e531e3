// The CSI node ID DISTORT's node plugin reports in NodeGetInfo: "<Kubernetes node name>/<host NQN>".
// kubelet stores it in the node's CSINode, which node authorization lets only that node's kubelet
// write, so the host NQN the controller admits no longer comes from a Node annotation that any
// holder of `patch nodes` could rewrite. A plain node name is the format of earlier releases.

/** CSI's limit on node_id (NodeGetInfoResponse). */
export const MAX_NODE_ID_BYTES = 256;

/** What a node ID says. */
export interface NodeIdParts {
  /** The Kubernetes Node name. */
  nodeName: string;
  /** The node's host NQN; undefined in a node ID of an earlier release (a bare node name). */
  hostNQN?: string;
}

/**
 * The node ID for `nodeName` and `hostNQN`. Node names never contain "/", so the first "/" splits
 * it unambiguously. Throws when the result exceeds CSI's 256 bytes (a node name near its 253
 * character limit with a long NQN): the node plugin refuses to start rather than be truncated.
 */
export function formatNodeId(nodeName: string, hostNQN: string): string {
  const id = `${nodeName}/${hostNQN}`;
  if (Buffer.byteLength(id) > MAX_NODE_ID_BYTES) {
    throw new Error(
      `CSI node ID "${id}" would be ${Buffer.byteLength(id)} bytes, over CSI's ${MAX_NODE_ID_BYTES}: shorten the node name or the host NQN`,
    );
  }
  return id;
}

/** Splits a node ID; a bare node name (earlier releases) carries no host NQN. */
export function parseNodeId(id: string): NodeIdParts {
  const at = id.indexOf("/");
  if (at < 0) return { nodeName: id };
  const hostNQN = id.slice(at + 1);
  return { nodeName: id.slice(0, at), ...(hostNQN ? { hostNQN } : {}) };
}

/** True when two node IDs name the same Kubernetes Node, whatever their format. */
export function sameNode(a: string, b: string): boolean {
  return parseNodeId(a).nodeName === parseNodeId(b).nodeName;
}
