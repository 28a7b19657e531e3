// GetCapacity's arithmetic: the largest volume placement could still hand out for a backend within
// a topology segment. A partition never spans devices, so that is one device's free room, not a sum.
// Pure.

import type { Backend, NVMeDevice, RDMAStorageNode } from "../../api/index.ts";
import { isTrue } from "../../lib/kube/conditions.ts";
import { ALLOCATION_UNIT } from "../../lib/units.ts";
import { matchesSegments } from "./topology.ts";

export interface CapacityQuery {
  backend: Backend;
  /** Only nodes whose labels carry every segment; undefined: the whole cluster. */
  segments?: Readonly<Record<string, string>>;
}

export interface CapacityAnswer {
  /**
   * Largest single volume a CreateVolume of this backend in the segment could get now: the most
   * free bytes of one eligible device, rounded down to the allocation unit (0 when none has a
   * unit free). Free bytes of other devices do not add to it: placement puts a partition on one.
   */
  largestVolumeBytes: number;
  /** Free bytes summed over the eligible devices (what the segment holds, not what one volume gets). */
  totalFreeBytes: number;
}

/** Free bytes of one device: the manager's figure, else allocatable minus its ledger. */
export function deviceFreeBytes(d: NVMeDevice): number {
  if (d.status?.freeBytes !== undefined) return Math.max(0, d.status.freeBytes);
  const promised = (d.status?.reservations ?? []).reduce((s, r) => s + r.bytes, 0);
  return Math.max(0, d.spec.allocatableBytes - promised);
}

/**
 * Capacity for `q`. A device counts when it is Claimed, not locked to the other backend, and its
 * node's RDMAStorageNode (the freshest record when several exist) is Ready with complete NVMe
 * inventory and labels matching the segments. The manager expires Ready on stale heartbeats, so
 * freshness is not judged again here.
 */
export function availableCapacity(
  devices: readonly NVMeDevice[],
  storageNodes: readonly RDMAStorageNode[],
  q: CapacityQuery,
): CapacityAnswer {
  const nodes = new Map<string, RDMAStorageNode>();
  for (const n of storageNodes) {
    const prev = nodes.get(n.spec.nodeName);
    if (!prev || (n.status?.lastHeartbeatTime ?? "") > (prev.status?.lastHeartbeatTime ?? ""))
      nodes.set(n.spec.nodeName, n);
  }
  let totalFreeBytes = 0;
  let largestVolumeBytes = 0;
  for (const d of devices) {
    if (d.status?.phase !== "Claimed" || !d.status.claimRef) continue;
    if (d.status.activeBackend && d.status.activeBackend !== q.backend) continue;
    const node = nodes.get(d.spec.nodeName);
    if (!node) continue;
    const conds = node.status?.conditions ?? [];
    if (!isTrue(conds, "Ready") || !isTrue(conds, "NVMeInventoryReady")) continue;
    if (q.segments && !matchesSegments(q.segments, node.metadata.labels ?? {})) continue;
    const free = deviceFreeBytes(d);
    totalFreeBytes += free;
    largestVolumeBytes = Math.max(largestVolumeBytes, Math.floor(free / ALLOCATION_UNIT) * ALLOCATION_UNIT);
  }
  return { largestVolumeBytes, totalFreeBytes };
}
