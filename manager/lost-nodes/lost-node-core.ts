// Deleted partitions whose storage node is gone, as a pure decision: the agent that holds such a
// partition's finalizer cannot let go, so past a bound (DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS)
// the manager does it in its place: its attachments' finalizers first (that node cannot revoke a
// host any more; its agent, should it return, revokes every host no attachment names), then the
// drive's ledger entry becomes a leftover (the room stays held: the node may come back holding
// the volume, and its agent then deletes it), then the partition's own finalizer. Nothing is
// released while the node beats or within the bound, nor while a live attachment names it.
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { heartbeatMs } from "../node-health.ts";
import type { ReplicaView } from "../replicas/replica-core.ts";

/** The agent's finalizer on a partition (agent/partitions/decide.ts PARTITION_FINALIZER). */
export const AGENT_PARTITION_FINALIZER = "storage.distort.io/partition-cleanup";
/** The agent's finalizer on an attachment (agent/attachments/controller.ts ATTACHMENT_FINALIZER). */
export const AGENT_ATTACHMENT_FINALIZER = "storage.distort.io/acl-revoke";

/** Default of ManagerConfig.lostNodeReleaseAfterMs (DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS). */
export const DEFAULT_LOST_NODE_RELEASE_AFTER_MS = 900_000;

export type LostNodeStep =
  /** Not a deleted partition held by the agent of a node this concerns. */
  | { kind: "none" }
  /** Its node may still come back in time, or a live attachment still names it: look again. */
  | { kind: "wait"; requeueAfterMs: number; why: string }
  /**
   * Release it: drop the agent's finalizer from `attachments` (being deleted), mark the ledger
   * entry on the drive leftover (when it has a drive), record why, drop the partition's finalizer.
   */
  | { kind: "release"; node: string; attachments: string[]; message: string; since: string };

/**
 * The step for `p`, given the storage nodes (`view`), the attachments naming its UID in its
 * namespace (`attachments`), the clock and the bound. The node is lost from its last heartbeat
 * (from the deletion request when its RDMAStorageNode is gone, or never beat: the earliest
 * moment the manager can know), and stays lost only while no heartbeat comes: a briefly cut-off
 * node that beats again within the bound keeps its partition, which its agent then deletes.
 */
export function decideLostNode(
  p: NVMePartition,
  view: ReplicaView,
  attachments: readonly NVMeVolumeAttachment[],
  nowMs: number,
  boundMs: number,
): LostNodeStep {
  const node = p.spec.nodeName;
  if (!p.metadata.deletionTimestamp || !node) return { kind: "none" };
  if (!(p.metadata.finalizers ?? []).includes(AGENT_PARTITION_FINALIZER)) return { kind: "none" };
  const record = view.node(node);
  const hb = record ? heartbeatMs(record) : undefined;
  const deleted = Date.parse(p.metadata.deletionTimestamp) + 999; // whole seconds: never early
  const sinceMs = hb ?? deleted;
  const at = sinceMs + boundMs;
  const since = new Date(sinceMs).toISOString();
  if (nowMs < at) {
    return {
      kind: "wait",
      requeueAfterMs: Math.min(60_000, Math.max(1000, at - nowMs)),
      why: `storage node ${node} last seen ${since}; released at ${new Date(at).toISOString()} unless it returns`,
    };
  }
  const mine = attachments.filter(
    (a) => a.spec.partitionUID === p.metadata.uid && a.metadata.namespace === p.metadata.namespace,
  );
  const live = mine.filter((a) => !a.metadata.deletionTimestamp);
  if (live.length > 0) {
    return {
      kind: "wait",
      requeueAfterMs: 30_000,
      why: `storage node ${node} is lost, but attachments still name the partition: ${live.map((a) => a.metadata.name).join(", ")}`,
    };
  }
  const what = record
    ? `storage node ${node} is lost (no heartbeat since ${since}, past the ${Math.round(boundMs / 1000)} s bound)`
    : `storage node ${node} has no RDMAStorageNode (removed; deletion requested ${p.metadata.deletionTimestamp})`;
  const drive = p.spec.deviceSerial
    ? `; the volume may still be on drive ${p.spec.deviceSerial} on ${node}: its room stays held until the node's agent deletes it there, or the NVMeDevice is deleted`
    : "";
  return {
    kind: "release",
    node,
    attachments: mine
      .filter((a) => (a.metadata.finalizers ?? []).includes(AGENT_ATTACHMENT_FINALIZER))
      .map((a) => a.metadata.name),
    message: `${what}: the partition is released by the manager without its volume being deleted${drive}`,
    since: new Date(nowMs).toISOString(),
  };
}
