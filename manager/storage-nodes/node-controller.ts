// The storage-node controller: expires Ready on RDMAStorageNode records whose heartbeat is stale
// and mirrors node usability onto each device (StorageNodeReady). Keys are Kubernetes node names;
// records and devices map to their node. Requeues itself for the moment a heartbeat expires.
import type {
  NVMeDevice,
  NVMeDeviceStatus,
  RDMAStorageNode,
  RDMAStorageNodeStatus,
} from "../../api/index.ts";
import { INITIAL_DEVICE_STATUS } from "../../lib/device-ledger.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { isStale } from "../node-health.ts";
import { applyStatusPatch } from "../status-patch.ts";
import { writeStatus } from "../status-write.ts";
import { decideNode, INITIAL_NODE_STATUS } from "./node-core.ts";

export const STORAGE_NODES = "storage-nodes";

/**
 * Reconciles one Kubernetes node name. Ready=False is written only if the record read at write
 * time is still stale, so a heartbeat that lands meanwhile is never overruled.
 */
export function nodeReconciler(ctx: ManagerContext): Reconcile {
  const { clients, inventory } = ctx;
  return async (nodeName) => {
    const nowMs = ctx.clock.now();
    const now = new Date(nowMs);
    const out = decideNode(nodeName, inventory, nowMs, ctx.config.stalenessMs);
    for (const np of out.nodePatches) {
      let expired = false;
      await updateStatus<RDMAStorageNodeStatus, RDMAStorageNode>(
        clients.nodes,
        np.name,
        np.namespace,
        (latest) => {
          expired = isStale(latest, ctx.clock.now(), ctx.config.stalenessMs);
          return expired ? applyStatusPatch(latest.status, INITIAL_NODE_STATUS, np.patch, now) : undefined;
        },
      );
      const ev = out.events.find(
        (e) => e.node.metadata.name === np.name && e.node.metadata.namespace === np.namespace,
      );
      if (expired && ev) ctx.events.emit(ev.node, ev.eventType, ev.reason, "Expire", ev.note);
    }
    for (const dp of out.devicePatches) {
      const d = inventory.latestDevice(dp.name);
      if (!d) continue;
      const stored = await ctx.deviceLocks.run(dp.name, () =>
        writeStatus<NVMeDeviceStatus, NVMeDevice>(
          clients.devices,
          inventory.latestDevice(dp.name) ?? d,
          (latest) => applyStatusPatch(latest.status, INITIAL_DEVICE_STATUS, dp.patch, now),
        ),
      );
      if (stored) inventory.noteFreshDevice(stored);
    }
    return out.requeueAfterMs === undefined ? {} : { requeueAfterMs: out.requeueAfterMs };
  };
}

/** Node names to look at when objects change. */
export function nodeTriggers(): Triggers {
  return {
    node: (old, n) =>
      old && old.spec.nodeName !== n.spec.nodeName ? [old.spec.nodeName, n.spec.nodeName] : [n.spec.nodeName],
    device: (_old, d) => [d.spec.nodeName],
  };
}
