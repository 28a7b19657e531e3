// The lost-node release controller: for a deleted partition whose storage node has been gone
// past the bound, does what that node's agent can no longer do (lost-node-core.ts decides).
// Keys are partition keys; only partitions being deleted with the agent's finalizer are queued.
import { markLeftover } from "../../lib/device-ledger.ts";
import { objectKey } from "../../lib/kube/resource.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { editFinalizers } from "../finalizers.ts";
import { writeStatus } from "../status-write.ts";
import { AGENT_ATTACHMENT_FINALIZER, AGENT_PARTITION_FINALIZER, decideLostNode } from "./lost-node-core.ts";

export const LOST_NODES = "lost-nodes";

/** Reason of the Event recorded on a partition released because its node is gone. */
export const RELEASED_FROM_LOST_NODE = "DataOnLostDevice";

export function lostNodeReconciler(ctx: ManagerContext): Reconcile {
  const { inventory, clients } = ctx;
  const bound = () => ctx.config.lostNodeReleaseAfterMs;
  return async (key, rctx) => {
    const p = inventory.partition(key);
    if (!p) return;
    let step = decideLostNode(p, inventory, [], ctx.clock.now(), bound());
    if (step.kind === "none") return;
    if (step.kind === "wait") return { requeueAfterMs: step.requeueAfterMs };
    // Past the bound: decide again with the partition's attachments as the API server has them.
    const namespace = p.metadata.namespace as string;
    const all = (await clients.attachments?.list({ namespace }))?.items ?? [];
    step = decideLostNode(p, inventory, all, ctx.clock.now(), bound());
    if (step.kind === "none") return;
    if (step.kind === "wait") {
      rctx.log.info("deleted partition on a lost node waits", { partition: key, why: step.why });
      return { requeueAfterMs: step.requeueAfterMs };
    }
    rctx.signal.throwIfAborted();
    for (const name of step.attachments) {
      const a = await clients.attachments?.get(name, namespace);
      if (!a?.metadata.deletionTimestamp) continue;
      await clients.attachments?.replace({
        ...a,
        metadata: {
          ...a.metadata,
          finalizers: (a.metadata.finalizers ?? []).filter((f) => f !== AGENT_ATTACHMENT_FINALIZER),
        },
      });
    }
    const uid = p.metadata.uid as string;
    const deviceName =
      p.spec.nodeName && p.spec.deviceSerial
        ? inventory.deviceFor(p.spec.nodeName, p.spec.deviceSerial)
        : undefined;
    const device = deviceName ? inventory.latestDevice(deviceName) : undefined;
    let marked = false;
    if (device) {
      const leftover = { since: step.since, reason: "NodeLost" };
      const stored = await ctx.deviceLocks.run(device.metadata.name, () =>
        writeStatus(clients.devices, device, (latest) => markLeftover(latest, uid, leftover)),
      );
      if (stored) inventory.noteFreshDevice(stored);
      marked = stored?.status?.reservations?.some((r) => r.uid === uid && r.leftover) ?? false;
    }
    ctx.events.emit(p, "Warning", RELEASED_FROM_LOST_NODE, "Release", step.message);
    if (device && marked)
      ctx.events.emit(device, "Warning", RELEASED_FROM_LOST_NODE, "Release", step.message);
    await editFinalizers(clients.partitions, p.metadata.name, namespace, uid, (f) =>
      f.includes(AGENT_PARTITION_FINALIZER) ? f.filter((x) => x !== AGENT_PARTITION_FINALIZER) : undefined,
    );
    rctx.log.warn("deleted partition released from a lost storage node", {
      partition: key,
      node: step.node,
      device: deviceName,
      leftover: marked,
    });
    return;
  };
}

/**
 * Partition keys to look at: partitions being deleted that the agent's finalizer still holds. A
 * node's heartbeat ages without any event, so each waiting key is requeued by its reconcile.
 */
export function lostNodeTriggers(): Triggers {
  return {
    partition: (_old, p) =>
      p.metadata.deletionTimestamp !== undefined &&
      (p.metadata.finalizers ?? []).includes(AGENT_PARTITION_FINALIZER)
        ? [objectKey(p.metadata)]
        : [],
  };
}
