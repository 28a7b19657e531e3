// Which NVMeVolumeAttachment speaks for a partition: the one record the CSI controller keeps for
// that exact incarnation. Any other object naming the partition's UID is ignored by the ACL code.
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { attachmentNameFor, readerAttachmentNameFor } from "../../lib/volume-identity.ts";

/**
 * True when `a` is the CSI controller's record for partition `p`: it lives in p's namespace (the
 * release namespace, which the agent alone watches and which tenants cannot write), carries the
 * name derived from p's name and UID (ControllerPublishVolume creates exactly that name, so the
 * API server keeps it unique) — or, for a MULTI_NODE_READER_ONLY reader, the reader name its own
 * spec.nodeId derives — and its spec names exactly p. Labels are not relied on: whoever
 * may create objects there may set any label, so they would add no guarantee.
 */
export function isPartitionRecord(
  a: NVMeVolumeAttachment,
  p: Pick<NVMePartition, "metadata"> | undefined,
): boolean {
  const uid = p?.metadata.uid;
  if (!p || !uid) return false;
  return (
    a.metadata.namespace === p.metadata.namespace &&
    (a.metadata.name === attachmentNameFor(p.metadata.name, uid) ||
      a.metadata.name === readerAttachmentNameFor(p.metadata.name, uid, a.spec.nodeId)) &&
    a.spec.partitionUID === uid &&
    a.spec.partitionName === p.metadata.name
  );
}
