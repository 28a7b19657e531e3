// The claim controller: runs decideClaim's actions against the API server (finalizer edits bound
// to the claim's UID, device ownership writes guarded by the device's resourceVersion) and writes
// the claim's status. Keys are claim "namespace/name"; devices and partitions map to them.
import type { NVMeDevice, NVMeDeviceClaim } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import { splitKey } from "../../lib/kube/resource.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { editFinalizers } from "../finalizers.ts";
import { claimKeyOf } from "../ownership.ts";
import { applyStatusPatch, isNoop } from "../status-patch.ts";
import { CLAIM_FINALIZER } from "../vocabulary.ts";
import {
  bindDeviceStatus,
  type ClaimAction,
  decideClaim,
  decideMissingClaim,
  INITIAL_CLAIM_STATUS,
  releaseDeviceStatus,
} from "./claim-core.ts";

export const CLAIMS = "claims";

/**
 * Reconciles one claim key. Idempotent: every write re-reads its target and re-decides on it.
 * Binding another claim got to first, or a release the fresh ledger refuses, throws a conflict
 * (retried with backoff; by then the cache shows why and the status says so).
 */
export function claimReconciler(ctx: ManagerContext): Reconcile {
  const { clients, inventory } = ctx;
  return async (key, rctx) => {
    const claim = inventory.claim(key);
    const out = claim ? decideClaim(claim, inventory) : decideMissingClaim(key, inventory);
    for (const a of out.actions) {
      rctx.signal.throwIfAborted(); // stop writing once leadership is gone
      await run(ctx, claim, a, rctx.log);
    }
    if (claim && out.status && !isNoop(claim.status, out.status)) {
      const patch = out.status;
      const uid = claim.metadata.uid;
      const { name, namespace } = splitKey(key);
      await updateStatus(clients.claims, name, namespace, (latest) =>
        latest.metadata.uid !== uid
          ? undefined
          : applyStatusPatch(latest.status, INITIAL_CLAIM_STATUS, patch, new Date(ctx.clock.now())),
      );
    }
  };
}

async function run(
  ctx: ManagerContext,
  claim: NVMeDeviceClaim | undefined,
  a: ClaimAction,
  log: ManagerContext["log"],
): Promise<void> {
  const { clients, inventory } = ctx;
  const uid = claim?.metadata.uid ?? "";
  switch (a.type) {
    case "addFinalizer":
    case "removeFinalizer": {
      if (!claim) return;
      const add = a.type === "addFinalizer";
      await editFinalizers(clients.claims, claim.metadata.name, claim.metadata.namespace, uid, (fins) => {
        if (add) return fins.includes(CLAIM_FINALIZER) ? undefined : [...fins, CLAIM_FINALIZER];
        return fins.filter((f) => f !== CLAIM_FINALIZER);
      });
      return;
    }
    case "bind": {
      if (!claim) return;
      let refused: string | undefined;
      const stored = await updateStatus(clients.devices, a.device, undefined, (latest) => {
        refused = undefined;
        if (latest.spec.serial !== claim.spec.serial) {
          refused = `device ${a.device} no longer has serial ${claim.spec.serial}`;
          return undefined;
        }
        const r = bindDeviceStatus(latest, claim);
        if (!r.ok) refused = r.message;
        return r.ok ? r.status : undefined;
      });
      if (stored) inventory.noteFreshDevice(stored);
      if (refused) throw new StorageError("conflict", `bind ${claim.metadata.name}: ${refused}`);
      if (!stored)
        throw new StorageError("conflict", `bind ${claim.metadata.name}: device ${a.device} is gone`);
      return;
    }
    case "release":
      await release(ctx, a.device, a.uid, log, true);
      return;
    case "releaseOrphan": {
      // One name, one object: if the API server holds a claim of that name with another UID (or
      // none), the UID the device names is gone for good and can never come back.
      const { name, namespace } = splitKey(a.claimKey);
      const live = await clients.claims.get(name, namespace);
      if (live?.metadata.uid === a.uid) return;
      const held = await release(ctx, a.device, a.uid, log, false);
      if (held) {
        const d = inventory.latestDevice(a.device);
        if (d) {
          ctx.events.emit(
            d,
            "Warning",
            "OrphanedClaim",
            "Release",
            `claim ${a.claimKey} (uid ${a.uid}) no longer exists but ${held}; the device is released once they are deleted`,
          );
        }
      }
      return;
    }
    case "event": {
      if (claim) ctx.events.emit(claim, a.eventType, a.reason, "Bind", a.note);
      return;
    }
  }
}

/**
 * Drops ownership `uid` of `device` if the fresh device still names it and its ledger is empty.
 * Returns the reason when the ledger holds partitions (throws it as a conflict when `strict`).
 */
async function release(
  ctx: ManagerContext,
  device: string,
  uid: string,
  log: ManagerContext["log"],
  strict: boolean,
): Promise<string | undefined> {
  let held: string | undefined;
  let notOwner = false;
  const stored = await updateStatus(ctx.clients.devices, device, undefined, (latest) => {
    held = undefined;
    notOwner = false;
    const r = releaseDeviceStatus(latest, uid);
    if (r.kind === "held") held = r.message;
    if (r.kind === "not-owner") notOwner = true;
    return r.kind === "release" ? r.status : undefined;
  });
  if (stored) ctx.inventory.noteFreshDevice(stored);
  if (notOwner) log.info("device names another claim; left alone", { device, uid });
  if (held && strict) throw new StorageError("conflict", `release of ${device}: ${held}`);
  return held;
}

function claimKeysOfDevice(d: NVMeDevice, inventory: ManagerContext["inventory"]): string[] {
  const keys = inventory
    .claimsWithSerial(d.spec.serial)
    .map((c) => `${c.metadata.namespace}/${c.metadata.name}`);
  const owner = claimKeyOf(d);
  if (owner) keys.push(owner);
  return keys;
}

/** Claim keys to reconcile when objects change. */
export function claimTriggers(ctx: ManagerContext): Triggers {
  const { inventory } = ctx;
  return {
    claim: (_old, c) => [`${c.metadata.namespace}/${c.metadata.name}`],
    device: (old, d) => [
      ...claimKeysOfDevice(d, inventory),
      ...(old ? claimKeysOfDevice(old, inventory) : []),
    ],
    // A deleting claim waits for its partitions: any partition change on its device may free it.
    partition: (old, p) => {
      const keys = new Set<string>();
      for (const x of old ? [old, p] : [p]) {
        if (x.spec.claimRef) keys.add(`${x.spec.claimRef.namespace}/${x.spec.claimRef.name}`);
      }
      return keys;
    },
  };
}
