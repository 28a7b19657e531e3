// The placement controller: decides with decidePlacement, stores the ledger entry on the chosen
// device (resourceVersion-guarded, claim and node read fresh), only then writes the partition's
// spec, and records Scheduled and Events. Keys are partitions; README.md gives the safety argument.
import type { NVMeDevice, NVMePartition, NVMePartitionStatus } from "../../api/index.ts";
import { KeyedMutex } from "../../lib/concurrency/keyed-mutex.ts";
import { type PartitionUse, partitionUse } from "../../lib/device-ledger.ts";
import { StorageError } from "../../lib/errors.ts";
import { objectKey } from "../../lib/kube/resource.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { Logger } from "../../lib/log.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { compareResourceVersions } from "../inventory.ts";
import { nodeHealth } from "../node-health.ts";
import { applyStatusPatch } from "../status-patch.ts";
import { writeStatus } from "../status-write.ts";
import { PlacedDigest } from "./placed-digest.ts";
import {
  decidePlacement,
  INITIAL_PARTITION_STATUS,
  type PlacementConfig,
  type PlacementOutcome,
  type ReplicaSpread,
  type Reserve,
  type SourcePin,
} from "./placement-core.ts";
import { reserveVerdict } from "./reservation.ts";

export const PLACEMENT = "placement";

/** Decide-reserve rounds per reconcile before giving up to the rate-limited retry. */
const ROUNDS = 4;
/** Ledger write attempts per reservation (each conflict re-reads the device). */
const WRITE_ATTEMPTS = 8;
/**
 * A refusal that rests on devices whose claim the caches have not caught up with is held back
 * this many times (requeued, nothing written) before it is reported anyway; the delays double
 * from SETTLE_FIRST_MS up to SETTLE_MAX_MS, about 12 s in all.
 */
export const SETTLE_DEFERRALS = 8;
/** Placements on one device within this window share one Placed event. */
export const PLACED_DIGEST_MS = 5000;
const SETTLE_FIRST_MS = 250;
const SETTLE_MAX_MS = 2000;

/** State the placement controller keeps between reconciles (all of it rebuildable). */
export class PlacementState {
  /** When this process first saw each unplaced partition, for the latency histogram. */
  readonly firstSeen = new Map<string, number>();
  /** Partitions last found unschedulable: requeued at once when capacity may have appeared. */
  readonly unschedulable = new Set<string>();
  /** Refusals held back while the claim view settles: partition key -> deferrals so far. */
  readonly settling = new Map<string, number>();
  /** resourceVersion of the last partition object this process stored, until the cache has it. */
  readonly written = new Map<string, string>();
  /** Placed events waiting to be written as one per device; flush() it before stopping. */
  digest: PlacedDigest | undefined;
  /**
   * Replicas of one volume are placed one at a time in this process (keyed by the volume's UID),
   * so each decision sees where its siblings went. Across processes the replica controller
   * repairs two copies that still meet on one node.
   */
  readonly siblings = new KeyedMutex();

  /** Records that this process stored `p` (a spec or status write). */
  noteWritten(key: string, p: NVMePartition): void {
    const rv = p.metadata.resourceVersion;
    if (rv) this.written.set(key, rv);
  }

  /** Notes when an unplaced partition was first seen (the start of its placement latency). */
  observe(key: string, p: NVMePartition, nowMs: number): void {
    if (!p.spec.nodeName && !p.metadata.deletionTimestamp && !this.firstSeen.has(key))
      this.firstSeen.set(key, nowMs);
  }
}

export function placementConfig(ctx: ManagerContext): PlacementConfig {
  return {
    stalenessMs: ctx.config.stalenessMs,
    policy: ctx.config.spreadPolicy,
    backoff: ctx.config.placementBackoff,
    thinLvstoreFullPercent: ctx.config.thinLvstoreFullPercent,
  };
}

/**
 * Reconciles one partition key. Idempotent and safe to run in several processes at once: a
 * partition's spec is written only after its ledger entry is stored on the device, and the entry
 * is written only on the device version it was checked against.
 */
/**
 * The drive a partition with spec.contentSource must share with its source: the source
 * partition's (from the inventory) or the snapshot's recorded drive (read from the API server).
 * Undefined for a partition without a content source.
 */
export async function sourcePin(ctx: ManagerContext, p: NVMePartition): Promise<SourcePin | undefined> {
  const cs = p.spec.contentSource;
  if (!cs) return undefined;
  const ns = p.metadata.namespace;
  if (cs.kind === "Partition") {
    const src = ctx.inventory.partition(objectKey({ name: cs.name, namespace: ns }));
    if (!src || src.metadata.uid !== cs.uid)
      return { why: `source partition ${cs.name} (uid ${cs.uid}) not found` };
    if (!src.spec.deviceSerial) return { why: `source partition ${cs.name} is not placed yet` };
    return { serial: src.spec.deviceSerial, why: `clone of partition ${cs.name} must share its drive` };
  }
  const snap = ctx.clients.snapshots ? await ctx.clients.snapshots.get(cs.name, ns) : undefined;
  if (!snap || snap.metadata.uid !== cs.uid)
    return { why: `source snapshot ${cs.name} (uid ${cs.uid}) not found` };
  if (!snap.status?.deviceSerial) return { why: `source snapshot ${cs.name} has not been taken yet` };
  return { serial: snap.status.deviceSerial, why: `restore of snapshot ${cs.name} must share its drive` };
}

/**
 * Where replica `p` must not go: the nodes of its siblings (placed, or holding a ledger entry on
 * a device of that node) and, with the volume's spread key, their nodes' values of that label.
 * Undefined for a partition that is not a replica.
 */
export function replicaSpread(ctx: ManagerContext, p: NVMePartition): ReplicaSpread | undefined {
  const of = p.spec.replicaOf;
  if (!of) return undefined;
  const { inventory } = ctx;
  const volume = inventory.partition(objectKey({ name: of.name, namespace: p.metadata.namespace }));
  const key = volume?.metadata.uid === of.uid ? volume.spec.replicaTopologyKey : undefined;
  const avoidNodes = new Map<string, string>();
  for (const s of inventory.replicasOf(of.uid)) {
    if (s.metadata.uid === p.metadata.uid) continue;
    if (s.spec.nodeName) avoidNodes.set(s.spec.nodeName, s.metadata.name);
    for (const dev of inventory.devicesHolding(s.metadata.uid as string)) {
      const d = inventory.latestDevice(dev);
      if (d) avoidNodes.set(d.spec.nodeName, s.metadata.name);
    }
  }
  const avoidValues = new Map<string, string>();
  if (key) {
    for (const [n, sibling] of avoidNodes) {
      const value = inventory.node(n)?.metadata.labels?.[key];
      if (value !== undefined) avoidValues.set(value, sibling);
    }
  }
  return { avoidNodes, ...(key ? { key } : {}), avoidValues };
}

export function placementReconciler(ctx: ManagerContext, state: PlacementState): Reconcile {
  const place = placeOne(ctx, state);
  return (key, rctx) => {
    const of = ctx.inventory.partition(key)?.spec.replicaOf?.uid;
    return of ? state.siblings.run(of, () => place(key, rctx)) : place(key, rctx);
  };
}

function placeOne(ctx: ManagerContext, state: PlacementState): Reconcile {
  const cfg = placementConfig(ctx);
  const { inventory, metrics } = ctx;
  const digest = new PlacedDigest(ctx.events, ctx.clock, PLACED_DIGEST_MS);
  state.digest = digest;
  return async (key, rctx) => {
    let p = inventory.partition(key);
    if (!p) {
      state.firstSeen.delete(key);
      state.unschedulable.delete(key);
      state.settling.delete(key);
      state.written.delete(key);
      return;
    }
    state.observe(key, p, ctx.clock.now());
    // This process wrote the partition more recently than the cache shows: deciding on the older
    // copy would only repeat (or conflict with) that write. The watch event of the write enqueues
    // the key again, and that reconcile decides on the stored object.
    const wrote = state.written.get(key);
    if (wrote !== undefined) {
      if ((compareResourceVersions(wrote, p.metadata.resourceVersion) ?? 0) > 0) return;
      state.written.delete(key);
    }
    const pin = p.spec.nodeName ? undefined : await sourcePin(ctx, p);
    for (let round = 0; round < ROUNDS; round++) {
      const spread = p.spec.nodeName ? undefined : replicaSpread(ctx, p);
      const out = decidePlacement(p, inventory, ctx.clock.now(), cfg, pin, spread);
      if (out.result !== "placed") return finish(ctx, state, key, p, out);
      const reserve = out.actions[0] as Reserve;
      const use = partitionUse(p) as PartitionUse;
      // A deposed leader stops writing as soon as it knows (safety never depends on it).
      rctx.signal.throwIfAborted();
      const unassume = inventory.assume(reserve.device, { ...use, bytes: reserve.bytes });
      let reserved: boolean;
      try {
        reserved = await ctx.deviceLocks.run(reserve.device, () =>
          reserveOn(ctx, p as NVMePartition, use, reserve, rctx.log),
        );
      } finally {
        unassume();
      }
      if (!reserved) continue; // the inventory now holds what the fresh reads showed: decide again
      rctx.signal.throwIfAborted();
      const placed = await assign(ctx, p, reserve);
      if (placed === undefined) return; // deleted meanwhile: the capacity reconciler drops the entry
      p = placed;
      state.noteWritten(key, p);
      const onOurs = p.spec.nodeName === reserve.nodeName && p.spec.deviceSerial === reserve.serial;
      if (onOurs) {
        // The decision's Placed event goes into the device's digest: one Event per device and
        // window, not one write per placement (the partition's Scheduled condition says it too).
        const dev = inventory.latestDevice(reserve.device);
        if (dev) digest.add(dev, key, reserve.bytes);
        metrics.placements.inc({ result: "placed" });
        const seen = state.firstSeen.get(key);
        if (seen !== undefined) metrics.placementLatency.observe({}, (ctx.clock.now() - seen) / 1000);
        rctx.log.info("partition placed", {
          partition: key,
          device: reserve.device,
          node: reserve.nodeName,
          bytes: reserve.bytes,
        });
      }
      return finish(ctx, state, key, p, decidePlacement(p, inventory, ctx.clock.now(), cfg));
    }
    metrics.placements.inc({ result: "conflict" });
    throw new StorageError(
      "conflict",
      `placement of ${key}: devices kept changing under ${ROUNDS} decisions`,
    );
  };
}

/** Writes the outcome's status and events, and records bookkeeping; returns the requeue. */
async function finish(
  ctx: ManagerContext,
  state: PlacementState,
  key: string,
  p: NVMePartition,
  out: PlacementOutcome,
): Promise<{ requeueAfterMs?: number }> {
  if (out.result === "unschedulable" && out.settling) {
    // Devices claimed by claims this view does not show bound yet: after a leader change the
    // claim cache may lag the device cache, and a bind is two writes. Not a reason to show the
    // user until it persists: retry soon (and at once when a claim or device changes).
    const n = state.settling.get(key) ?? 0;
    if (n < SETTLE_DEFERRALS) {
      state.settling.set(key, n + 1);
      state.unschedulable.add(key);
      ctx.metrics.placements.inc({ result: "deferred" });
      return { requeueAfterMs: Math.min(SETTLE_MAX_MS, SETTLE_FIRST_MS * 2 ** n) };
    }
  }
  state.settling.delete(key);
  if (out.result === "unschedulable") {
    state.unschedulable.add(key);
    ctx.metrics.placements.inc({ result: "unschedulable" });
  } else {
    state.unschedulable.delete(key);
  }
  if (p.spec.nodeName) state.firstSeen.delete(key);
  for (const a of out.actions) {
    if (a.type === "event") ctx.events.emit(p, a.eventType, a.reason, "Place", a.note);
  }
  const patch = out.status;
  if (patch) {
    const uid = p.metadata.uid;
    const now = new Date(ctx.clock.now());
    const stored = await writeStatus<NVMePartitionStatus, NVMePartition>(
      ctx.clients.partitions,
      p,
      (latest) =>
        latest.metadata.uid !== uid
          ? undefined
          : applyStatusPatch(latest.status, INITIAL_PARTITION_STATUS, patch, now),
    );
    if (stored && stored !== p) state.noteWritten(key, stored);
  }
  return out.requeueAfterMs === undefined ? {} : { requeueAfterMs: out.requeueAfterMs };
}

/**
 * Stores `use`'s ledger entry on the device (or finds it there). True once the entry is on the
 * server; false when fresh reads show the device can no longer take the partition (the inventory
 * then knows the fresh device version). Conflicts re-read the device and re-decide on it.
 */
async function reserveOn(
  ctx: ManagerContext,
  p: NVMePartition,
  use: PartitionUse,
  r: Reserve,
  log: Logger,
): Promise<boolean> {
  const { clients, inventory } = ctx;
  // Claim and node come from the watch cache: neither needs to be fresh for safety. Room is
  // arbitrated by the guarded device write below; a claim released meanwhile is a guarded write
  // to the same device (refused while its ledger is not empty, or making this one conflict);
  // node health a moment old is what any decision works with anyway.
  const claim = inventory.claim(`${r.claimRef.namespace}/${r.claimRef.name}`);
  const node = inventory.node(r.nodeName);
  // Start from the newest version this process knows; the guarded write proves it current.
  let device: NVMeDevice | undefined = inventory.latestDevice(r.device);
  let fresh = false;
  for (let i = 0; i < WRITE_ATTEMPTS; i++) {
    if (!device || (i > 0 && !fresh)) {
      device = await clients.devices.get(r.device);
      fresh = true;
      if (!device) return false;
      inventory.noteFreshDevice(device);
    }
    const verdict = reserveVerdict({
      partition: p,
      use,
      reserve: r,
      device,
      claim,
      node,
      assigned: inventory.assigned(device),
      nowMs: ctx.clock.now(),
      stalenessMs: ctx.config.stalenessMs,
      thinLvstoreFullPercent: ctx.config.thinLvstoreFullPercent,
    });
    if (verdict.kind === "held") return true;
    if (verdict.kind === "reject") {
      if (!fresh) {
        device = undefined;
        continue;
      }
      log.info("reservation refused on fresh data", { device: r.device, reason: verdict.message });
      return false;
    }
    try {
      const stored = await clients.devices.replaceStatus({ ...device, status: verdict.status });
      inventory.noteFreshDevice(stored);
      return true;
    } catch (err) {
      if (err instanceof StorageError && err.kind === "conflict") {
        ctx.metrics.reservationConflicts.inc();
        fresh = false;
        device = undefined;
        continue;
      }
      if (err instanceof StorageError && err.kind === "not-found") return false;
      throw err;
    }
  }
  throw new StorageError(
    "conflict",
    `reservation on ${r.device}: ${WRITE_ATTEMPTS} conflicting writes in a row`,
  );
}

/**
 * Writes the placement into the partition's spec. The patch carries the partition's UID, so it
 * cannot land on a same-named replacement (the server refuses a UID change). Returns the stored
 * partition (possibly placed by another manager first: nodeName is immutable once set), or
 * undefined when this incarnation is gone.
 */
async function assign(ctx: ManagerContext, p: NVMePartition, r: Reserve): Promise<NVMePartition | undefined> {
  const { partitions } = ctx.clients;
  const { name, namespace } = p.metadata;
  try {
    return await partitions.mergePatch(name, namespace, {
      metadata: { uid: p.metadata.uid },
      spec: { nodeName: r.nodeName, deviceSerial: r.serial, claimRef: r.claimRef },
    });
  } catch (err) {
    if (!(err instanceof StorageError)) throw err;
    if (err.kind === "not-found") return undefined;
    if (err.kind !== "invalid") throw err;
    const fresh = await partitions.get(name, namespace);
    if (!fresh || fresh.metadata.uid !== p.metadata.uid) return undefined;
    if (fresh.spec.nodeName) return fresh;
    throw err;
  }
}

/** Partition keys to (re)place when objects change. */
export function placementTriggers(ctx: ManagerContext, state: PlacementState): Triggers {
  const retryUnschedulable = () => [...state.unschedulable];
  const ledgerBytes = (d: NVMeDevice) => (d.status?.reservations ?? []).reduce((s, r) => s + r.bytes, 0);
  return {
    // Placed partitions are cheap no-ops once Scheduled=True is current.
    partition: (_old, p) => {
      const key = objectKey(p.metadata);
      state.observe(key, p, ctx.clock.now());
      return [key];
    },
    // Room or eligibility may have appeared: retry partitions that found none.
    device: (old, d) => {
      if (!old || old === d) return retryUnschedulable();
      const more =
        old.status?.phase !== d.status?.phase ||
        old.status?.claimRef?.uid !== d.status?.claimRef?.uid ||
        old.status?.activeBackend !== d.status?.activeBackend ||
        d.spec.allocatableBytes > old.spec.allocatableBytes ||
        ledgerBytes(d) < ledgerBytes(old);
      return more ? retryUnschedulable() : [];
    },
    node: (old, n) => {
      const now = ctx.clock.now();
      const was = old ? nodeHealth(old.spec.nodeName, old, now, ctx.config.stalenessMs).ok : false;
      const is = nodeHealth(n.spec.nodeName, n, now, ctx.config.stalenessMs).ok;
      const relabelled =
        JSON.stringify(old?.metadata.labels ?? {}) !== JSON.stringify(n.metadata.labels ?? {});
      return (is && !was) || relabelled ? retryUnschedulable() : [];
    },
    claim: (old, c) => (old?.status?.phase !== c.status?.phase ? retryUnschedulable() : []),
  };
}
