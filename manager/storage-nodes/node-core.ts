// Storage-node freshness as a pure function: expire Ready on RDMAStorageNode records whose
// heartbeat is older than the staleness window, mirror the node's usability onto its devices
// (condition StorageNodeReady), and say when to look again (the moment the heartbeat goes stale).
import type {
  NVMeDevice,
  NVMeDeviceStatus,
  RDMAStorageNode,
  RDMAStorageNodeStatus,
} from "../../api/index.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { isStale, nodeHealth, pickNode, staleAtMs } from "../node-health.ts";
import { isNoop, type StatusPatch } from "../status-patch.ts";
import { ConditionTypes } from "../vocabulary.ts";

export interface NodeView {
  /** Every RDMAStorageNode whose spec.nodeName is `nodeName`. */
  nodesNamed(nodeName: string): RDMAStorageNode[];
  devicesOnNode(nodeName: string): NVMeDevice[];
}

export interface NodeOutcome {
  nodePatches: { namespace: string; name: string; patch: StatusPatch<RDMAStorageNodeStatus> }[];
  devicePatches: { name: string; patch: StatusPatch<NVMeDeviceStatus> }[];
  events: { node: RDMAStorageNode; eventType: "Warning" | "Normal"; reason: string; note: string }[];
  /** When the freshest heartbeat of a still-fresh record expires, so expiry is on time. */
  requeueAfterMs?: number;
}

export const INITIAL_NODE_STATUS: RDMAStorageNodeStatus = { conditions: [] };

/**
 * Decides for Kubernetes node `nodeName`. Only ever writes Ready=False (reason HeartbeatStale):
 * the agent owns Ready=True and rewrites it with every heartbeat. Device conditions follow the
 * node record placement trusts (the freshest one).
 */
export function decideNode(
  nodeName: string,
  view: NodeView,
  nowMs: number,
  stalenessMs: number,
): NodeOutcome {
  const out: NodeOutcome = { nodePatches: [], devicePatches: [], events: [] };
  const nodes = view.nodesNamed(nodeName);
  let nextExpiry = Number.POSITIVE_INFINITY;
  for (const n of nodes) {
    if (!isStale(n, nowMs, stalenessMs)) {
      nextExpiry = Math.min(nextExpiry, (staleAtMs(n, stalenessMs) as number) + 1);
      continue;
    }
    const ready = findCondition(n.status?.conditions ?? [], ConditionTypes.Ready);
    if (ready?.status === "False" && ready.reason === "HeartbeatStale") continue;
    const hb = n.status?.lastHeartbeatTime;
    const message = hb
      ? `no heartbeat since ${hb} (staleness window ${Math.round(stalenessMs / 1000)} s)`
      : "the agent has never reported a heartbeat";
    out.nodePatches.push({
      namespace: n.metadata.namespace ?? "",
      name: n.metadata.name,
      patch: {
        conditions: [
          {
            type: ConditionTypes.Ready,
            status: "False",
            reason: "HeartbeatStale",
            message,
            observedGeneration: n.metadata.generation,
          },
        ],
      },
    });
    out.events.push({
      node: n,
      eventType: "Warning",
      reason: "HeartbeatStale",
      note: `node ${nodeName}: ${message}`,
    });
  }
  if (Number.isFinite(nextExpiry)) out.requeueAfterMs = Math.max(1, nextExpiry - nowMs);

  const health = nodeHealth(nodeName, pickNode(nodes), nowMs, stalenessMs);
  const patch: StatusPatch<NVMeDeviceStatus> = {
    conditions: [
      health.ok
        ? {
            type: ConditionTypes.StorageNodeReady,
            status: "True",
            reason: "NodeReady",
            message: `node ${nodeName} is fresh, Ready and reachable`,
          }
        : {
            type: ConditionTypes.StorageNodeReady,
            status: "False",
            reason: health.reason,
            message: health.message,
          },
    ],
  };
  for (const d of view.devicesOnNode(nodeName)) {
    if (!isNoop(d.status, patch)) out.devicePatches.push({ name: d.metadata.name, patch });
  }
  return out;
}
