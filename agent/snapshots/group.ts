// The pure core of group snapshots: given every member of a volume group snapshot (as the group
// record names them), their sources and this node, decide whether to wait, refuse, or take all
// members together. The shell (controller.ts) takes them in one burst of SPDK calls.
import { GROUP_SPANS_NODES_REASON, type NVMePartition, type NVMeSnapshot } from "../../api/index.ts";
import { decideSnapshot, type SnapshotPlace, type SnapshotWhy } from "./decide.ts";

/** One member to take: the snapshot, where its lvol goes, and the lvol it copies. */
export interface GroupMemberTake {
  snapshot: NVMeSnapshot;
  place: SnapshotPlace;
  sourceLvol: string;
}

export type GroupDecision =
  | { action: "ignore"; why: string }
  | { action: "wait"; why: SnapshotWhy }
  | { action: "refuse"; why: SnapshotWhy }
  /**
   * Take `members` (the ones not ready yet) together. `fresh`: no member was ever ready, so a
   * snapshot lvol left by an interrupted earlier attempt may predate the others and must be
   * deleted and taken again; otherwise an earlier burst completed and what exists is kept.
   */
  | { action: "take"; members: GroupMemberTake[]; fresh: boolean };

/**
 * Decides for the group whose record lists `names`. `members` maps a name to its NVMeSnapshot
 * (absent: not created yet), `sourceOf` gives each member's source partition. Pure and total.
 * A group is taken only when every member is on this node, has its finalizer and an Exported
 * source; a member on another node makes the whole group refused (no cross-node quiesce).
 */
export function decideGroup(
  names: readonly string[],
  members: ReadonlyMap<string, NVMeSnapshot>,
  sourceOf: (s: NVMeSnapshot) => NVMePartition | undefined,
  nodeName: string,
): GroupDecision {
  const all: NVMeSnapshot[] = [];
  for (const n of names) {
    const m = members.get(n);
    if (!m)
      return {
        action: "wait",
        why: { reason: "MemberMissing", message: `group member ${n} does not exist yet` },
      };
    if (m.metadata.deletionTimestamp) return { action: "ignore", why: `member ${n} is being deleted` };
    all.push(m);
  }
  const nodes = new Set<string>();
  for (const m of all) {
    const node = m.status?.nodeName ?? sourceOf(m)?.spec.nodeName;
    if (node) nodes.add(node);
  }
  if (nodes.size > 1)
    return {
      action: "refuse",
      why: {
        reason: GROUP_SPANS_NODES_REASON,
        message: `the group's sources are on storage nodes ${[...nodes].sort().join(", ")}; a group snapshot needs them on one node`,
      },
    };
  const takes: GroupMemberTake[] = [];
  let anyReady = false;
  for (const m of all) {
    const d = decideSnapshot(m, sourceOf(m), nodeName);
    switch (d.action) {
      case "take":
        takes.push({ snapshot: m, place: d.place, sourceLvol: d.sourceLvol });
        break;
      case "refuse":
        return d;
      case "ignore":
        if (d.why === "ready") {
          anyReady = true;
          break;
        }
        return { action: "ignore", why: `member ${m.metadata.name}: ${d.why}` };
      case "add-finalizer":
        return {
          action: "wait",
          why: { reason: "MemberPending", message: `group member ${m.metadata.name} has no finalizer yet` },
        };
      case "wait":
        return d;
      case "delete":
      case "done":
        return { action: "ignore", why: `member ${m.metadata.name} is being deleted` };
    }
  }
  if (takes.length === 0) return { action: "ignore", why: "every member is ready" };
  return { action: "take", members: takes, fresh: !anyReady };
}
