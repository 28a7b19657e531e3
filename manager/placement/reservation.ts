// The reservation step of placement, decided on objects just read from the API server: re-checks
// ownership, node health, backend lock, topology and room, and yields the device status with the
// new ledger entry, which the controller writes guarded by the device's resourceVersion.
import type {
  NVMeDevice,
  NVMeDeviceClaim,
  NVMeDeviceStatus,
  NVMePartition,
  RDMAStorageNode,
} from "../../api/index.ts";
import {
  deviceUsage,
  ledgerOf,
  lvstoreFullness,
  overcommitRatioOf,
  type PartitionUse,
  roomFor,
} from "../../lib/device-ledger.ts";
import { formatBytes, formatQuantity } from "../../lib/units.ts";
import { nodeHealth } from "../node-health.ts";
import { verifyOwner } from "../ownership.ts";
import { DEFAULT_THIN_LVSTORE_FULL_PERCENT, type Reserve } from "./placement-core.ts";
import { topologyRank } from "./topology.ts";

/** Ledger entries a device can hold (api/nvme-device.ts caps status.reservations at this). */
export const MAX_LEDGER_ENTRIES = 4096;

export interface ReserveInput {
  partition: NVMePartition;
  /** The partition's usage record (UID, rounded size). */
  use: PartitionUse;
  reserve: Reserve;
  /** Fresh from the API server. */
  device: NVMeDevice;
  claim: NVMeDeviceClaim | undefined;
  node: RDMAStorageNode | undefined;
  /** Partitions placed on the device according to the cache (counted with the ledger). */
  assigned: Iterable<PartitionUse>;
  nowMs: number;
  stalenessMs: number;
  /** PlacementConfig.thinLvstoreFullPercent; absent: 85. */
  thinLvstoreFullPercent?: number;
}

export type ReserveVerdict =
  /** Write this status (with the new entry) guarded by device.metadata.resourceVersion. */
  | { kind: "write"; status: NVMeDeviceStatus }
  /** The ledger already holds this partition's entry: nothing to write. */
  | { kind: "held" }
  /** The device can no longer take the partition; decide again. */
  | { kind: "reject"; message: string };

/** Decides the reservation of `input.use` on `input.device`. */
export function reserveVerdict(input: ReserveInput): ReserveVerdict {
  const { device: d, reserve: r, partition: p, use } = input;
  if (d.spec.nodeName !== r.nodeName || d.spec.serial !== r.serial) {
    return {
      kind: "reject",
      message: `device ${d.metadata.name} no longer matches node ${r.nodeName} serial ${r.serial}`,
    };
  }
  const own = verifyOwner(d, input.claim);
  if (!own.ok) return { kind: "reject", message: own.message };
  if (own.claimRef.uid !== r.claimRef.uid) {
    return { kind: "reject", message: `device ${d.metadata.name} changed owner` };
  }
  const health = nodeHealth(r.nodeName, input.node, input.nowMs, input.stalenessMs);
  if (!health.ok) return { kind: "reject", message: health.message };
  const locked = d.status?.activeBackend;
  if (locked && locked !== p.spec.backend) {
    return { kind: "reject", message: `device ${d.metadata.name} is locked to backend ${locked}` };
  }
  if (topologyRank(p.spec.topology, input.node?.metadata.labels ?? {}) === undefined) {
    return { kind: "reject", message: `node ${r.nodeName} is outside the requested topology` };
  }
  const usage = deviceUsage(d, input.assigned);
  if (usage.holders.get(use.uid)?.inLedger) return { kind: "held" };
  const thin = p.spec.thinProvisioning === true;
  const ratio = overcommitRatioOf(input.claim);
  const room = roomFor(d, usage, ratio, thin);
  if (room < r.bytes) {
    return {
      kind: "reject",
      message: `device ${d.metadata.name} has ${formatBytes(Math.max(0, room))} free${thin ? ` within overcommit ratio ${ratio}` : ""}, needs ${formatBytes(r.bytes)}`,
    };
  }
  const full = thin ? lvstoreFullness(d) : undefined;
  const limit = input.thinLvstoreFullPercent ?? DEFAULT_THIN_LVSTORE_FULL_PERCENT;
  if (full !== undefined && full * 100 > limit) {
    return {
      kind: "reject",
      message: `device ${d.metadata.name}'s lvstore is ${Math.round(full * 100)}% full, above the ${limit}% limit for new thin volumes`,
    };
  }
  const ledger = ledgerOf(d);
  if (ledger.length >= MAX_LEDGER_ENTRIES) {
    return {
      kind: "reject",
      message: `device ${d.metadata.name} holds the maximum of ${MAX_LEDGER_ENTRIES} partitions`,
    };
  }
  const status = d.status as NVMeDeviceStatus; // verifyOwner proved it exists (phase Claimed)
  return {
    kind: "write",
    status: {
      ...status,
      reservations: [
        ...ledger,
        {
          uid: use.uid,
          namespace: use.namespace,
          name: use.name,
          bytes: r.bytes,
          ...(thin ? { thin: true } : {}),
        },
      ],
      // What the capacity reconciler would compute next, so it need not write the device again.
      freeBytes: Math.max(0, usage.freeBytes - r.bytes),
      allocatable: formatQuantity(d.spec.allocatableBytes),
      free: formatQuantity(Math.max(0, usage.freeBytes - r.bytes)),
      provisionedBytes: usage.committedBytes + r.bytes,
      thinBytes: usage.thinBytes + (thin ? r.bytes : 0),
      overcommitRatio: ratio,
    },
  };
}
