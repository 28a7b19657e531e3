// Deterministic names of everything the agent creates for a partition, derived from its immutable
// UID (never its namespace/name), so a crash-restart finds what an earlier pass created and a
// deleted-and-recreated partition of the same name never adopts its predecessor's volume.
import { createHash } from "node:crypto";
import { externalIdFor, NQN_PREFIX, nqnFor } from "../../lib/volume-identity.ts";

export { externalIdFor, NQN_PREFIX, nqnFor };

function sha256hex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** "snap-" + 20 hex digits of SHA-256(NVMeSnapshot uid): the snapshot lvol's name in its lvstore. */
export function snapshotExternalIdFor(uid: string): string {
  if (!uid) throw new Error("a snapshot without a UID has no identity yet");
  return `snap-${sha256hex(uid).slice(0, 20)}`;
}

/**
 * The hidden snapshot a partition-to-partition clone is made through ("<externalId>-src"): named
 * from the NEW partition, so a retry finds it and deleting the clone can remove it.
 */
export function cloneSourceSnapshotFor(externalId: string): string {
  return `${externalId}-src`;
}

/** The externalId inside one of our NQNs, or undefined for a foreign subsystem. */
export function externalIdOfNqn(nqn: string): string | undefined {
  return nqn.startsWith(NQN_PREFIX) ? nqn.slice(NQN_PREFIX.length) : undefined;
}

/** Subsystem serial number (SPDK allows 20 ASCII characters). */
export function serialNumberFor(externalId: string): string {
  return `DST${externalId.slice(4, 21)}`.toUpperCase();
}

/** lvstore name on a drive: from the drive's serial, which survives renames and rebinding. */
export function lvstoreNameFor(deviceSerial: string): string {
  return `lvs_${sha256hex(deviceSerial).slice(0, 16)}`;
}
