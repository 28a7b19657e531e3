// NVMeSnapshot (namespaced): a point-in-time, read-only copy of one NVMePartition (spdk backend only).
// CSI CreateSnapshot writes spec; the agent on the source's node takes an SPDK lvol snapshot and reports it.
import * as v from "valibot";
import {
  API_VERSION,
  conditions,
  dateTime,
  immutable,
  int64,
  name,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  type PrinterColumn,
  quantity,
  type SelectableField,
  str,
} from "./common.ts";

/** Condition types written on NVMeSnapshot.status. */
export const NVMeSnapshotConditionTypes = {
  /** The snapshot lvol exists and is usable as a clone source. */
  Ready: "Ready",
  /** Deletion is held back (e.g. SPDK refuses while more than one clone depends on it). */
  DeletionBlocked: "DeletionBlocked",
} as const;

/**
 * A volume group snapshot is the set of NVMeSnapshots carrying this label (value: the group
 * name); each member also carries the group record in GroupSnapshotAnnotations. The agent takes
 * all members of a group together.
 */
export const GROUP_SNAPSHOT_LABEL = "storage.distort.io/group-snapshot";

/** Annotations every member of a group carries: together they are the group record. */
export const GroupSnapshotAnnotations = {
  requestName: "storage.distort.io/group-request-name",
  /** JSON array of the member NVMeSnapshot names, in source-volume order. */
  members: "storage.distort.io/group-members",
  /** JSON array of the source volume ids, sorted. */
  sourceVolumeIds: "storage.distort.io/group-source-volume-ids",
} as const;

/** Ready=False reason of every member of a group whose sources are on several storage nodes. */
export const GROUP_SPANS_NODES_REASON = "GroupSpansNodes";

/** The member names a snapshot's group record lists; empty when it records none. Pure. */
export function groupMembersOf(s: { metadata: { annotations?: Record<string, string> } }): string[] {
  try {
    const v: unknown = JSON.parse(s.metadata.annotations?.[GroupSnapshotAnnotations.members] ?? "[]");
    return Array.isArray(v) && v.every((x) => typeof x === "string") ? v : [];
  } catch {
    return [];
  }
}

export const NVMeSnapshotSpecSchema = v.pipe(
  v.object({
    sourcePartitionName: v.pipe(
      name("metadata.name of the source NVMePartition in this namespace."),
      immutable("spec.sourcePartitionName"),
    ),
    sourcePartitionUID: v.pipe(
      str("metadata.uid of that NVMePartition; a recreated partition is never the source.", 128, 1),
      immutable("spec.sourcePartitionUID"),
    ),
  }),
  v.description("Which partition to snapshot, written by the CSI controller."),
);
export type NVMeSnapshotSpec = v.InferOutput<typeof NVMeSnapshotSpecSchema>;

export const NVMeSnapshotStatusSchema = v.pipe(
  v.object({
    readyToUse: v.optional(v.pipe(v.boolean(), v.description("The snapshot can be cloned from."))),
    sizeBytes: v.optional(int64("Size of the source volume when the snapshot was taken.")),
    size: v.optional(quantity("sizeBytes as a quantity (agent, with sizeBytes).")),
    externalId: v.optional(str("Snapshot lvol name in the source's lvstore (snap-<hash of uid>).", 128, 1)),
    nodeName: v.optional(name("Storage node holding the snapshot (the source's node when taken).")),
    deviceSerial: v.optional(
      str("Serial of the drive whose lvstore holds the snapshot; survives the source's deletion.", 256, 1),
    ),
    creationTime: v.optional(dateTime("When the agent took the snapshot.")),
    conditions: conditions("Ready, and DeletionBlocked while SPDK refuses to delete it."),
    observedGeneration: ObservedGenerationSchema,
  }),
  v.description("Snapshot state, written by the agent."),
);
export type NVMeSnapshotStatus = v.InferOutput<typeof NVMeSnapshotStatusSchema>;

export const NVMeSnapshotSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("NVMeSnapshot"),
  metadata: ObjectMetaSchema,
  spec: NVMeSnapshotSpecSchema,
  status: v.optional(NVMeSnapshotStatusSchema),
});
export type NVMeSnapshot = v.InferOutput<typeof NVMeSnapshotSchema>;

export const NVMeSnapshotPrinterColumns: readonly PrinterColumn[] = [
  { name: "Source", type: "string", jsonPath: ".spec.sourcePartitionName" },
  { name: "Ready", type: "boolean", jsonPath: ".status.readyToUse" },
  { name: "Size", type: "string", jsonPath: ".status.size" },
  { name: "Node", type: "string", jsonPath: ".status.nodeName", priority: 1 },
  { name: "ExternalID", type: "string", jsonPath: ".status.externalId", priority: 1 },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const NVMeSnapshotSelectableFields: readonly SelectableField[] = [
  ".spec.sourcePartitionName",
  ".spec.sourcePartitionUID",
];
