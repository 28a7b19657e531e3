// Which attachments speak for a partition: the CSI controller's single record, or a reader record
// under the name its own node id derives; look-alikes elsewhere or under other names do not.
import { expect, test } from "bun:test";
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { attachmentNameFor, readerAttachmentNameFor } from "../../lib/volume-identity.ts";
import { isPartitionRecord } from "./partition-record.ts";

const UID = "7d4c2a10-9b3e-4f51-8a2d-0c1b2e3f4a5b";
const p = { metadata: { name: "pvc-1", namespace: "distort-system", uid: UID } } as Pick<
  NVMePartition,
  "metadata"
>;
const att = (name: string, nodeId: string, namespace = "distort-system") =>
  ({
    metadata: { name, namespace },
    spec: { partitionName: "pvc-1", partitionUID: UID, nodeId },
  }) as unknown as NVMeVolumeAttachment;

test("the single record and each reader's own record count; anything else does not", () => {
  expect(isPartitionRecord(att(attachmentNameFor("pvc-1", UID), "node-a"), p)).toBe(true);
  const reader = readerAttachmentNameFor("pvc-1", UID, "node-b/nqn.x");
  expect(isPartitionRecord(att(reader, "node-b/nqn.x"), p)).toBe(true);
  // A reader record whose name another node id derives: a forged or misfiled record.
  expect(isPartitionRecord(att(reader, "node-c/nqn.y"), p)).toBe(false);
  expect(isPartitionRecord(att(`${attachmentNameFor("pvc-1", UID)}-x`, "node-a"), p)).toBe(false);
  expect(isPartitionRecord(att(attachmentNameFor("pvc-1", UID), "node-a", "tenant"), p)).toBe(false);
  expect(isPartitionRecord(att(attachmentNameFor("pvc-1", UID), "node-a"), undefined)).toBe(false);
});
