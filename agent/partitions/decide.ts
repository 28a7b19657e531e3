// The partition reconciler's pure core: from one NVMePartition and what the agent observed about
// it (its drive, attachments still referencing it), decide what to do next. No I/O here; the
// controller runs the decision through the backend and volume-manager ports.
import type { NVMeDevice, NVMePartition } from "../../api/index.ts";
import { roundUpToUnit as roundUp } from "../../lib/units.ts";
import {
  type BackendName,
  type QosLimits,
  UNLIMITED,
  type VolumeManagerName,
  type VolumeSpec,
} from "../backends/types.ts";
import { replicaNamespaceUuidFor } from "../nexus/identity.ts";
import { externalIdFor, nqnFor, snapshotExternalIdFor } from "./identity.ts";

export const PARTITION_FINALIZER = "storage.distort.io/partition-cleanup";

/** Whether `p` carries the cleanup finalizer (PARTITION_FINALIZER). */
export function hasCleanupFinalizer(p: NVMePartition): boolean {
  return (p.metadata.finalizers ?? []).includes(PARTITION_FINALIZER);
}

/**
 * The decision for a partition being deleted while attachment records still reference it (by
 * name; the first five are named), or undefined when none do. Shared by plain partitions and
 * replicated volumes, whose deletion waits alike.
 */
export function blockedByAttachments(
  attachments: readonly string[],
): { action: "block-deletion"; why: Why } | undefined {
  if (attachments.length === 0) return undefined;
  return {
    action: "block-deletion",
    why: {
      reason: "AttachmentsExist",
      message: `deletion waits for ${attachments.length} attachment(s) to be released: ${attachments.slice(0, 5).join(", ")}`,
    },
  };
}

export interface Observed {
  partition: NVMePartition;
  /** The node this agent serves. */
  nodeName: string;
  /** The NVMeDevice on this node whose serial is spec.deviceSerial, if reported. */
  device?: NVMeDevice;
  /** The partition's attachment record (isPartitionRecord), if any: its name. */
  attachments: readonly string[];
  /**
   * For a partition with spec.contentSource: the object of that kind and name in the
   * partition's own namespace, as read from the API server (null: there is none). Only needed
   * until the partition is first Exported; without it such a partition is refused.
   */
  contentSource?: ResolvedSource | null;
  /** The clock, for how long a drive has been lost (deletion only). */
  nowMs?: number;
  /**
   * How long a deleted partition's drive must have been lost (Unavailable, or its NVMeDevice
   * removed) before the partition is released without its volume (DEFAULT_LOST_DRIVE_RELEASE_AFTER_MS).
   */
  lostDriveReleaseAfterMs?: number;
}

/** Default of Observed.lostDriveReleaseAfterMs (the agent's DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS). */
export const DEFAULT_LOST_DRIVE_RELEASE_AFTER_MS = 600_000;

/** Reason of the Event (and the leftover) when a partition is released from a lost drive. */
export const DATA_ON_LOST_DEVICE = "DataOnLostDevice";

/** What the agent found under a content source's kind and name, in the partition's namespace. */
export interface ResolvedSource {
  uid: string;
  /** The drive holding it: the source partition's spec, the snapshot's status. */
  deviceSerial?: string;
}

/** Where a refusal or a wait is reported: a condition reason plus a message for operators. */
export interface Why {
  reason: string;
  message: string;
}

export interface Target {
  backend: BackendName;
  volumeManager: VolumeManagerName;
  volume: VolumeSpec;
  nqn: string;
  /** The rate limits the volume must have: spec.qos with every absent limit 0 (unlimited). */
  qos: QosLimits;
  /** Namespace 1's UUID when it is not the volume's own: a copy of a replicated volume. */
  namespaceUuid?: string;
}

/** spec.qos as the complete desired state: an absent limit (or an absent spec.qos) is unlimited. */
export function qosLimitsOf(p: NVMePartition): QosLimits {
  const q = p.spec.qos;
  if (!q) return { ...UNLIMITED };
  return {
    rwIosPerSec: q.rwIosPerSec ?? 0,
    rwMBytesPerSec: q.rwMBytesPerSec ?? 0,
    rMBytesPerSec: q.rMBytesPerSec ?? 0,
    wMBytesPerSec: q.wMBytesPerSec ?? 0,
  };
}

/** Whether `q` limits nothing. */
export function isUnlimited(q: QosLimits): boolean {
  return q.rwIosPerSec === 0 && q.rwMBytesPerSec === 0 && q.rMBytesPerSec === 0 && q.wMBytesPerSec === 0;
}

export type Decision =
  /** Not this agent's partition (another node, or not placed yet). */
  | { action: "ignore"; why: string }
  /** Install the cleanup finalizer before creating anything external. */
  | { action: "add-finalizer" }
  /** Cannot proceed until something else changes; retry with backoff. */
  | { action: "wait"; why: Why }
  /** The request can never succeed as it is: report, do not retry until the object changes. */
  | { action: "refuse"; why: Why }
  /** Create or repair everything; `lockDevice` when the drive has no active backend yet. */
  | { action: "provision"; target: Target; lockDevice: boolean }
  /** Deletion requested but attachments still reference the partition. */
  | { action: "block-deletion"; why: Why }
  /** Remove the export, delete the volume, then drop the finalizer. */
  | { action: "deprovision"; target: Target }
  /** Deleting, and the drive holding the volume is lost but not for long enough: look again. */
  | { action: "wait-lost-drive"; why: Why; retryAfterMs: number }
  /**
   * Deleting, and the drive holding the volume has been lost past the bound: record the volume
   * as a leftover on the drive's ledger entry (when the NVMeDevice still exists, so its room
   * stays held until the volume is deleted from the returned drive), record why, and drop the
   * finalizer without touching the target.
   */
  | {
      action: "abandon";
      why: Why;
      leftover: { since: string; reason: "DeviceUnavailable" | "DeviceRemoved" };
    }
  /**
   * Deleting a partition the manager never placed on this drive: nothing of it can be on the
   * target, so drop the finalizer without touching the target (its identity is not to be trusted).
   */
  | { action: "release"; why: Why }
  /** Deleting, and nothing of ours is left to clean (no finalizer). */
  | { action: "done" };

/** Maps the CRD-facing volume manager name to the registered implementation. */
export function resolveVolumeManager(
  backend: BackendName,
  vm: NVMePartition["spec"]["volumeManager"],
): VolumeManagerName {
  if (vm === "partition" || vm === undefined) return backend === "spdk" ? "spdk-lvol" : "parted";
  return vm;
}

/** The backend a partition is served by (SPDK unless it asks for another). */
export function backendOf(p: NVMePartition): BackendName {
  return p.spec.backend ?? "spdk";
}

function target(p: NVMePartition, device: NVMeDevice | undefined): Target {
  const backend = backendOf(p);
  const uid = p.metadata.uid as string;
  // Always from the UID: status is writable by more than the agent, and an externalId taken
  // from it could point this export (and its deletion) at another volume's lvol or partition.
  const externalId = externalIdFor(uid);
  const cs = p.spec.contentSource;
  return {
    backend,
    volumeManager: resolveVolumeManager(backend, p.spec.volumeManager),
    nqn: nqnFor(externalId),
    qos: qosLimitsOf(p),
    ...(p.spec.replicaOf ? { namespaceUuid: replicaNamespaceUuidFor(uid) } : {}),
    volume: {
      externalId,
      sizeBytes: roundUp(p.spec.sizeBytes),
      device: {
        name: device?.metadata.name ?? "",
        serial: p.spec.deviceSerial ?? "",
        pciAddress: device?.spec.pciAddress ?? "",
      },
      ...(p.spec.thinProvisioning ? { thin: true } : {}),
      ...(cs
        ? {
            contentSource:
              cs.kind === "Snapshot"
                ? { kind: "snapshot" as const, lvolName: snapshotExternalIdFor(cs.uid) }
                : { kind: "partition" as const, lvolName: externalIdFor(cs.uid) },
          }
        : {}),
    },
  };
}

/**
 * Refusal reasons that rest on the drive's status as the cache holds it (its owning claim, its
 * ledger). The manager stores a ledger entry before it writes the placement, so a reconcile that
 * sees the placement but a cache without the entry must read the drive afresh before refusing.
 */
export const DEVICE_STATUS_REASONS: ReadonlySet<string> = new Set(["ClaimMismatch", "NotReserved"]);

/**
 * Why `p`'s placement on `d` is not one the manager made, or undefined when it is: placement
 * writes spec.claimRef together with nodeName and deviceSerial, naming the claim that owns the
 * drive, and only after the drive's ledger (status.reservations) holds an entry for the partition's
 * UID. A partition placed by anyone else (the admission policy off, or bypassed) lacks one of them,
 * and is never provisioned: that would skip claim, capacity and content-source checks.
 */
export function placementRefusal(p: NVMePartition, d: NVMeDevice): Why | undefined {
  const claim = p.spec.claimRef;
  if (!claim) {
    return {
      reason: "NotPlacedByManager",
      message: `spec.nodeName and spec.deviceSerial are set without spec.claimRef: the manager did not place this partition, so nothing is provisioned for it`,
    };
  }
  const owner = d.status?.claimRef;
  if (!owner || owner.uid !== claim.uid) {
    return {
      reason: "ClaimMismatch",
      message: `device ${d.metadata.name} is not owned by claim ${claim.namespace}/${claim.name} (uid ${claim.uid})`,
    };
  }
  const uid = p.metadata.uid;
  if (!(d.status?.reservations ?? []).some((r) => r.uid === uid)) {
    return {
      reason: "NotReserved",
      message: `device ${d.metadata.name} holds no reservation for this partition (uid ${uid}): the manager did not place it there, so nothing is provisioned for it`,
    };
  }
  return undefined;
}

/**
 * Decides the next action. Pure and total: every input yields a decision. Deletion wins over
 * everything else; a partition is provisioned only once its finalizer is in place, its drive is
 * reported on this node, owned by the same claim, holds its ledger entry (placementRefusal), and is
 * not locked to the other backend.
 */
export function decide(o: Observed): Decision {
  const p = o.partition;
  if (!p.spec.nodeName) return { action: "ignore", why: "not placed yet" };
  if (p.spec.nodeName !== o.nodeName) return { action: "ignore", why: `assigned to node ${p.spec.nodeName}` };
  if (!p.metadata.uid) return { action: "ignore", why: "no UID yet" };
  const hasFinalizer = hasCleanupFinalizer(p);

  if (p.metadata.deletionTimestamp) {
    if (!hasFinalizer) return { action: "done" };
    const blocked = blockedByAttachments(o.attachments);
    if (blocked) return blocked;
    // A partition the manager never placed here has nothing on the target; its status (the
    // identity deprovision would act on) is anyone's to write.
    const foreign = o.device ? placementRefusal(p, o.device) : undefined;
    if (foreign) return { action: "release", why: foreign };
    const lost = lostDrive(o);
    if (lost) return lost;
    return { action: "deprovision", target: target(p, o.device) };
  }

  const d = o.device;
  // Refused before the finalizer: a placement the manager did not make gets nothing from us.
  const refusal = d ? placementRefusal(p, d) : undefined;
  if (refusal) return { action: "refuse", why: refusal };
  if (!hasFinalizer) return { action: "add-finalizer" };
  if (!d) {
    return {
      action: "wait",
      why: {
        reason: "DeviceNotFound",
        message: `no NVMeDevice with serial ${p.spec.deviceSerial} is reported on ${o.nodeName}`,
      },
    };
  }
  if (d.spec.serial !== p.spec.deviceSerial || d.spec.nodeName !== o.nodeName) {
    return {
      action: "refuse",
      why: {
        reason: "DeviceMismatch",
        message: `device ${d.metadata.name} is not serial ${p.spec.deviceSerial} on ${o.nodeName}`,
      },
    };
  }
  if (d.status?.phase === "Unavailable") {
    return {
      action: "wait",
      why: { reason: "DeviceUnavailable", message: `device ${d.metadata.name} is not present on the node` },
    };
  }
  const t = target(p, d);
  if (t.volume.contentSource && t.volumeManager !== "spdk-lvol") {
    return {
      action: "refuse",
      why: {
        reason: "ContentSourceUnsupported",
        message: `spec.contentSource needs the spdk-lvol volume manager; ${t.volumeManager} volumes cannot be cloned or restored from snapshots`,
      },
    };
  }
  const sourceWhy = contentSourceProblem(p, o.contentSource);
  if (sourceWhy) return { action: "refuse", why: sourceWhy };
  if (t.backend === "kernel" && !isUnlimited(t.qos)) {
    return {
      action: "refuse",
      why: {
        reason: "QosUnsupported",
        message:
          "spec.qos sets rate limits, which the kernel backend cannot enforce: nvmet has no per-namespace QoS",
      },
    };
  }
  const active = d.status?.activeBackend;
  if (active && active !== t.backend) {
    return {
      action: "refuse",
      why: {
        reason: "BackendConflict",
        message: `device ${d.metadata.name} already serves the ${active} backend; a ${t.backend} partition on it would mix kernel and SPDK allocations`,
      },
    };
  }
  return { action: "provision", target: t, lockDevice: !active };
}

/**
 * For a partition being deleted: undefined when its drive is here (deprovision as usual), else
 * whether to wait for the drive or give up on it. A drive is lost when its NVMeDevice says
 * Unavailable (since its Present condition turned False; a complete scan found it missing) or
 * when the NVMeDevice is gone (an operator deleted it; timed from the deletion request, the
 * earliest moment this agent can know). Before the bound nothing changes: a drive merely slow
 * to come back after a reset or a reseat keeps its volume, which is deleted as usual.
 */
function lostDrive(o: Observed): Decision | undefined {
  const p = o.partition;
  const d = o.device;
  if (d && d.status?.phase !== "Unavailable") return undefined;
  const serial = p.spec.deviceSerial ?? "";
  const absent = d?.status?.conditions?.find((c) => c.type === "Present" && c.status === "False");
  const sinceIso = absent?.lastTransitionTime ?? (p.metadata.deletionTimestamp as string);
  // API times are whole seconds: the loss happened up to a second after what is stored, and the
  // bound is never cut short by that rounding.
  const sinceMs = Date.parse(sinceIso) + (sinceIso.includes(".") ? 0 : 999);
  const bound = o.lostDriveReleaseAfterMs ?? DEFAULT_LOST_DRIVE_RELEASE_AFTER_MS;
  const now = o.nowMs ?? Date.now();
  const what = d
    ? `drive ${serial} (NVMeDevice ${d.metadata.name}) on ${o.nodeName} is Unavailable since ${sinceIso}`
    : `drive ${serial} on ${o.nodeName} has no NVMeDevice any more (removed; deletion requested ${sinceIso})`;
  const at = Number.isNaN(sinceMs) ? now : sinceMs + bound;
  if (now < at) {
    return {
      action: "wait-lost-drive",
      why: {
        reason: "DeviceUnavailable",
        message: `cleanup waits for the volume's drive: ${what}; unless it returns, the partition is released at ${new Date(at).toISOString()} and its room held until the drive is back or removed`,
      },
      retryAfterMs: Math.min(60_000, Math.max(1000, at - now)),
    };
  }
  return {
    action: "abandon",
    why: {
      reason: DATA_ON_LOST_DEVICE,
      message: `${what}, past the ${Math.round(bound / 1000)} s bound: the partition is released without deleting its volume${d ? "; the drive's room stays held until the agent deletes the volume from the returned drive, or the NVMeDevice is deleted" : ""}`,
    },
    leftover: { since: new Date(now).toISOString(), reason: d ? "DeviceUnavailable" : "DeviceRemoved" },
  };
}

/**
 * Why a partition's content source may not be used, or undefined when it may: before the first
 * export, the source must be the object of that kind, name and UID in the partition's own
 * namespace, on the partition's drive. Resolving by the UID alone would let a partition name any
 * volume's or snapshot's data, whoever owns it. Once Exported, the copy exists and the source
 * may be gone.
 */
function contentSourceProblem(p: NVMePartition, found: ResolvedSource | null | undefined): Why | undefined {
  const src = p.spec.contentSource;
  if (!src || p.status?.state === "Exported") return undefined;
  const what = `${src.kind === "Snapshot" ? "NVMeSnapshot" : "NVMePartition"} ${p.metadata.namespace}/${src.name}`;
  if (!found || found.uid !== src.uid) {
    return {
      reason: "ContentSourceNotFound",
      message: `spec.contentSource names ${what} with uid ${src.uid}, and there is no such object${found ? ` (it has uid ${found.uid})` : ""}`,
    };
  }
  if (found.deviceSerial !== p.spec.deviceSerial) {
    return {
      reason: "ContentSourceElsewhere",
      message: `spec.contentSource ${what} is on drive ${found.deviceSerial ?? "(none yet)"}, not on ${p.spec.deviceSerial}`,
    };
  }
  return undefined;
}
