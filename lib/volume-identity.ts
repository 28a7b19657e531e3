// Names derived from an NVMePartition's immutable UID that more than one binary relies on: the
// agent exports under them, the CSI controller publishes under them, the CSI node checks them.
// Pure and deterministic; never derived from anything a status field or a request says.
import { createHash } from "node:crypto";

export const NQN_PREFIX = "nqn.2026-02.io.distort:volume-";

function sha256hex(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** "vol-" + 20 hex digits of SHA-256(uid): 80 bits, unique for any realistic number of volumes. */
export function externalIdFor(uid: string): string {
  if (!uid) throw new Error("a partition without a UID has no identity yet");
  return `vol-${sha256hex(uid).slice(0, 20)}`;
}

/** The subsystem NQN of a volume whose externalId is `externalId`. */
export function nqnFor(externalId: string): string {
  return `${NQN_PREFIX}${externalId}`;
}

/**
 * The NVMeVolumeAttachment name of a partition incarnation: "<partition>-<10 hex of SHA-256(uid)>".
 * One name per UID makes "one attachment per partition" a property of the API server (create
 * answers AlreadyExists), and a recreated partition never meets its predecessor's attachment.
 * The hash part has a fixed length, so distinct (name, uid) pairs cannot produce the same name.
 * The agent admits hosts only from the attachment of exactly this name in the partition's own
 * namespace (the release namespace), which is how it recognises the CSI controller's record.
 */
export function attachmentNameFor(partitionName: string, partitionUID: string): string {
  return `${partitionName}-${sha256hex(partitionUID).slice(0, 10)}`;
}

/**
 * The NVMeVolumeAttachment name of one reader node of a MULTI_NODE_READER_ONLY partition:
 * attachmentNameFor() plus "-r" and 10 hex of SHA-256(node id), so each reader node has exactly
 * one, and it never equals the partition's writer-style attachment name. The agent admits a
 * reader record only under the name its own spec.nodeId derives.
 */
export function readerAttachmentNameFor(partitionName: string, partitionUID: string, nodeId: string): string {
  return `${attachmentNameFor(partitionName, partitionUID)}-r${sha256hex(nodeId).slice(0, 10)}`;
}

/** Prefix of the host NQN a storage node serving replicated volumes connects to their copies with. */
export const NEXUS_HOST_NQN_PREFIX = "nqn.2026-02.io.distort:nexus-";

/**
 * The host NQN with which storage node `nodeName` attaches the copies of the replicated volumes it
 * serves (SPDK's bdev_nvme_attach_controller hostnqn). One per node: a replica's ACL admitting it
 * admits that node only, and revoking it fences that node. A name too long for an NQN (223
 * bytes) is cut and given a hash of the whole.
 */
export function nexusHostNqnFor(nodeName: string): string {
  const nqn = `${NEXUS_HOST_NQN_PREFIX}${nodeName}`;
  if (nqn.length <= 223) return nqn;
  return `${NEXUS_HOST_NQN_PREFIX}${nodeName.slice(0, 223 - NEXUS_HOST_NQN_PREFIX.length - 17)}-${sha256hex(nodeName).slice(0, 16)}`;
}

/** The raid1 bdev that serves replicated volume `externalId` on its serving node. */
export function nexusBdevFor(externalId: string): string {
  return `nexus-${externalId}`;
}

/** The index in a replica partition's name (<volume>-r<index>: the part after the last "-r"), or undefined. */
export function replicaIndex(name: string): number | undefined {
  const m = /-r(\d{1,3})$/.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** Slots the controller-ID space of a replicated volume's subsystem is split into, one per node. */
export const CNTLID_SLOTS = 8;
const CNTLID_MAX = 0xffef;
const CNTLID_SLOT_SIZE = Math.floor(CNTLID_MAX / CNTLID_SLOTS);

/**
 * The controller IDs a node hands out on a replicated volume's subsystem (standby or serving):
 * the slot of the copy it holds (its replica index, modulo CNTLID_SLOTS - 1), or the last slot on
 * a node that serves without holding a copy. Copies of one volume are on distinct nodes, so the
 * nodes a host reaches one volume through never repeat a controller ID (a host refuses that).
 */
export function cntlidRangeFor(copyIndex: number | undefined): { min: number; max: number } {
  const slot = copyIndex === undefined ? CNTLID_SLOTS - 1 : copyIndex % (CNTLID_SLOTS - 1);
  const min = slot * CNTLID_SLOT_SIZE + 1;
  return { min, max: min + CNTLID_SLOT_SIZE - 1 };
}
