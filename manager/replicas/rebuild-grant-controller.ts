// The rebuild-grant controller: one key for the whole cluster, one worker. Each pass decides every
// replicated volume's status.rebuildSlot with decideGrants (rebuild-grants.ts) from the watch
// caches and writes the grants, queue reasons and releases, each guarded by the request it read.

import type { NVMePartition, NVMePartitionStatus } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { writeStatus } from "../status-write.ts";
import { decideGrants, type GrantAction, grantedSlot, sameRequest } from "./rebuild-grants.ts";
import { isReplicated } from "./replica-core.ts";

export const REBUILD_GRANTS = "rebuild-grants";
/** The controller's only key: the grants are one decision over the whole cluster. */
export const REBUILD_GRANTS_KEY = "cluster";

/** While any slot exists, time-dependent inputs (a serving node's heartbeat ageing past its bound) are looked at this often. */
const RECHECK_MS = 5000;

/** What one controller instance remembers between passes (made anew each leadership term). */
export class RebuildGrantState {
  /**
   * Grants written whose effect the cache may not show yet: volume UID -> requestedAt. Kept
   * until the cached slot is granted, another request or gone, so a pass right after a grant
   * never hands out the same slot twice.
   */
  readonly pending = new Map<string, string>();
}

export function rebuildGrantReconciler(ctx: ManagerContext, state: RebuildGrantState): Reconcile {
  const { inventory, clients, metrics } = ctx;
  return async (_key, rctx) => {
    const volumes: NVMePartition[] = [];
    for (const k of inventory.replicatedKeys()) {
      const v = inventory.partition(k);
      if (v) volumes.push(v);
    }
    // Pending grants the cache has caught up with (or that were overtaken) count from the cache.
    const byUid = new Map(volumes.map((v) => [v.metadata.uid as string, v]));
    for (const [uid, requestedAt] of state.pending) {
      const slot = byUid.get(uid)?.status?.rebuildSlot;
      if (!slot || slot.requestedAt !== requestedAt || slot.grantedAt !== undefined)
        state.pending.delete(uid);
    }
    const now = ctx.clock.now();
    const d = decideGrants({
      volumes,
      copiesOf: (uid) => inventory.replicasOf(uid),
      view: inventory,
      nowMs: now,
      cap: ctx.config.rebuildsPerCluster,
      pending: state.pending,
    });
    metrics.rebuildSlots.set({ state: "granted" }, d.granted);
    metrics.rebuildSlots.set({ state: "queued" }, d.queued);
    for (const a of d.actions) {
      rctx.signal.throwIfAborted();
      const v = byUid.get(a.volumeUid) as NVMePartition;
      // Whether the last computation (on the latest object) still found the request it decided on.
      let applies = false;
      try {
        const stored = await writeStatus<NVMePartitionStatus, NVMePartition>(
          clients.partitions,
          v,
          (latest) => {
            const next =
              latest.metadata.uid === a.volumeUid ? nextStatus(latest.status, a, new Date(now)) : undefined;
            applies = next !== undefined;
            return next;
          },
        );
        if (!stored || !applies) continue;
        if (a.kind === "grant") {
          state.pending.set(a.volumeUid, a.slot.requestedAt);
          metrics.rebuildGrants.inc({});
          rctx.log.info("rebuild slot granted", { volume: a.key, copy: a.slot.replica, node: a.slot.node });
          ctx.events.emit(
            v,
            "Normal",
            "RebuildGranted",
            "Rebuild",
            `cluster rebuild slot granted to ${a.slot.node} for copy ${a.slot.replica}`,
          );
        } else if (a.kind === "release") {
          metrics.rebuildSlotReleases.inc({});
          rctx.log.info("rebuild slot released", { volume: a.key, copy: a.slot.replica, why: a.why });
          ctx.events.emit(
            v,
            "Normal",
            "RebuildSlotReleased",
            "Rebuild",
            `rebuild slot of copy ${a.slot.replica} released: ${a.why}`,
          );
        }
      } catch (err) {
        // The next pass decides again from what the watch brings.
        if (err instanceof StorageError && err.kind === "conflict") return { requeueAfterMs: 200 };
        throw err;
      }
    }
    return volumes.some((v) => v.status?.rebuildSlot) ? { requeueAfterMs: RECHECK_MS } : undefined;
  };
}

/**
 * The status `a` asks for over `current`, or undefined when the slot there is no longer the
 * request `a` was decided on (the agent released it, or asked again meanwhile).
 */
function nextStatus(
  current: NVMePartitionStatus | undefined,
  a: GrantAction,
  now: Date,
): NVMePartitionStatus | undefined {
  const slot = current?.rebuildSlot;
  if (!current || !sameRequest(slot, a.slot) || !slot) return undefined;
  switch (a.kind) {
    case "grant":
      return slot.grantedAt === undefined ? { ...current, rebuildSlot: grantedSlot(slot, now) } : undefined;
    case "queue":
      return slot.grantedAt === undefined
        ? { ...current, rebuildSlot: { ...slot, message: a.message } }
        : undefined;
    case "release": {
      const { rebuildSlot: _s, ...rest } = current;
      return rest;
    }
  }
}

/**
 * Any change of a replicated volume or of a replica partition asks for a pass. Storage nodes do
 * not: a serving node's heartbeat only matters once it ages past its bound, which the periodic
 * pass (while any slot exists) finds.
 */
export function rebuildGrantTriggers(): Triggers {
  const one = [REBUILD_GRANTS_KEY];
  return {
    partition: (old, p) =>
      isReplicated(p) || p.spec.replicaOf || (old && (isReplicated(old) || old.spec.replicaOf)) ? one : [],
  };
}
