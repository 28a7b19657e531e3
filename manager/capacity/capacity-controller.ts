// The capacity controller: keeps each device's ledger and freeBytes true (drops entries only once
// the API server confirms their partition gone or placed elsewhere, counts unledgered placements
// without adopting them, raises Overcommitted). Keys are device names; partition changes map to the devices they touch.
import type { NVMeDevice, NVMeDeviceStatus } from "../../api/index.ts";
import { overcommitRatioOf } from "../../lib/device-ledger.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { claimKeyOf } from "../ownership.ts";
import { writeStatus } from "../status-write.ts";
import { ConditionTypes } from "../vocabulary.ts";
import { auditLedger, capacityStatus, entryIsDead } from "./capacity-core.ts";

export const CAPACITY = "capacity";

/** Partition reads in flight per reconcile while verifying ledger entries. */
const VERIFY_CONCURRENCY = 8;

/**
 * Reconciles one device. Idempotent; safe alongside other managers: the status write is
 * resourceVersion-guarded and recomputed on the latest device, and only UIDs verified dead here
 * are dropped from it (entries added meanwhile stay).
 */
export function capacityReconciler(ctx: ManagerContext): Reconcile {
  const { clients, inventory, metrics } = ctx;
  return async (name, rctx) => {
    const d = inventory.latestDevice(name);
    if (!d) return;
    const audit = auditLedger(d, inventory);
    const dead = new Set(audit.dead.map((r) => r.uid));
    const queue = [...audit.verify];
    const verify = async () => {
      for (let r = queue.shift(); r; r = queue.shift()) {
        const fresh = await clients.partitions.get(r.name, r.namespace);
        if (entryIsDead(r, fresh, d)) dead.add(r.uid);
      }
    };
    await Promise.all(Array.from({ length: Math.min(VERIFY_CONCURRENCY, queue.length) }, verify));
    if (dead.size > 0)
      rctx.log.info("dropping ledger entries of gone partitions", { device: name, count: dead.size });

    const now = new Date(ctx.clock.now());
    const stored = await ctx.deviceLocks.run(name, () =>
      writeStatus<NVMeDeviceStatus, NVMeDevice>(
        clients.devices,
        inventory.latestDevice(name) ?? d,
        (latest) => {
          const key = claimKeyOf(latest);
          const ratio = overcommitRatioOf(key ? inventory.claim(key) : undefined);
          return capacityStatus(latest, inventory.assigned(latest), dead, now, ratio);
        },
      ),
    );
    if (!stored) return;
    inventory.noteFreshDevice(stored);
    metrics.deviceFreeBytes.set({ device: name, node: stored.spec.nodeName }, stored.status?.freeBytes ?? 0);
    const was = findCondition(d.status?.conditions ?? [], ConditionTypes.Overcommitted);
    const is = findCondition(stored.status?.conditions ?? [], ConditionTypes.Overcommitted);
    if (is?.status === "True" && was?.status !== "True") {
      ctx.events.emit(stored, "Warning", "Overcommitted", "Account", is.message);
    }
  };
}

/** Device names to account again when objects change. */
export function capacityTriggers(ctx: ManagerContext): Triggers {
  const { inventory } = ctx;
  return {
    device: (_old, d) => [d.metadata.name],
    partition: (old, p) => {
      const names = new Set<string>();
      for (const x of old ? [old, p] : [p]) {
        if (x.spec.nodeName && x.spec.deviceSerial) {
          const n = inventory.deviceFor(x.spec.nodeName, x.spec.deviceSerial);
          if (n) names.add(n);
        }
        if (x.metadata.uid) for (const n of inventory.devicesHolding(x.metadata.uid)) names.add(n);
      }
      return names;
    },
  };
}
