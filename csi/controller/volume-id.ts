// Names the CSI controller derives, all pure and deterministic so a retry after a crash finds what an
// earlier attempt created: the NVMePartition name for a CreateVolume name, the volume id carrying the
// partition's exact identity, and the one NVMeVolumeAttachment name per partition UID.
import { createHash } from "node:crypto";
import { attachmentNameFor, readerAttachmentNameFor } from "../../lib/volume-identity.ts";

/** Re-exported: the agent derives the same names (lib/volume-identity.ts). */
export { attachmentNameFor, readerAttachmentNameFor };

/** CSI's general size limit for string fields; the volume id must fit it. */
export const MAX_VOLUME_ID_BYTES = 128;
/** CSI request names longer than this are refused (csi-sanity creates exactly 128). */
export const MAX_REQUEST_NAME_LENGTH = 128;
/** Longest partition name this file produces. */
export const MAX_PARTITION_NAME_LENGTH = 40;
/** Kubernetes UIDs are canonical UUIDs. */
const UID_LENGTH = 36;
/**
 * Longest driver namespace whose ids still fit 128 bytes: namespace + "/" + name (40) + "/" + uid
 * (36). csi/config.ts refuses longer namespaces at startup.
 */
export const MAX_NAMESPACE_LENGTH = MAX_VOLUME_ID_BYTES - MAX_PARTITION_NAME_LENGTH - UID_LENGTH - 2;

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const UID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The exact NVMePartition a volume id designates. */
export interface VolumeRef {
  namespace: string;
  name: string;
  uid: string;
}

function sha256hex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/**
 * The NVMePartition name for CreateVolume `name`. A name that already is a DNS label of at most 40
 * characters (the external-provisioner's "pvc-<uid>") is used as it is, so `kubectl get nvmepart`
 * shows the PV name; anything else becomes "csi-" + 24 hex digits of SHA-256(name) (96 bits).
 * Two request names can only meet on one partition by a hash collision or a literal name that
 * looks like a hash; the partition records its request name, and CreateVolume refuses a mismatch.
 */
export function partitionNameFor(requestName: string): string {
  if (requestName.length <= MAX_PARTITION_NAME_LENGTH && DNS_LABEL.test(requestName)) return requestName;
  return `csi-${sha256hex(requestName).slice(0, 24)}`;
}

/**
 * Volume id format: "<namespace>/<name>/<uid>" of the NVMePartition, e.g.
 * "distort-system/pvc-0f8fad5b-d9cb-469f-a165-70867728950e/6d1f7c1e-0000-4000-8000-000000000002".
 * Neither namespaces nor names contain "/", so the split is unambiguous; the UID makes the id
 * designate one incarnation: a partition deleted and recreated under the same name is another
 * volume. Throws when the result would exceed 128 bytes (config keeps the namespace short enough).
 */
export function formatVolumeId(ref: VolumeRef): string {
  const id = `${ref.namespace}/${ref.name}/${ref.uid}`;
  if (Buffer.byteLength(id) > MAX_VOLUME_ID_BYTES)
    throw new Error(`volume id ${id} exceeds ${MAX_VOLUME_ID_BYTES} bytes`);
  return id;
}

/**
 * The partition a volume id designates, or undefined for anything this driver never issued
 * (wrong shape, over-long, not DNS labels, not a UUID). Callers answer "not found" (or OK for
 * DeleteVolume) rather than INVALID_ARGUMENT: an id we cannot read names no volume of ours.
 */
export function parseVolumeId(id: string): VolumeRef | undefined {
  if (Buffer.byteLength(id) > MAX_VOLUME_ID_BYTES) return undefined;
  const parts = id.split("/");
  if (parts.length !== 3) return undefined;
  const [namespace, name, uid] = parts as [string, string, string];
  if (namespace.length > 63 || !DNS_LABEL.test(namespace)) return undefined;
  if (name.length > MAX_PARTITION_NAME_LENGTH || !DNS_LABEL.test(name)) return undefined;
  if (!UID.test(uid)) return undefined;
  return { namespace, name, uid };
}
