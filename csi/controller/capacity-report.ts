// GetCapacity's arithmetic: the free bytes placement could still hand out for a backend within a
// topology segment, summed over claimed devices on ready storage nodes. Pure.

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
  /** Sum of free bytes on eligible devices. */
  availableBytes: number;
  /** Largest single volume that fits: a partition never spans devices. */
  maximumVolumeBytes: number;
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
  let availableBytes = 0;
  let maximumVolumeBytes = 0;
  for (const d of devices) {
    if (d.status?.phase !== "Claimed" || !d.status.claimRef) continue;
    if (d.status.activeBackend && d.status.activeBackend !== q.backend) continue;
    const node = nodes.get(d.spec.nodeName);
    if (!node) continue;
    const conds = node.status?.conditions ?? [];
    if (!isTrue(conds, "Ready") || !isTrue(conds, "NVMeInventoryReady")) continue;
    if (q.segments && !matchesSegments(q.segments, node.metadata.labels ?? {})) continue;
    const free = deviceFreeBytes(d);
    availableBytes += free;
    maximumVolumeBytes = Math.max(maximumVolumeBytes, Math.floor(free / ALLOCATION_UNIT) * ALLOCATION_UNIT);
  }
  return { availableBytes, maximumVolumeBytes };
}
