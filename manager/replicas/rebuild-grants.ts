// The cluster-wide rebuild cap as a pure decision: from every replicated volume's status.rebuildSlot
// (asked for by its serving agent), which requests to grant, which to leave queued (and why), and
// which slots to release because what they were for is gone. Level-triggered: the whole answer is
// recomputed from what the API says each time; rebuild-grant-controller.ts carries it out.
import type { NVMePartition, RebuildSlot, ReplicaStatus } from "../../api/index.ts";
import { objectKey } from "../../lib/kube/resource.ts";
import { servingNodeLost } from "./failover.ts";
import type { ReplicaView } from "./replica-core.ts";

/** Default of DISTORT_REBUILDS_PER_CLUSTER: most rebuilds running at once in the cluster. */
export const DEFAULT_REBUILDS_PER_CLUSTER = 4;

export interface GrantInput {
  /** Every replicated volume (spec.replicas > 1) the manager knows. */
  volumes: readonly NVMePartition[];
  /** The replica partitions of the volume with this UID. */
  copiesOf(volumeUid: string): readonly NVMePartition[];
  view: ReplicaView;
  nowMs: number;
  /** Most slots granted at once; 0: none is granted (rebuilds paused). */
  cap: number;
  /**
   * Grants this manager wrote that its cache may not show yet: volume UID -> the requestedAt of
   * the request granted. A cached slot still queued under that very request counts as granted.
   */
  pending?: ReadonlyMap<string, string>;
}

export type GrantAction =
  /** Grant `slot` (the request as read): set grantedAt, drop the message. */
  | { kind: "grant"; key: string; volumeUid: string; slot: RebuildSlot }
  /** `slot` stays queued: record `message` (it differs from what the slot says). */
  | { kind: "queue"; key: string; volumeUid: string; slot: RebuildSlot; message: string }
  /** Remove `slot` from the volume: what it was for is gone (`why`). */
  | { kind: "release"; key: string; volumeUid: string; slot: RebuildSlot; why: string };

export interface GrantDecision {
  /** Releases first, then grants (oldest request first), then queue messages. */
  actions: GrantAction[];
  /** Valid slots granted after the actions (over the cap only when the cap was lowered). */
  granted: number;
  /** Valid requests left waiting after the actions. */
  queued: number;
}

const BEHIND: ReadonlySet<ReplicaStatus["state"]> = new Set(["Stale", "Faulted", "Rebuilding"]);

/**
 * Why `v`'s slot no longer holds, or undefined when it does: the volume is being deleted, another
 * node serves it (or none), its serving node is lost (past spec.failoverAfterSeconds without a
 * heartbeat: the failover's bound), or the copy is no longer one of its copies, is current again
 * or its replica partition is gone or being deleted.
 */
export function slotProblem(
  v: NVMePartition,
  slot: RebuildSlot,
  copies: readonly NVMePartition[],
  view: ReplicaView,
  nowMs: number,
): string | undefined {
  if (v.metadata.deletionTimestamp) return "the volume is being deleted";
  if (v.spec.nodeName !== slot.node)
    return `asked by ${slot.node}, but ${v.spec.nodeName ? `${v.spec.nodeName} serves the volume now` : "no node serves the volume now"}`;
  if (servingNodeLost(v, view, nowMs)) return `serving node ${slot.node} is lost (no heartbeat)`;
  const entry = (v.status?.replicas ?? []).find((e) => e.uid === slot.uid);
  if (!entry) return `copy ${slot.replica} is no longer one of the volume's copies`;
  const g = v.status?.dataGeneration;
  if (!BEHIND.has(entry.state) || (entry.generation === g && entry.state !== "Rebuilding"))
    return `copy ${slot.replica} is ${entry.state} at generation ${entry.generation}: nothing to rebuild`;
  const part = copies.find((c) => c.metadata.uid === slot.uid);
  if (!part) return `replica partition ${slot.replica} is gone`;
  if (part.metadata.deletionTimestamp) return `replica partition ${slot.replica} is being deleted`;
  return undefined;
}

/** Why a request waits at cap `cap` (stable while the cap holds, so rewriting it is a no-op). */
export function queuedMessage(cap: number): string {
  return cap === 0
    ? "cluster rebuild cap 0: no rebuild starts (DISTORT_REBUILDS_PER_CLUSTER)"
    : `cluster rebuild cap ${cap} reached`;
}

/**
 * Decides every slot in the cluster. Pure and total. Valid granted slots keep their grant (a cap
 * lowered below them takes effect as they finish); free slots go to the valid queued requests in
 * order of requestedAt (then volume key), oldest first; the rest are told why they wait.
 */
export function decideGrants(o: GrantInput): GrantDecision {
  const actions: GrantAction[] = [];
  const queued: { key: string; volumeUid: string; slot: RebuildSlot }[] = [];
  let granted = 0;
  for (const v of o.volumes) {
    const slot = v.status?.rebuildSlot;
    if (!slot) continue;
    const key = objectKey(v.metadata);
    const volumeUid = v.metadata.uid as string;
    const why = slotProblem(v, slot, o.copiesOf(volumeUid), o.view, o.nowMs);
    if (why) {
      actions.push({ kind: "release", key, volumeUid, slot, why });
      continue;
    }
    if (slot.grantedAt !== undefined || o.pending?.get(volumeUid) === slot.requestedAt) granted++;
    else queued.push({ key, volumeUid, slot });
  }
  queued.sort(
    (a, b) =>
      Date.parse(a.slot.requestedAt) - Date.parse(b.slot.requestedAt) ||
      (a.key < b.key ? -1 : a.key > b.key ? 1 : 0),
  );
  const waits: GrantAction[] = [];
  let left = 0;
  for (const q of queued) {
    if (granted < o.cap) {
      actions.push({ kind: "grant", ...q });
      granted++;
      continue;
    }
    left++;
    const message = queuedMessage(o.cap);
    if (q.slot.message !== message) waits.push({ kind: "queue", ...q, message });
  }
  return { actions: [...actions, ...waits], granted, queued: left };
}

/** `slot` granted at `at`: what the grant write stores. */
export function grantedSlot(slot: RebuildSlot, at: Date): RebuildSlot {
  const { message: _m, ...rest } = slot;
  return { ...rest, grantedAt: at.toISOString() };
}

/** Whether `a` and `b` are the same request (same copy, asker and time), granted or not. */
export function sameRequest(a: RebuildSlot | undefined, b: RebuildSlot | undefined): boolean {
  return (
    a !== undefined &&
    b !== undefined &&
    a.uid === b.uid &&
    a.node === b.node &&
    a.requestedAt === b.requestedAt
  );
}
