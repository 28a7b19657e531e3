// The drain controller: for every Kubernetes node name, writes the Drained condition on its
// RDMAStorageNode records and NVMeDevices that drain (or drained), from what is still on them,
// and records the drain's Events (DrainStarted, DrainBlocked, DrainCompleted; a Warning on each
// single-copy volume that blocks it). The moving itself is the replica controller's.
import {
  DRAINED,
  isDraining,
  type NVMeDevice,
  type NVMeDeviceStatus,
  type NVMePartition,
  type RDMAStorageNode,
  type RDMAStorageNodeStatus,
} from "../../api/index.ts";
import { INITIAL_DEVICE_STATUS } from "../../lib/device-ledger.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { applyStatusPatch } from "../status-patch.ts";
import { writeStatus } from "../status-write.ts";
import { INITIAL_NODE_STATUS } from "../storage-nodes/node-core.ts";
import { decideDrained, drainLeft } from "./drain-core.ts";

export const DRAIN = "drain";

/** Looked at again while something drains: the agent's exportCount changes without our writes. */
const DRAIN_POLL_MS = 5_000;

const involved = (o: RDMAStorageNode | NVMeDevice) =>
  isDraining(o) || findCondition(o.status?.conditions ?? [], DRAINED) !== undefined;

export function drainReconciler(ctx: ManagerContext): Reconcile {
  const { inventory, clients } = ctx;
  return async (nodeName) => {
    const records = inventory.nodesNamed(nodeName).filter(involved);
    const devices = inventory.devicesOnNode(nodeName).filter(involved);
    if (records.length === 0 && devices.length === 0) return;
    const now = new Date(ctx.clock.now());
    const partitions = [...inventory.allPartitions()];
    const warnBlocked = (keys: string[], what: string) => {
      for (const k of keys) {
        const p = inventory.partition(k) as NVMePartition | undefined;
        if (p)
          ctx.events.emit(
            p,
            "Warning",
            "DrainBlocked",
            "Drain",
            `${what} drains, but this single-copy volume cannot move (no raid superblock area to rebuild a copy into): the drain cannot finish while it is there`,
          );
      }
    };
    let draining = false;
    for (const n of records) {
      const what = `node ${nodeName}`;
      const out = decideDrained(
        n,
        what,
        drainLeft(nodeName, undefined, partitions, n.status?.exportCount ?? 0),
      );
      draining ||= isDraining(n) && out.condition?.status !== "True";
      if (!out.condition) continue;
      const cond = out.condition;
      const have = findCondition(n.status?.conditions ?? [], DRAINED);
      if (have && have.status === cond.status && have.reason === cond.reason && have.message === cond.message)
        continue;
      const stored = await writeStatus<RDMAStorageNodeStatus, RDMAStorageNode>(clients.nodes, n, (latest) =>
        applyStatusPatch(latest.status, INITIAL_NODE_STATUS, { conditions: [cond] }, now),
      );
      if (!stored) continue;
      for (const e of out.events) ctx.events.emit(n, e.type, e.reason, "Drain", e.note);
      warnBlocked(out.blocked, what);
      ctx.metrics.draining.set(
        { kind: "RDMAStorageNode", name: nodeName },
        isDraining(n) && cond.status !== "True" ? 1 : 0,
      );
    }
    for (const d of devices) {
      const what = `device ${d.metadata.name}`;
      const out = decideDrained(d, what, drainLeft(nodeName, d, partitions, 0));
      draining ||= isDraining(d) && out.condition?.status !== "True";
      if (!out.condition) continue;
      const cond = out.condition;
      const have = findCondition(d.status?.conditions ?? [], DRAINED);
      if (have && have.status === cond.status && have.reason === cond.reason && have.message === cond.message)
        continue;
      const stored = await ctx.deviceLocks.run(d.metadata.name, () =>
        writeStatus<NVMeDeviceStatus, NVMeDevice>(
          clients.devices,
          inventory.latestDevice(d.metadata.name) ?? d,
          (latest) => applyStatusPatch(latest.status, INITIAL_DEVICE_STATUS, { conditions: [cond] }, now),
        ),
      );
      if (!stored) continue;
      inventory.noteFreshDevice(stored);
      ctx.metrics.draining.set(
        { kind: "NVMeDevice", name: d.metadata.name },
        isDraining(d) && cond.status !== "True" ? 1 : 0,
      );
      for (const e of out.events) ctx.events.emit(d, e.type, e.reason, "Drain", e.note);
      warnBlocked(out.blocked, what);
    }
    return draining ? { requeueAfterMs: DRAIN_POLL_MS } : {};
  };
}

/** Node names to look at: a node record or device changed, or a partition on a node changed. */
export function drainTriggers(): Triggers {
  return {
    node: (_old, n) => [n.spec.nodeName],
    device: (_old, d) => [d.spec.nodeName],
    partition: (old, p) => [
      ...new Set([old?.spec.nodeName, p.spec.nodeName].filter((x): x is string => x !== undefined)),
    ],
  };
}
