// Whether a storage node may receive new partitions, judged from its RDMAStorageNode record:
// present, heartbeat fresh, Ready, a usable RDMA endpoint and complete NVMe inventory. Pure.
import type { RDMAStorageNode } from "../api/index.ts";
import { isTrue } from "../lib/kube/conditions.ts";
import { ConditionTypes } from "./vocabulary.ts";

/** Why a node is not usable; doubles as the condition reason written on its devices. */
export type NodeProblem =
  | "NodeMissing"
  | "NoHeartbeat"
  | "HeartbeatStale"
  | "NodeNotReady"
  | "NoEndpoint"
  | "InventoryNotReady";

export type NodeHealth =
  | { ok: true }
  | {
      ok: false;
      reason: NodeProblem;
      /** Stable across reconciles (no "N seconds ago"), so rewriting it is a no-op. */
      message: string;
    };

/** Milliseconds since the epoch of the last heartbeat, or undefined when none was recorded. */
export function heartbeatMs(node: RDMAStorageNode): number | undefined {
  const t = node.status?.lastHeartbeatTime;
  if (t === undefined) return undefined;
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? undefined : ms;
}

/**
 * When the heartbeat becomes stale (heartbeat + window), or undefined when there is none. A
 * heartbeat from the future (clock skew) simply stays fresh for longer; expiry is never early.
 */
export function staleAtMs(node: RDMAStorageNode, stalenessMs: number): number | undefined {
  const hb = heartbeatMs(node);
  return hb === undefined ? undefined : hb + stalenessMs;
}

/** True when no heartbeat was recorded or the last one is older than the window. */
export function isStale(node: RDMAStorageNode, nowMs: number, stalenessMs: number): boolean {
  const at = staleAtMs(node, stalenessMs);
  return at === undefined || nowMs > at;
}

/**
 * The record to trust when several describe one Kubernetes node (a re-created agent namespace):
 * the one with the newest heartbeat, ties broken by name so the choice is deterministic.
 */
export function pickNode(nodes: Iterable<RDMAStorageNode>): RDMAStorageNode | undefined {
  let best: RDMAStorageNode | undefined;
  for (const n of nodes) {
    if (!best) {
      best = n;
      continue;
    }
    const a = heartbeatMs(n) ?? -1;
    const b = heartbeatMs(best) ?? -1;
    if (a > b || (a === b && n.metadata.name < best.metadata.name)) best = n;
  }
  return best;
}

/** Placement eligibility of the node `nodeName` described by `node` (undefined when absent). */
export function nodeHealth(
  nodeName: string,
  node: RDMAStorageNode | undefined,
  nowMs: number,
  stalenessMs: number,
): NodeHealth {
  if (!node) {
    return { ok: false, reason: "NodeMissing", message: `no RDMAStorageNode reports node ${nodeName}` };
  }
  const hb = node.status?.lastHeartbeatTime;
  if (hb === undefined) {
    return { ok: false, reason: "NoHeartbeat", message: `node ${nodeName} has never reported a heartbeat` };
  }
  if (isStale(node, nowMs, stalenessMs)) {
    return {
      ok: false,
      reason: "HeartbeatStale",
      message: `node ${nodeName}: no heartbeat since ${hb} (staleness window ${Math.round(stalenessMs / 1000)} s)`,
    };
  }
  const conds = node.status?.conditions ?? [];
  if (!isTrue(conds, ConditionTypes.Ready)) {
    return { ok: false, reason: "NodeNotReady", message: `node ${nodeName} is not Ready` };
  }
  if (!node.status?.rdmaIP) {
    return { ok: false, reason: "NoEndpoint", message: `node ${nodeName} reports no RDMA endpoint (rdmaIP)` };
  }
  if (!isTrue(conds, ConditionTypes.NVMeInventoryReady)) {
    return {
      ok: false,
      reason: "InventoryNotReady",
      message: `node ${nodeName}: NVMe inventory is incomplete (NVMeInventoryReady is not True)`,
    };
  }
  return { ok: true };
}
