// Names the serving node of a replicated volume derives for what it creates: the bdev_nvme
// controller through which it reaches each copy, the namespace identity each copy is exported
// under, and the raid's UUID. All come from immutable UIDs, so a pass after a crash finds what an
// earlier one made, and two nodes serving the same volume in turn present the same namespace.
import { createHash } from "node:crypto";

function sha256hex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** A UUID (version 4 layout, variant 10) made from a hash of `seed`: stable, never random. */
function uuidFrom(seed: string): string {
  const h = sha256hex(seed).slice(0, 32).split("");
  h[12] = "4";
  h[16] = ((Number.parseInt(h[16] as string, 16) & 0x3) | 0x8).toString(16);
  const s = h.join("");
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-${s.slice(12, 16)}-${s.slice(16, 20)}-${s.slice(20, 32)}`;
}

/** Prefix of every controller a nexus attaches (bdev_nvme names; its namespace 1 is `<name>n1`). */
export const NEXUS_CONTROLLER_PREFIX = "nxr_";

/** The bdev_nvme controller through which the serving node reaches the copy with UID `copyUid`. */
export function nexusControllerNameFor(copyUid: string): string {
  if (!copyUid) throw new Error("a copy without a UID has no controller name");
  return `${NEXUS_CONTROLLER_PREFIX}${sha256hex(copyUid).slice(0, 16)}`;
}

/** The namespace bdev of a controller attached by the nexus (namespace 1). */
export function nexusMemberBdevFor(controllerName: string): string {
  return `${controllerName}n1`;
}

/** The controller name behind a member bdev name `<ctrlr>n<nsid>`, or undefined if not one of ours. */
export function controllerOfMemberBdev(bdev: string): string | undefined {
  const m = /^(nxr_[0-9a-f]{16})n\d+$/.exec(bdev);
  return m?.[1];
}

/**
 * The namespace UUID a copy (a partition with spec.replicaOf) is exported under. It must differ
 * from its lvol's UUID: SPDK gives the bdev of an attached namespace the namespace's UUID, and a
 * bdev whose UUID another bdev holds is not registered, so the serving node could not reach a
 * copy on its own drive through the fabric if the two were equal.
 */
export function replicaNamespaceUuidFor(copyUid: string): string {
  if (!copyUid) throw new Error("a copy without a UID has no namespace identity");
  return uuidFrom(`distort-replica-namespace\0${copyUid}`);
}

/**
 * The UUID of a replicated volume's raid1 bdev, and so of the namespace it is exported under
 * (SPDK defaults a namespace's UUID to its bdev's): one per volume, so a consumer's multipath sees
 * the same namespace whichever node serves it.
 */
export function nexusRaidUuidFor(volumeUid: string): string {
  if (!volumeUid) throw new Error("a volume without a UID has no raid identity");
  return uuidFrom(`distort-nexus-raid\0${volumeUid}`);
}
