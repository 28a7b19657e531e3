// Device capacity accounting as pure functions: which ledger entries might be dead (their partition
// gone or placed on another device), and the device status with dead entries dropped, entries
// grown to their placed partition's size, and free = allocatable - committed.
import type { DeviceReservation, NVMeDevice, NVMeDeviceStatus, NVMePartition } from "../../api/index.ts";
import {
  devicePlacementKey,
  deviceUsage,
  INITIAL_DEVICE_STATUS,
  ledgerOf,
  type PartitionUse,
  partitionPlacementKey,
} from "../../lib/device-ledger.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { formatBytes, formatQuantity } from "../../lib/units.ts";
import { applyStatusPatch, type ConditionInput } from "../status-patch.ts";
import { ConditionTypes } from "../vocabulary.ts";

/** What capacity accounting reads. */
export interface CapacityView {
  /** Placed partitions pointing at the device. */
  assigned(device: NVMeDevice): PartitionUse[];
  /** A partition by "namespace/name". */
  partition(key: string): NVMePartition | undefined;
}

export interface LedgerAudit {
  /** Entries the cache proves dead: the same partition (UID) is placed on another device. */
  dead: DeviceReservation[];
  /** Entries whose partition the cache does not show: ask the API server before dropping. */
  verify: DeviceReservation[];
}

/**
 * Sorts the ledger of `device` into entries known dead and entries to verify; every other entry
 * belongs to a partition the cache shows alive and unplaced or placed here, and stays.
 */
export function auditLedger(device: NVMeDevice, view: CapacityView): LedgerAudit {
  const here = devicePlacementKey(device);
  const dead: DeviceReservation[] = [];
  const verify: DeviceReservation[] = [];
  for (const r of ledgerOf(device)) {
    // Its partition is gone, but the drive may come back holding its volume: held until the
    // agent deleted that volume from it (or the device is deleted).
    if (r.leftover) continue;
    const p = view.partition(`${r.namespace}/${r.name}`);
    if (!p || p.metadata.uid !== r.uid) {
      verify.push(r);
      continue;
    }
    const pk = partitionPlacementKey(p);
    if (pk !== undefined && pk !== here) dead.push(r);
  }
  return { dead, verify };
}

/**
 * Whether a ledger entry's partition, as just read from the API server (undefined: not found), is
 * gone for good: absent, a different object of the same name, or placed on another device. All
 * three are permanent (UIDs are never reused, placement is immutable once set). A leftover entry
 * is never dead here: its partition is gone on purpose, and only the agent that deleted its
 * volume from the returned drive drops it.
 */
export function entryIsDead(
  entry: DeviceReservation,
  fresh: NVMePartition | undefined,
  device: NVMeDevice,
): boolean {
  if (entry.leftover) return false;
  if (!fresh || fresh.metadata.uid !== entry.uid) return true;
  const pk = partitionPlacementKey(fresh);
  return pk !== undefined && pk !== devicePlacementKey(device);
}

/**
 * The status of `device` (as read at write time) with entries in `dead` removed, the entries of
 * partitions in `assigned` grown to their current rounded size (a placed partition without an
 * entry counts, but gets none: see below), freeBytes recomputed (never below 0) and Overcommitted set when placed
 * partitions exceed what the device may hold: thick ones beyond allocatable, or all of them beyond
 * allocatable x `ratio` (the claim's overcommit ratio; thin partitions may use it). Entries not in
 * `dead` are always kept, including ones written after the audit: only verified-dead UIDs are
 * ever dropped. provisionedBytes and thinBytes record what the ledger promises, thin and thick.
 */
export function capacityStatus(
  device: NVMeDevice,
  assigned: readonly PartitionUse[],
  dead: ReadonlySet<string>,
  now: Date,
  ratio = 1,
): NVMeDeviceStatus {
  const ledger = ledgerOf(device)
    .filter((r) => !dead.has(r.uid))
    .map((r) => ({ ...r }));
  const byUid = new Map(ledger.map((r) => [r.uid, r]));
  const live = assigned.filter((a) => !dead.has(a.uid));
  // Placed partitions without an entry count against the device (deviceUsage below) but are
  // never written into the ledger: placement stores the entry before the spec, so one without
  // was placed by someone else, and the agent refuses to provision a placement its drive's ledger
  // does not hold. Adopting it would hand it the authorization it never had.
  for (const a of live) {
    const r = byUid.get(a.uid);
    if (r) r.bytes = Math.max(r.bytes, a.bytes);
  }
  const base = device.status ?? INITIAL_DEVICE_STATUS;
  const usage = deviceUsage({ ...device, status: { ...base, reservations: ledger } }, live);
  const conditions: ConditionInput[] = [];
  const alloc = device.spec.allocatableBytes;
  const budget = Math.floor(alloc * ratio);
  const thickOver = usage.thickBytes > alloc;
  const over = thickOver || usage.committedBytes > budget;
  if (over || findCondition(base.conditions ?? [], ConditionTypes.Overcommitted)) {
    conditions.push({
      type: ConditionTypes.Overcommitted,
      status: over ? "True" : "False",
      reason: over ? "PlacedExceedsAllocatable" : "WithinAllocatable",
      message: !over
        ? ""
        : thickOver && usage.thinBytes > 0
          ? `thick partitions on this device add up to ${formatBytes(usage.thickBytes)}, ${formatBytes(usage.thickBytes - alloc)} more than its ${formatBytes(alloc)}`
          : `partitions on this device add up to ${formatBytes(usage.committedBytes)}, ${formatBytes(thickOver ? usage.thickBytes - alloc : usage.committedBytes - budget)} more than its ${formatBytes(alloc)}${ratio === 1 || thickOver ? "" : ` x overcommit ratio ${ratio}`}`,
    });
  }
  return applyStatusPatch(
    base,
    INITIAL_DEVICE_STATUS,
    {
      set: {
        reservations: ledger,
        freeBytes: Math.max(0, usage.freeBytes),
        allocatable: formatQuantity(device.spec.allocatableBytes),
        free: formatQuantity(Math.max(0, usage.freeBytes)),
        provisionedBytes: usage.committedBytes,
        thinBytes: usage.thinBytes,
        overcommitRatio: ratio,
      },
      conditions,
    },
    now,
  );
}
