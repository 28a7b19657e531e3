// Capacity accounting of one device: what is committed on it, from its reservation ledger
// (status.reservations) and from the partitions whose spec points at it. Pure; shared by the
// manager (placement, the capacity reconciler, claim release) and CSI volume expansion.
import type {
  DeviceReservation,
  Leftover,
  NVMeDevice,
  NVMeDeviceClaim,
  NVMeDeviceStatus,
  NVMePartition,
} from "../api/index.ts";
import { roundUpToUnit } from "./units.ts";

/** Status of a device the manager writes first (the agent creates devices without one). */
export const INITIAL_DEVICE_STATUS: NVMeDeviceStatus = {
  phase: "Available",
  reservations: [],
  conditions: [],
};

/** A partition as capacity accounting sees it. */
export interface PartitionUse {
  uid: string;
  namespace: string;
  name: string;
  /** spec.sizeBytes rounded up to the allocation unit. */
  bytes: number;
  /** metadata.deletionTimestamp is set: the agent has not freed it yet, so it still counts. */
  terminating: boolean;
  /** spec.thinProvisioning: reserved against the overcommit budget, not physical capacity. */
  thin?: boolean;
}

/** What holds capacity on a device, keyed by partition UID. */
export interface Holder {
  namespace: string;
  name: string;
  bytes: number;
  /** Has a ledger entry (written before placement). */
  inLedger: boolean;
  /** Its spec names this device (placed). */
  assigned: boolean;
  /** A thin partition (its ledger entry or its spec says so). */
  thin: boolean;
}

export interface DeviceUsage {
  /** Every holder, thin and thick: the provisioned bytes. */
  committedBytes: number;
  /** The thick holders' share of committedBytes: what must fit in physical capacity. */
  thickBytes: number;
  /** The thin holders' share of committedBytes. */
  thinBytes: number;
  /** allocatable - committed; negative when over-committed. */
  freeBytes: number;
  holders: ReadonlyMap<string, Holder>;
}

/** The usage record of a partition; undefined for one without a UID (never seen from the server). */
export function partitionUse(p: NVMePartition): PartitionUse | undefined {
  const uid = p.metadata.uid;
  if (!uid) return undefined;
  return {
    uid,
    namespace: p.metadata.namespace ?? "",
    name: p.metadata.name,
    bytes: roundUpToUnit(p.spec.sizeBytes),
    terminating: p.metadata.deletionTimestamp !== undefined,
    thin: p.spec.thinProvisioning === true,
  };
}

/** A drive's overcommit ratio: its claim's spec.overcommitRatio, 1 (none) when unset or unknown. */
export function overcommitRatioOf(claim: NVMeDeviceClaim | undefined): number {
  return claim?.spec.overcommitRatio ?? 1;
}

/**
 * Room on `device` for one more partition, thin or thick, under overcommit ratio `ratio`: every
 * holder together stays within allocatableBytes x ratio (the budget), and the thick ones alone
 * within allocatableBytes, since a thick lvol takes all its clusters when made. At ratio 1 both
 * kinds get allocatable - committed, exactly the room without overcommit. Negative: none.
 */
export function roomFor(device: NVMeDevice, usage: DeviceUsage, ratio: number, thin: boolean): number {
  const allocatable = device.spec.allocatableBytes;
  const overall = Math.floor(allocatable * ratio) - usage.committedBytes;
  return thin ? overall : Math.min(allocatable - usage.thickBytes, overall);
}

/**
 * Physical fullness of the device's lvstore from the agent's last report (1 - free/total), or
 * undefined before any report. Thin volumes write into this space; thick ones already own theirs.
 */
export function lvstoreFullness(device: NVMeDevice): number | undefined {
  const l = device.status?.lvstore;
  if (!l || l.totalBytes <= 0) return undefined;
  return 1 - l.freeBytes / l.totalBytes;
}

/** The ledger of a device (empty when it has no status yet). */
export function ledgerOf(device: NVMeDevice): readonly DeviceReservation[] {
  return device.status?.reservations ?? [];
}

/** "node\0serial": how a partition's spec names its device. */
export function placementKey(nodeName: string, serial: string): string {
  return `${nodeName}\u0000${serial}`;
}

/** The placement key of a device. */
export function devicePlacementKey(d: NVMeDevice): string {
  return placementKey(d.spec.nodeName, d.spec.serial);
}

/** The placement key a placed partition points at, or undefined while unplaced. */
export function partitionPlacementKey(p: NVMePartition): string | undefined {
  const { nodeName, deviceSerial } = p.spec;
  return nodeName && deviceSerial ? placementKey(nodeName, deviceSerial) : undefined;
}

/**
 * Committed bytes of `device`: every partition counted once (by UID), at the larger of its ledger
 * entry and its current rounded size (a placed volume may have grown). Terminating partitions
 * count: their space is not free until the agent deleted them and the object is gone.
 */
export function deviceUsage(
  device: NVMeDevice,
  assigned: Iterable<PartitionUse>,
  /** Decisions in flight in this process: counted like placed partitions. */
  assumed: Iterable<PartitionUse> = [],
): DeviceUsage {
  const holders = new Map<string, Holder>();
  for (const r of ledgerOf(device)) {
    holders.set(r.uid, {
      namespace: r.namespace,
      name: r.name,
      bytes: r.bytes,
      inLedger: true,
      assigned: false,
      thin: r.thin === true,
    });
  }
  for (const a of assumed) {
    if (!holders.has(a.uid)) {
      holders.set(a.uid, {
        namespace: a.namespace,
        name: a.name,
        bytes: a.bytes,
        inLedger: false,
        assigned: false,
        thin: a.thin === true,
      });
    }
  }
  for (const a of assigned) {
    const h = holders.get(a.uid);
    if (h) {
      h.assigned = true;
      h.bytes = Math.max(h.bytes, a.bytes);
      h.thin ||= a.thin === true;
    } else {
      holders.set(a.uid, {
        namespace: a.namespace,
        name: a.name,
        bytes: a.bytes,
        inLedger: false,
        assigned: true,
        thin: a.thin === true,
      });
    }
  }
  let committed = 0;
  let thin = 0;
  for (const h of holders.values()) {
    committed += h.bytes;
    if (h.thin) thin += h.bytes;
  }
  return {
    committedBytes: committed,
    thickBytes: committed - thin,
    thinBytes: thin,
    freeBytes: device.spec.allocatableBytes - committed,
    holders,
  };
}

/** Up to `max` holders as "ns/name", for conditions and events, plus how many were left out. */
export function describeHolders(holders: ReadonlyMap<string, Holder>, max = 5): string {
  const names = [...holders.values()].map((h) => `${h.namespace}/${h.name}`).sort();
  const shown = names.slice(0, max).join(", ");
  return names.length > max ? `${shown} and ${names.length - max} more` : shown;
}

export type GrowVerdict =
  /** The ledger already holds `use` at its new size or more: nothing to write. */
  | { kind: "held" }
  /** Write this status guarded by the device's resourceVersion, then grow the partition. */
  | { kind: "write"; status: NVMeDeviceStatus }
  /** The device cannot hold the partition at its new size (or has no ledger to write). */
  | { kind: "reject"; message: string };

/**
 * The ledger step of a volume expansion, decided on a device just read from the API server: the
 * entry of `use` (UID, new rounded size) is raised to use.bytes, or added, when every other
 * holder (counted as deviceUsage does) leaves room for it. Written with the device's
 * resourceVersion before the partition's spec grows, so two expansions on one device are
 * arbitrated by the API server exactly as two placements are: the loser re-reads and sees the
 * winner's entry. The capacity reconciler only ever raises entries or drops dead ones.
 */
export function growVerdict(
  device: NVMeDevice,
  assigned: Iterable<PartitionUse>,
  use: PartitionUse,
): GrowVerdict {
  const status = device.status;
  if (!status) return { kind: "reject", message: `device ${device.metadata.name} has no ledger yet` };
  const ledger = ledgerOf(device);
  const entry = ledger.find((r) => r.uid === use.uid);
  if (entry && entry.bytes >= use.bytes) return { kind: "held" };
  const usage = deviceUsage(device, assigned);
  const mine = usage.holders.get(use.uid)?.bytes ?? 0;
  const room = device.spec.allocatableBytes - (usage.committedBytes - mine);
  if (room < use.bytes) {
    return {
      kind: "reject",
      message: `device ${device.metadata.name} has room for ${Math.max(0, room)} bytes for ${use.namespace}/${use.name}, which would need ${use.bytes}`,
    };
  }
  const next = { uid: use.uid, namespace: use.namespace, name: use.name, bytes: use.bytes };
  return {
    kind: "write",
    status: {
      ...status,
      reservations: entry ? ledger.map((r) => (r.uid === use.uid ? next : r)) : [...ledger, next],
      freeBytes: Math.max(0, room - use.bytes),
    },
  };
}

/**
 * The status of `latest` with the ledger entry of partition `uid` marked leftover, or undefined
 * when there is nothing to write: no such entry (nothing holds room for it, so nothing is to be
 * kept) or one already marked (its first `since` stands). Pure.
 */
export function markLeftover(
  latest: NVMeDevice,
  uid: string,
  leftover: Leftover,
): NVMeDeviceStatus | undefined {
  const s = latest.status;
  const entry = s?.reservations?.find((r) => r.uid === uid);
  if (!s || !entry || entry.leftover) return undefined;
  return {
    ...s,
    reservations: (s.reservations ?? []).map((r) => (r.uid === uid ? { ...r, leftover } : r)),
  };
}

/**
 * The status of `latest` without partition `uid`'s leftover entry, or undefined when it holds no
 * leftover entry of that UID (an entry that is not a leftover belongs to a live partition and is
 * never touched here). The manager's capacity reconciler recomputes freeBytes from what remains.
 */
export function dropLeftover(latest: NVMeDevice, uid: string): NVMeDeviceStatus | undefined {
  const s = latest.status;
  if (!s?.reservations?.some((r) => r.uid === uid && r.leftover)) return undefined;
  return { ...s, reservations: s.reservations.filter((r) => !(r.uid === uid && r.leftover)) };
}
