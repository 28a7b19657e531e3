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
  /**
   * status.blockMetadata holds the snapshot's changed-block record as SPDK has it now (False
   * while it is being read, or when it cannot be: too large, not an lvol).
   */
  BlockMetadata: "BlockMetadata",
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

/**
 * Longest encoded cluster map a status carries (etcd refuses objects near 1.5 MiB). A sparse map
 * is tiny; the worst case (every other cluster) fits about 6 million clusters.
 */
export const MAX_ENCODED_CLUSTER_MAP = 1024 * 1024;

export const NVMeSnapshotBlockMetadataSchema = v.pipe(
  v.object({
    clusterSizeBytes: int64("Cluster size of the lvstore: the granularity of the record.", 1),
    numClusters: int64("Clusters of the snapshot lvol (its size in clusters)."),
    clusters: str(
      "The clusters this snapshot holds itself, those written since parentSnapshot was taken (a " +
        "snapshot of a new volume: since it was created), as a bitmap (bit i set: cluster i; least " +
        "significant bit first), raw-deflated and base64-encoded. Read from SPDK by a shallow copy " +
        "of the snapshot into a sparse file.",
      MAX_ENCODED_CLUSTER_MAP,
    ),
    parentSnapshot: v.optional(
      str(
        "externalId of the NVMeSnapshot this one was taken after on the same volume lineage (its " +
          "nearest snapshot ancestor in the lvstore); absent when there is none.",
        128,
        1,
      ),
    ),
    fingerprint: str(
      "What the record was read from: each lvol from the snapshot up to parentSnapshot with its " +
        "allocated cluster count. SPDK merges a deleted snapshot into its only clone, which changes " +
        "it; the agent reads the record again then.",
      4096,
      1,
    ),
    recordedAt: dateTime("When the agent read the record."),
  }),
  v.description("Changed-block record of the snapshot, written by the agent (spdk backend only)."),
);
export type NVMeSnapshotBlockMetadata = v.InferOutput<typeof NVMeSnapshotBlockMetadataSchema>;

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
    blockMetadata: v.optional(NVMeSnapshotBlockMetadataSchema),
    conditions: conditions("Ready, DeletionBlocked while SPDK refuses to delete it, and BlockMetadata."),
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
