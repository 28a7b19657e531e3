// Health of what a placed volume stands on, judged from the caches: its storage node's agent (a
// heartbeat past the staleness bound, or no record, means nobody is serving it; an agent that is
// gone cannot flip the partition's Ready) and its drive (missing from the node's inventory). Pure.
import type { NVMeDevice, NVMePartition, RDMAStorageNode } from "../../api/index.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import type { HealthIssue } from "./volume-view.ts";

/** Heartbeat age past which a storage node's agent counts as gone (the manager's default bound). */
export const DEFAULT_HEARTBEAT_STALENESS_MS = 90_000;

export interface StorageView {
  storageNodes: readonly RDMAStorageNode[];
  devices: readonly NVMeDevice[];
  nowMs: number;
  stalenessMs: number;
}

/**
 * INACCESSIBLE issues of placed partition `p` from its storage node and drive, [] when both look
 * alive (or `p` is not placed yet: the partition's own state speaks then). The node's freshest
 * record among `storageNodes` (the caller passes the release namespace's) counts; its heartbeat must be younger than
 * `stalenessMs` and Ready not False. The drive is the NVMeDevice of (nodeName, deviceSerial); it
 * must exist and not be Unavailable (the phase the reporter sets with Present=False when a
 * complete scan no longer finds it; the CSI cache drops device conditions, csi/caches.ts).
 */
export function storageHealth(p: NVMePartition, v: StorageView): HealthIssue[] {
  const nodeName = p.spec.nodeName;
  if (!nodeName || !p.spec.deviceSerial) return [];
  const issues: HealthIssue[] = [];
  let node: RDMAStorageNode | undefined;
  for (const n of v.storageNodes)
    if (
      n.spec.nodeName === nodeName &&
      (!node || (n.status?.lastHeartbeatTime ?? "") > (node.status?.lastHeartbeatTime ?? ""))
    )
      node = n;
  const beat = node?.status?.lastHeartbeatTime;
  const beatMs = beat ? Date.parse(beat) : Number.NaN;
  if (!node) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "StorageNodeMissing",
      message: `storage node ${nodeName} has no RDMAStorageNode record: no agent reports for it`,
    });
  } else if (Number.isNaN(beatMs) || v.nowMs - beatMs > v.stalenessMs) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "StorageNodeStale",
      message: beat
        ? `the agent of storage node ${nodeName} last reported at ${beat}, ${Math.round((v.nowMs - beatMs) / 1000)} s ago (bound ${Math.round(v.stalenessMs / 1000)} s): it is gone or cut off`
        : `the agent of storage node ${nodeName} has never reported a heartbeat`,
    });
  } else {
    const ready = findCondition(node.status?.conditions ?? [], "Ready");
    if (ready?.status === "False")
      issues.push({
        status: "INACCESSIBLE",
        reason: "StorageNodeNotReady",
        message: `storage node ${nodeName} is not Ready (${ready.reason}: ${ready.message})`,
      });
  }
  const drive = v.devices.find((d) => d.spec.nodeName === nodeName && d.spec.serial === p.spec.deviceSerial);
  if (!drive) {
    issues.push({
      status: "INACCESSIBLE",
      reason: "DriveMissing",
      message: `drive ${p.spec.deviceSerial} of storage node ${nodeName} has no NVMeDevice`,
    });
  } else if (drive.status?.phase === "Unavailable") {
    issues.push({
      status: "INACCESSIBLE",
      reason: "DriveUnavailable",
      message: `drive ${p.spec.deviceSerial} (NVMeDevice ${drive.metadata.name}) on ${nodeName} is gone from the node's inventory (phase Unavailable)`,
    });
  }
  return issues;
}
