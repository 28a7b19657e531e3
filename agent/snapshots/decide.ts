// The snapshot reconciler's pure core: given an NVMeSnapshot, its source partition (if it still
// exists) and this node's name, decide whether to add the finalizer, take the SPDK snapshot,
// wait, refuse, or delete it. The shell (controller.ts) runs the decision through SPDK and Kubernetes.
import type { NVMePartition, NVMeSnapshot } from "../../api/index.ts";
import { externalIdFor, snapshotExternalIdFor } from "../partitions/identity.ts";

export const SNAPSHOT_FINALIZER = "storage.distort.io/snapshot-cleanup";

export interface SnapshotWhy {
  reason: string;
  message: string;
}

/** Where the snapshot lvol lives: the source's node and drive when taken, recorded in status. */
export interface SnapshotPlace {
  nodeName: string;
  deviceSerial: string;
  /** Snapshot lvol name (snap-<hash of the snapshot's uid>). */
  externalId: string;
}

export type SnapshotDecision =
  | { action: "ignore"; why: string }
  | { action: "add-finalizer" }
  | { action: "wait"; why: SnapshotWhy }
  | { action: "refuse"; why: SnapshotWhy }
  | { action: "take"; place: SnapshotPlace; sourceLvol: string }
  /** Delete the snapshot lvol (when `place` is known), then drop the finalizer. */
  | { action: "delete"; place?: SnapshotPlace }
  | { action: "done" };

/**
 * Decides the next action. Pure and total. The node that owns a snapshot is the one recorded in
 * its status, else its source partition's node; every other agent ignores it. A snapshot already
 * ready is left alone (SPDK snapshots are immutable); deletion wins over everything.
 */
export function decideSnapshot(
  s: NVMeSnapshot,
  source: NVMePartition | undefined,
  nodeName: string,
): SnapshotDecision {
  const uid = s.metadata.uid;
  if (!uid) return { action: "ignore", why: "no UID yet" };
  const src = source && source.metadata.uid === s.spec.sourcePartitionUID ? source : undefined;
  const node = s.status?.nodeName ?? src?.spec.nodeName;
  const serial = s.status?.deviceSerial ?? src?.spec.deviceSerial;
  const hasFinalizer = (s.metadata.finalizers ?? []).includes(SNAPSHOT_FINALIZER);
  const place =
    node && serial
      ? {
          nodeName: node,
          deviceSerial: serial,
          // From the UID, never from status: a status naming another lvol would make deletion
          // remove that lvol.
          externalId: snapshotExternalIdFor(uid),
        }
      : undefined;

  if (s.metadata.deletionTimestamp) {
    if (!hasFinalizer) return { action: "done" };
    if (node !== undefined && node !== nodeName) return { action: "ignore", why: `held on node ${node}` };
    // Nowhere known: nothing was ever taken (the status records the place before readiness).
    if (!place) return node === nodeName ? { action: "delete" } : { action: "ignore", why: "never placed" };
    return { action: "delete", place };
  }
  if (!node) {
    // Only the agent that will act reports, and none knows yet: the CSI controller times out.
    return { action: "ignore", why: src ? "source not placed yet" : "source partition not found" };
  }
  if (node !== nodeName) return { action: "ignore", why: `belongs to node ${node}` };
  if (!hasFinalizer) return { action: "add-finalizer" };
  if (s.status?.readyToUse) return { action: "ignore", why: "ready" };
  if (!src) {
    return {
      action: "refuse",
      why: {
        reason: "SourceNotFound",
        message: `source partition ${s.spec.sourcePartitionName} (uid ${s.spec.sourcePartitionUID}) no longer exists`,
      },
    };
  }
  if ((src.spec.backend ?? "spdk") !== "spdk") {
    return {
      action: "refuse",
      why: {
        reason: "UnsupportedBackend",
        message: `partition ${src.metadata.name} uses the kernel backend: disk partitions cannot be snapshotted`,
      },
    };
  }
  if (src.status?.state !== "Exported" || !src.status.externalId) {
    return {
      action: "wait",
      why: {
        reason: "SourceNotExported",
        message: `source partition ${src.metadata.name} is ${src.status?.state ?? "Pending"}, not Exported`,
      },
    };
  }
  return {
    action: "take",
    place: place as SnapshotPlace,
    sourceLvol: externalIdFor(src.metadata.uid as string),
  };
}
