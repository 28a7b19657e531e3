// NVMeVolumeAttachment (namespaced): the durable single-writer ownership record of an exported partition,
// one per partition UID. CSI ControllerPublish writes spec; the agent installs the host ACL and reports AccessReady.
import * as v from "valibot";
import {
  API_VERSION,
  conditions,
  immutable,
  name,
  nqn,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  type PrinterColumn,
  type SelectableField,
  str,
} from "./common.ts";

/** Condition types written on NVMeVolumeAttachment.status. */
export const NVMeVolumeAttachmentConditionTypes = {
  /** The target ACL admits exactly spec.hostNQN for status.observedAttachmentId. */
  AccessReady: "AccessReady",
} as const;

export const NVMeVolumeAttachmentSpecSchema = v.pipe(
  v.object({
    partitionName: v.pipe(
      name("metadata.name of the NVMePartition in this namespace."),
      immutable("spec.partitionName"),
    ),
    partitionUID: v.pipe(
      str("metadata.uid of that NVMePartition; a recreated partition never inherits this record.", 128, 1),
      immutable("spec.partitionUID"),
    ),
    nodeId: str("CSI node ID of the single node authorized to connect.", 253, 1),
    hostNQN: nqn("Host NQN installed in the target ACL for nodeId."),
    attachmentId: str(
      "Unique ID of this ownership lifetime; changes on every takeover so stale unpublishes are recognisable.",
      128,
      1,
    ),
  }),
  v.description("Who may attach the partition, written by the CSI controller."),
);
export type NVMeVolumeAttachmentSpec = v.InferOutput<typeof NVMeVolumeAttachmentSpecSchema>;

export const NVMeVolumeAttachmentStatusSchema = v.pipe(
  v.object({
    observedAttachmentId: v.optional(
      str("spec.attachmentId the target ACL currently enforces (agent).", 128, 1),
    ),
    conditions: conditions("AccessReady: the target admits spec.hostNQN and only it."),
    observedGeneration: ObservedGenerationSchema,
  }),
  v.description("ACL state, written by the agent."),
);
export type NVMeVolumeAttachmentStatus = v.InferOutput<typeof NVMeVolumeAttachmentStatusSchema>;

export const NVMeVolumeAttachmentSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("NVMeVolumeAttachment"),
  metadata: ObjectMetaSchema,
  spec: NVMeVolumeAttachmentSpecSchema,
  status: v.optional(NVMeVolumeAttachmentStatusSchema),
});
export type NVMeVolumeAttachment = v.InferOutput<typeof NVMeVolumeAttachmentSchema>;

export const NVMeVolumeAttachmentPrinterColumns: readonly PrinterColumn[] = [
  { name: "Partition", type: "string", jsonPath: ".spec.partitionName" },
  { name: "Node", type: "string", jsonPath: ".spec.nodeId" },
  { name: "Ready", type: "string", jsonPath: '.status.conditions[?(@.type=="AccessReady")].status' },
  { name: "HostNQN", type: "string", jsonPath: ".spec.hostNQN", priority: 1 },
  { name: "Attachment", type: "string", jsonPath: ".spec.attachmentId", priority: 1 },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const NVMeVolumeAttachmentSelectableFields: readonly SelectableField[] = [
  ".spec.nodeId",
  ".spec.partitionName",
  ".spec.partitionUID",
];
