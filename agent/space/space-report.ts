// Thin-provisioning space on this node, from each SPDK statistics round: every drive's lvstore
// fullness goes into its NVMeDevice status (placement refuses thin volumes on a full one), and a
// thin partition whose lvstore has no free cluster left gets SpaceExhausted=True and an Event.
import type { NVMeDevice, NVMePartition } from "../../api/index.ts";
import { errorMessage } from "../../lib/errors.ts";
import { findCondition, formatConditionTime, setCondition } from "../../lib/kube/conditions.ts";
import type { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import type * as S from "../../lib/spdk/schemas.ts";
import { formatBytes } from "../../lib/units.ts";
import { lvstoreNameFor } from "../partitions/identity.ts";
import type { EventSink } from "../reporter/reporter.ts";

/** Condition type on NVMePartition: writes to unallocated blocks of a thin volume fail. */
export const SPACE_EXHAUSTED = "SpaceExhausted";

/** One lvstore's space as the round read it. */
export interface LvstoreSpace {
  totalBytes: number;
  freeBytes: number;
  freeClusters: number;
  totalClusters: number;
}

/** The lvstores of one round by name (lvs_<serial>), and the lvol bdevs by name and alias. */
export interface RoundSpace {
  lvstores: ReadonlyMap<string, LvstoreSpace & { uuid: string }>;
  lvols: ReadonlyMap<string, { lvstoreUuid: string; thin: boolean; allocated: number; clusters: number }>;
}

/** Pure: what one round says about space. */
export function roundSpace(lvstores: readonly S.Lvstore[], bdevs: readonly S.Bdev[]): RoundSpace {
  const stores = new Map<string, LvstoreSpace & { uuid: string }>();
  const size = new Map<string, number>();
  for (const s of lvstores) {
    stores.set(s.name, {
      uuid: s.uuid,
      totalBytes: s.total_data_clusters * s.cluster_size,
      freeBytes: s.free_clusters * s.cluster_size,
      freeClusters: s.free_clusters,
      totalClusters: s.total_data_clusters,
    });
    size.set(s.uuid, s.cluster_size);
  }
  const lvols = new Map<
    string,
    { lvstoreUuid: string; thin: boolean; allocated: number; clusters: number }
  >();
  for (const b of bdevs) {
    const lv = b.driver_specific?.lvol;
    const cs = lv ? size.get(lv.lvol_store_uuid) : undefined;
    if (!lv || !cs) continue;
    const entry = {
      lvstoreUuid: lv.lvol_store_uuid,
      thin: lv.thin_provision === true,
      allocated: lv.num_allocated_clusters ?? 0,
      clusters: Math.ceil((b.num_blocks * b.block_size) / cs),
    };
    lvols.set(b.name, entry);
    for (const a of b.aliases) lvols.set(a, entry);
  }
  return { lvstores: stores, lvols };
}

/**
 * Pure: is `p` (a thin partition with an lvol) out of space? True when its lvstore has no free
 * cluster and the lvol has clusters still unallocated (a write there needs a new one); undefined
 * when the round does not show its lvol.
 */
export function spaceExhausted(
  p: NVMePartition,
  space: RoundSpace,
): { exhausted: boolean; store: LvstoreSpace; unallocated: number } | undefined {
  const bdev = p.status?.backendPath;
  const lv = bdev ? space.lvols.get(bdev) : undefined;
  if (!lv) return undefined;
  const store = [...space.lvstores.values()].find((s) => s.uuid === lv.lvstoreUuid);
  if (!store) return undefined;
  const unallocated = Math.max(0, lv.clusters - lv.allocated);
  return { exhausted: store.freeClusters === 0 && unallocated > 0, store, unallocated };
}

export interface SpaceReportDeps {
  nodeName: string;
  devices: ResourceClient<NVMeDevice>;
  partitions: ResourceClient<NVMePartition>;
  /** This node's devices and partitions from the agent's caches (writes re-read the object). */
  listDevices: () => readonly NVMeDevice[];
  listPartitions: () => readonly NVMePartition[];
  events: EventSink;
  now: () => number;
  logger: Logger;
}

/**
 * SpaceExhausted as last written or read back, by partition UID. The agent's cache keeps no
 * partition condition but Ready, so the state is remembered here; an unknown one is decided on the object
 * read afresh (no write and no Event when it already says so, as after an agent restart).
 */
export type SpaceMemory = Map<string, boolean>;

/**
 * Applies one round. Idempotent: the device's status.lvstore is written only when the round's
 * numbers differ from the cached ones, SpaceExhausted only when it changes on the stored object
 * (with one Event per change: SpaceExhausted Warning, SpaceRecovered Normal). Never throws; a failed write is logged
 * and retried by the next round.
 */
export async function applySpaceReport(
  deps: SpaceReportDeps,
  known: SpaceMemory,
  lvstores: readonly S.Lvstore[],
  bdevs: readonly S.Bdev[],
): Promise<void> {
  const seen = new Set<string>();
  const space = roundSpace(lvstores, bdevs);
  const now = new Date(deps.now());
  const observedTime = formatConditionTime(now);
  const writes: Promise<unknown>[] = [];
  for (const d of deps.listDevices()) {
    if (d.spec.nodeName !== deps.nodeName) continue;
    const s = space.lvstores.get(lvstoreNameFor(d.spec.serial));
    if (!s) continue;
    const have = d.status?.lvstore;
    if (have && have.totalBytes === s.totalBytes && have.freeBytes === s.freeBytes) continue;
    const lvstore = { totalBytes: s.totalBytes, freeBytes: s.freeBytes, observedTime };
    writes.push(
      updateStatus(deps.devices, d.metadata.name, undefined, (latest) =>
        latest.status && latest.spec.serial === d.spec.serial ? { ...latest.status, lvstore } : undefined,
      ).catch((err: unknown) =>
        deps.logger.warn("cannot record lvstore space", { device: d.metadata.name, err: errorMessage(err) }),
      ),
    );
  }
  for (const p of deps.listPartitions()) {
    if (p.spec.nodeName !== deps.nodeName || !p.spec.thinProvisioning || p.metadata.deletionTimestamp)
      continue;
    const found = spaceExhausted(p, space);
    const uid = p.metadata.uid;
    if (!found || !uid) continue;
    seen.add(uid);
    if (known.get(uid) === found.exhausted) continue;
    writes.push(
      markSpace(deps, p, found, now).then((ok) => {
        if (ok) known.set(uid, found.exhausted);
      }),
    );
  }
  for (const uid of known.keys()) if (!seen.has(uid)) known.delete(uid);
  await Promise.all(writes);
}

async function markSpace(
  deps: SpaceReportDeps,
  p: NVMePartition,
  found: NonNullable<ReturnType<typeof spaceExhausted>>,
  now: Date,
): Promise<boolean> {
  const { store, exhausted } = found;
  const lvs = lvstoreNameFor(p.spec.deviceSerial ?? "");
  const message = exhausted
    ? `lvstore ${lvs} has no free cluster (all ${store.totalClusters} in use by volumes sharing the drive): writes to the ${found.unallocated} unallocated clusters of this thin volume fail with I/O errors until space is freed (delete volumes or data on the drive)`
    : `lvstore ${lvs} has ${formatBytes(store.freeBytes)} free again`;
  let changed = false;
  try {
    const stored = await updateStatus(deps.partitions, p.metadata.name, p.metadata.namespace, (latest) => {
      if (latest.metadata.uid !== p.metadata.uid || !latest.status) return undefined;
      const was = findCondition(latest.status.conditions ?? [], SPACE_EXHAUSTED)?.status;
      // Never False on a volume that was never out of space: the condition appears when it matters.
      changed = exhausted ? was !== "True" : was === "True";
      if (!changed) return undefined;
      return {
        ...latest.status,
        conditions: setCondition(
          latest.status.conditions ?? [],
          {
            type: SPACE_EXHAUSTED,
            status: exhausted ? "True" : "False",
            reason: exhausted ? "LvstoreFull" : "SpaceAvailable",
            message,
            observedGeneration: latest.metadata.generation,
          },
          now,
        ),
      };
    });
    if (!stored) return false;
    if (!changed) return true;
    await deps.events.record(
      stored,
      exhausted ? "Warning" : "Normal",
      exhausted ? "SpaceExhausted" : "SpaceRecovered",
      "Write",
      message,
    );
    deps.logger[exhausted ? "warn" : "info"](
      exhausted ? "thin volume out of space" : "thin volume has space",
      {
        partition: `${p.metadata.namespace}/${p.metadata.name}`,
        lvstore: lvs,
      },
    );
    return true;
  } catch (err) {
    deps.logger.warn("cannot record SpaceExhausted", {
      partition: `${p.metadata.namespace}/${p.metadata.name}`,
      err: errorMessage(err),
    });
    return false;
  }
}
