// Whether a CSI-made NVMePartition has been orphaned: its claim was deleted before a PV existed, so
// external-provisioner will never call DeleteVolume for it (kubernetes-csi/external-provisioner
// #311, #486). Pure: the collector in orphan-collection.ts gathers the facts and acts on the verdict.
import type { NVMePartition } from "../../api/index.ts";
import { Annotations, PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./fingerprint.ts";

/** The PersistentVolumeClaim a partition was created for, from its provisioner annotations. */
export interface ClaimRef {
  namespace: string;
  name: string;
  /**
   * The claim UID external-provisioner encodes in the PV name ("<prefix>-<uid>"); undefined when
   * the name carries none, and then only a missing or deleting claim counts as gone.
   */
  uid?: string;
}

/** What the collector looked up about one partition's claim. */
export type ClaimState = { exists: false } | { exists: true; uid: string; deleting: boolean };

export interface OrphanFacts {
  /** The claim named by the partition's annotations, as the API server answered just now. */
  claim: ClaimState;
  /** A PersistentVolume is named after the partition's PV name or its volumeHandle names the partition. */
  hasPersistentVolume: boolean;
  /** An NVMeVolumeAttachment holds the partition (no PV should mean none; never delete past one). */
  attached: boolean;
  now: number;
  graceMs: number;
}

export type OrphanVerdict =
  | { action: "keep"; reason: string }
  | { action: "delete"; reason: string; claim: ClaimRef };

const TRAILING_UID = /([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;

/**
 * The claim of a partition, or undefined when it has no pvc-name and pvc-namespace annotations:
 * csi-sanity and direct CSI users create volumes without claims, and those are never collected.
 */
export function claimOf(p: NVMePartition): ClaimRef | undefined {
  const a = p.metadata.annotations ?? {};
  const name = a[Annotations.pvcName];
  const namespace = a[Annotations.pvcNamespace];
  if (!name || !namespace) return undefined;
  // The CreateVolume name is the PV name when the pv-name annotation is absent.
  const pvName = a[Annotations.pvName] ?? a[Annotations.requestName] ?? "";
  const uid = TRAILING_UID.exec(pvName)?.[1];
  return { namespace, name, ...(uid ? { uid } : {}) };
}

/** The PV name a partition was created for (the CreateVolume name unless annotated otherwise). */
export function pvNameOf(p: NVMePartition): string | undefined {
  const a = p.metadata.annotations ?? {};
  return a[Annotations.pvName] ?? a[Annotations.requestName];
}

/**
 * The part of the verdict that needs no lookups: keep (with why) for a partition the CSI controller
 * did not make (no provisioned-by label or no CreateVolume name), one without claim annotations, one already being deleted, or one younger than `graceMs` (a CreateVolume in flight
 * or a provisioner retry must never be raced); undefined when the claim and PVs must be consulted.
 */
export function preliminaryVerdict(
  p: NVMePartition,
  now: number,
  graceMs: number,
): { action: "keep"; reason: string } | undefined {
  // Garbage collection touches only what this controller made: its label and its CreateVolume name.
  if (
    p.metadata.labels?.[PROVISIONED_BY_LABEL] !== PROVISIONED_BY ||
    !p.metadata.annotations?.[Annotations.requestName]
  )
    return { action: "keep", reason: "not provisioned by the DISTORT CSI controller" };
  if (!claimOf(p)) return { action: "keep", reason: "no claim annotations" };
  if (p.metadata.deletionTimestamp) return { action: "keep", reason: "already being deleted" };
  const created = Date.parse(p.metadata.creationTimestamp ?? "");
  // An unreadable timestamp counts as brand new: doubt keeps the partition.
  if (!Number.isFinite(created) || now - created < graceMs)
    return { action: "keep", reason: "younger than the grace period" };
  return undefined;
}

/**
 * Keep or delete, with the reason. Deletes only a partition with claim annotations, past the grace
 * period, not being deleted, with no PV and no attachment, whose claim is missing, being deleted,
 * or replaced by another claim of the same name (different UID). Everything else is kept.
 */
export function decideOrphan(p: NVMePartition, f: OrphanFacts): OrphanVerdict {
  const early = preliminaryVerdict(p, f.now, f.graceMs);
  if (early) return early;
  const claim = claimOf(p) as ClaimRef;
  if (f.hasPersistentVolume) return { action: "keep", reason: "a PersistentVolume refers to it" };
  if (f.attached) return { action: "keep", reason: "it is attached" };
  const what = `PersistentVolumeClaim ${claim.namespace}/${claim.name}${claim.uid ? ` (uid ${claim.uid})` : ""}`;
  if (!f.claim.exists) return { action: "delete", reason: `${what} no longer exists`, claim };
  if (f.claim.deleting) return { action: "delete", reason: `${what} is being deleted`, claim };
  if (claim.uid && f.claim.uid !== claim.uid)
    return {
      action: "delete",
      reason: `${what} no longer exists: the claim of that name now is uid ${f.claim.uid}`,
      claim,
    };
  return { action: "keep", reason: "its claim exists" };
}
