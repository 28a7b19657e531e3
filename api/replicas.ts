// Replicated volumes: the fields of NVMePartition that make one volume several copies. A
// replicated volume (spec.replicas > 1) is never placed on a drive itself: the manager creates one
// replica partition per copy (spec.replicaOf names the volume), places each like any partition
// (the device ledger holds it), on distinct storage nodes, and records every copy's place, state
// and generation in the volume's status.replicas.
import * as v from "valibot";
import { dateTime, int64, intRange, name, str } from "./common.ts";

/** Most copies a volume may have. */
export const MAX_REPLICAS = 3;

/** spec.replicas: how many copies of the data, each on a storage node of its own. */
export const ReplicaCountSchema = v.pipe(
  intRange(1, MAX_REPLICAS),
  v.description(
    "Copies of the volume's data, each on a distinct storage node (spdk backend only; 1 or absent: a single copy). Immutable.",
  ),
);

/** A label key as Kubernetes allows it: an optional DNS prefix and a name of at most 63 characters. */
export const TopologyKeySchema = v.pipe(
  v.string(),
  v.maxLength(316),
  v.regex(
    /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/,
    "spec.replicaTopologyKey must be a label key such as topology.kubernetes.io/zone",
  ),
  v.description(
    "Storage-node label the replicas spread across: each replica on a node with a distinct value of it (nodes without the label are not used). Absent: distinct nodes only. Immutable.",
  ),
);

/** spec.replicaOf: on a replica partition, the volume it holds a copy of. */
export const ReplicaOfSchema = v.pipe(
  v.object({
    name: name("metadata.name of the replicated volume (an NVMePartition in this namespace)."),
    uid: str("metadata.uid of that volume; a replica never serves a recreated volume.", 128, 1),
  }),
  v.description("Set by the manager on each replica it creates; immutable."),
);
export type ReplicaOf = v.InferOutput<typeof ReplicaOfSchema>;

export const ReplicaStateSchema = v.pipe(
  v.picklist(["Pending", "Online", "Degraded", "Rebuilding", "Faulted", "Stale"]),
  v.description(
    "Pending: not exported yet. Online: current (holds every acknowledged write). Degraded: current, but its storage node or export is not ready. Rebuilding: being caught up from a current copy. Faulted: lost or failed. Stale: missed writes; rejoins only through a rebuild.",
  ),
);
export type ReplicaState = v.InferOutput<typeof ReplicaStateSchema>;

/** Progress of the rebuild that is catching a Rebuilding copy up (serving agent). */
export const RebuildProgressSchema = v.pipe(
  v.object({
    percent: v.pipe(
      intRange(0, 100),
      v.description("Share of the volume copied onto the copy so far, in whole percent."),
    ),
    bytesDone: int64("Bytes of the volume copied onto the copy so far."),
    bytesTotal: int64("Bytes the rebuild copies in all (the raid's data size)."),
  }),
  v.description(
    "Set by the serving node while the copy is Rebuilding; a rebuild that is interrupted starts again from zero.",
  ),
);
export type RebuildProgress = v.InferOutput<typeof RebuildProgressSchema>;

export const ReplicaStatusSchema = v.pipe(
  v.object({
    name: name("The replica partition's metadata.name."),
    uid: v.optional(str("The replica partition's metadata.uid.", 128, 1)),
    nodeName: v.optional(name("Storage node holding the copy, once placed.")),
    deviceSerial: v.optional(str("Drive holding the copy, once placed.", 256, 1)),
    state: ReplicaStateSchema,
    generation: int64(
      "The volume data generation this copy is known to hold in full; equal to status.dataGeneration for a current copy.",
    ),
    message: v.optional(str("Why the replica is in its state.", 1024)),
    rebuild: v.optional(RebuildProgressSchema),
    retiring: v.optional(
      str(
        "Set by the manager on a copy to be removed (e.g. drain of <node>) once its replacement is current: the serving node records it Stale at a raised data generation and takes it out of its raid; then the manager withdraws its admission and deletes it.",
        256,
        1,
      ),
    ),
  }),
  v.description("One copy of a replicated volume."),
);
export type ReplicaStatus = v.InferOutput<typeof ReplicaStatusSchema>;

/**
 * status.rebuildSlot: the volume's claim on one of the cluster's rebuild slots (at most one per
 * volume: a raid runs one rebuild at a time). The serving node's agent asks (replica, uid, node,
 * requestedAt) once a copy could start and its node has room; the manager grants (grantedAt)
 * within DISTORT_REBUILDS_PER_CLUSTER, oldest request first, or says why it waits (message). The
 * agent starts a rebuild only under a grant naming that copy and itself, and drops the slot when
 * the rebuild finishes or fails; the manager drops a slot whose copy, volume or serving node is
 * gone or moved.
 */
export const RebuildSlotSchema = v.pipe(
  v.object({
    replica: name("The replica partition (copy) to rebuild."),
    uid: str("That replica partition's metadata.uid.", 128, 1),
    node: name("The serving node that asked; a slot naming another node than spec.nodeName is void."),
    requestedAt: dateTime("When the serving node asked: the queue's order (oldest first)."),
    grantedAt: v.optional(dateTime("When the manager granted the slot; absent: queued.")),
    message: v.optional(str("Why the request waits (manager).", 1024)),
  }),
  v.description(
    "Replicated volumes: the cluster-wide rebuild slot this volume asked for or holds (serving agent asks, manager grants).",
  ),
);
export type RebuildSlot = v.InferOutput<typeof RebuildSlotSchema>;

export const ReplicaStatusListSchema = v.pipe(
  v.array(ReplicaStatusSchema),
  // Room for every copy plus replacements being built beside them (drain, rebuild).
  v.maxLength(2 * MAX_REPLICAS),
  v.description("Every copy of a replicated volume (manager)."),
);

/** Bounds of spec.failoverAfterSeconds, and the default when it is absent. */
export const FAILOVER_AFTER_MIN_SECONDS = 5;
export const FAILOVER_AFTER_MAX_SECONDS = 3600;
export const DEFAULT_FAILOVER_AFTER_SECONDS = 30;

/** spec.failoverAfterSeconds: how long the serving node may go without a heartbeat before another serves. */
export const FailoverAfterSchema = v.pipe(
  intRange(FAILOVER_AFTER_MIN_SECONDS, FAILOVER_AFTER_MAX_SECONDS),
  v.description(
    "Replicated volumes: seconds the serving node may go without a heartbeat before the volume is served from another node holding a current copy (after the old one is fenced from every copy). Absent: 30.",
  ),
);

/**
 * Annotation on a replicated volume whose serving node is lost with no current copy on a live
 * node: the operator's explicit choice to serve a stale copy, losing the writes it missed. The
 * value names the copy to promote (an NVMePartition name from status.replicas) or is "newest"
 * (the copy on a live node holding the highest generation). The manager removes it once acted
 * upon; without it nothing stale is ever served.
 */
export const ACCEPT_DATA_LOSS_ANNOTATION = "storage.distort.io/accept-data-loss";
/** The ACCEPT_DATA_LOSS_ANNOTATION value that picks the newest stale copy on a live node. */
export const ACCEPT_NEWEST = "newest";

/**
 * Annotation on a replicated volume asking for a planned handover: its value names the serving
 * node to leave (spec.nodeName). That node's agent stops taking writes first (listener ANA
 * inaccessible, raid torn down) and records status.releasedBy; only then does the manager fence
 * it from every copy, raise the generation over the copies that go on and serve from another node
 * holding a current copy. The manager removes it once the volume is served elsewhere. A drain of
 * the serving node sets it; an operator may too.
 */
export const HANDOVER_ANNOTATION = "storage.distort.io/handover-from";
