// NVMePartition (namespaced): one volume carved from a claimed drive and exported over NVMe-oF. CSI creates
// it, the manager places it (nodeName, deviceSerial, claimRef), the agent provisions, exports and reports it.
import * as v from "valibot";
import {
  API_VERSION,
  BackendSchema,
  ClaimRefSchema,
  cel,
  conditions,
  immutable,
  immutableOnceSet,
  int64,
  intRange,
  ipAddress,
  name,
  nqn,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  PortSchema,
  type PrinterColumn,
  positiveBytes,
  quantity,
  type SelectableField,
  str,
  TransportSchema,
} from "./common.ts";
import {
  FailoverAfterSchema,
  RebuildSlotSchema,
  ReplicaCountSchema,
  ReplicaOfSchema,
  ReplicaStatusListSchema,
  TopologyKeySchema,
} from "./replicas.ts";

export const VolumeManagerSchema = v.pipe(
  v.picklist(["partition", "spdk-lvol", "parted"]),
  v.description(
    "How capacity is carved. partition: the backend's default (spdk-lvol under spdk, parted under kernel).",
  ),
);
export type VolumeManager = v.InferOutput<typeof VolumeManagerSchema>;

export const SecretKeyRefSchema = v.pipe(
  v.object({
    name: name("Secret name, in the partition's namespace."),
    key: str("Key within the Secret holding the DH-HMAC-CHAP secret.", 253, 1),
  }),
  v.description("DH-HMAC-CHAP key for in-band authentication, read from a Secret (never inlined)."),
);
export type SecretKeyRef = v.InferOutput<typeof SecretKeyRefSchema>;

export const DhchapOptionsSchema = v.pipe(
  v.object({
    mode: v.pipe(
      v.picklist(["unidirectional", "bidirectional"]),
      v.description("unidirectional: hosts authenticate; bidirectional: the target authenticates too."),
    ),
    hash: v.optional(
      v.pipe(v.picklist(["sha256", "sha384", "sha512"]), v.description("HMAC hash of the exchange.")),
      "sha256",
    ),
    dhgroup: v.optional(
      v.pipe(
        v.picklist(["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]),
        v.description("Diffie-Hellman group of the exchange; null for none."),
      ),
      "null",
    ),
    secretName: name(
      "Secret (partition's namespace) with one key pair per host NQN, written by the CSI controller at publish.",
    ),
  }),
  v.description(
    "DH-HMAC-CHAP with keys generated per volume and host; hosts without keys in the Secret are not admitted.",
  ),
);
export type DhchapOptions = v.InferOutput<typeof DhchapOptionsSchema>;

export const TlsOptionsSchema = v.pipe(
  v.object({
    secretName: name(
      "Secret (partition's namespace) with one NVMe/TCP TLS PSK per host NQN, written by the CSI controller at publish.",
    ),
  }),
  v.description(
    "NVMe/TCP TLS 1.3 with a PSK per host (tcp only): the listeners accept only TLS connections, and hosts without a PSK in the Secret are not admitted.",
  ),
);
export type TlsOptions = v.InferOutput<typeof TlsOptionsSchema>;
/** Most portals (listeners) one export may have: the agent refuses a longer configured list. */
export const MAX_PORTALS = 8;

/** One listener of an export, as the agent read it back from the target. */
export const PortalStatusSchema = v.pipe(
  v.object({
    address: ipAddress("status.portals[].address", "Listener address."),
    port: v.pipe(PortSchema, v.description("Listener service port.")),
    anaState: v.optional(
      v.pipe(
        v.picklist(["optimized", "non_optimized", "inaccessible", "persistent_loss", "change"]),
        v.description("ANA state of the volume's namespace on this listener, when the target reports ANA."),
      ),
    ),
  }),
  v.description("A path to the export."),
);
export type PortalStatus = v.InferOutput<typeof PortalStatusSchema>;

export const TargetOptionsSchema = v.pipe(
  v.object({
    transport: v.optional(TransportSchema, "rdma"),
    portalPort: v.optional(
      v.pipe(PortSchema, v.description("Listener service port; the node's default port when unset.")),
    ),
    coreMask: v.optional(
      v.pipe(
        v.string(),
        v.maxLength(66),
        // Non-zero: nvmf_tgt refuses an empty reactor set.
        v.regex(
          /^0x[0-9a-fA-F]*[1-9a-fA-F][0-9a-fA-F]*$/,
          "spec.targetOptions.coreMask must be non-zero hex like 0x3",
        ),
        v.description("SPDK reactor core mask (non-zero hex, e.g. 0x3); spdk backend only."),
      ),
    ),
    dhchapSecretRef: v.optional(SecretKeyRefSchema),
    dhchap: v.optional(DhchapOptionsSchema),
    tls: v.optional(TlsOptionsSchema),
  }),
  v.check(
    (o) => o.tls === undefined || o.transport === "tcp",
    "spec.targetOptions.tls needs transport tcp: TLS is defined for NVMe/TCP only",
  ),
  cel(
    "!has(self.tls) || (has(self.transport) && self.transport == 'tcp')",
    "spec.targetOptions.tls needs transport tcp: TLS is defined for NVMe/TCP only",
  ),
  v.description("Backend-specific export options. Immutable: initiators already hold the old portal."),
);
export type TargetOptions = v.InferOutput<typeof TargetOptionsSchema>;

/**
 * One accessible topology, as CSI's Topology message carries it: every segment must equal the
 * storage node's label of the same key (labels on the RDMAStorageNode object).
 */
export const TopologySchema = v.pipe(
  v.object({
    segments: v.pipe(
      v.record(v.string(), v.pipe(v.string(), v.maxLength(63))),
      v.maxEntries(16),
      v.description("Topology key -> value, e.g. topology.kubernetes.io/zone: zone-a."),
    ),
  }),
  v.description("One topology segment map."),
);
export type Topology = v.InferOutput<typeof TopologySchema>;

export const TopologyRequirementSchema = v.pipe(
  v.object({
    requisite: v.optional(
      v.pipe(
        v.array(TopologySchema),
        v.maxLength(32),
        v.description("The storage node must match at least one of these; any node when empty."),
      ),
    ),
    preferred: v.optional(
      v.pipe(
        v.array(TopologySchema),
        v.maxLength(32),
        v.description("Tried in order: a node matching an earlier entry wins over later ones."),
      ),
    ),
  }),
  v.description(
    "Accessibility requirements (CSI CreateVolume accessibility_requirements); read by placement only.",
  ),
);
export type TopologyRequirement = v.InferOutput<typeof TopologyRequirementSchema>;

export const ContentSourceSchema = v.pipe(
  v.object({
    kind: v.pipe(
      v.picklist(["Snapshot", "Partition"]),
      v.description("Snapshot: an NVMeSnapshot; Partition: another NVMePartition (a clone)."),
    ),
    name: name("metadata.name of the source object in this namespace."),
    uid: str("metadata.uid of the source object; a recreated source is never used.", 128, 1),
  }),
  v.description("Initial content: the volume starts as a copy of this source (spdk backend only)."),
);
export type ContentSource = v.InferOutput<typeof ContentSourceSchema>;

/** Largest accepted IOPS limit (far beyond any drive; keeps SPDK's uint64 arithmetic exact). */
export const MAX_QOS_IOPS = 1_000_000_000;
/** Largest accepted bandwidth limit in MiB/s (about 1 TiB/s; SPDK multiplies by 2^20 in uint64). */
export const MAX_QOS_MBPS = 1_000_000;
/** SPDK's IOPS granularity: bdev_set_qos_limit rounds any other rw_ios_per_sec up to a multiple. */
export const QOS_IOPS_UNIT = 1000;

const mbps = (what: string, spdkName: string) =>
  v.optional(
    v.pipe(
      intRange(0, MAX_QOS_MBPS),
      v.description(`${what} bandwidth limit in MiB/s (SPDK ${spdkName}); 0 or absent: unlimited.`),
    ),
  );
const iops = (description: string) => v.pipe(intRange(0, MAX_QOS_IOPS), v.description(description));

const iopsStep = `spec.qos.rwIosPerSec must be a multiple of ${QOS_IOPS_UNIT} (SPDK's QoS granularity)`;

/**
 * Per-volume I/O limits, the four of SPDK's bdev_set_qos_limit. The whole desired state: a limit
 * that is absent is 0, unlimited. SPDK backend only (nvmet has no per-namespace rate limits).
 */
export const QosLimitsSchema = v.pipe(
  v.object({
    rwIosPerSec: v.optional(
      v.pipe(
        iops("Read+write IOPS limit (SPDK rw_ios_per_sec), a multiple of 1000; 0 or absent: unlimited."),
        v.multipleOf(QOS_IOPS_UNIT, iopsStep),
        cel(`self % ${QOS_IOPS_UNIT} == 0`, iopsStep),
      ),
    ),
    rwMBytesPerSec: mbps("Read+write", "rw_mbytes_per_sec"),
    rMBytesPerSec: mbps("Read", "r_mbytes_per_sec"),
    wMBytesPerSec: mbps("Write", "w_mbytes_per_sec"),
  }),
  v.description("I/O rate limits applied on the target (SPDK bdev QoS); mutable, applied online."),
);
export type QosLimits = v.InferOutput<typeof QosLimitsSchema>;

/** The limits a target reports enforcing (what SPDK's assigned_rate_limits shows). */
export const AppliedQosSchema = v.pipe(
  v.object({
    rwIosPerSec: iops("Read+write IOPS limit in force; 0: unlimited."),
    rwMBytesPerSec: v.pipe(
      v.number(),
      v.integer(),
      v.minValue(0),
      v.description("Read+write MiB/s; 0: unlimited."),
    ),
    rMBytesPerSec: v.pipe(v.number(), v.integer(), v.minValue(0), v.description("Read MiB/s; 0: unlimited.")),
    wMBytesPerSec: v.pipe(
      v.number(),
      v.integer(),
      v.minValue(0),
      v.description("Write MiB/s; 0: unlimited."),
    ),
  }),
  v.description("Rate limits the target enforces, read back from it after applying spec.qos."),
);
export type AppliedQos = v.InferOutput<typeof AppliedQosSchema>;

const lvolNeedsSpdk = "spec.volumeManager spdk-lvol requires spec.backend spdk";
const partedNeedsKernel = "spec.volumeManager parted requires spec.backend kernel";
const placementTogether = "spec.nodeName and spec.deviceSerial must be set together";
const coreMaskNeedsSpdk = "spec.targetOptions.coreMask requires spec.backend spdk";
const qosNeedsSpdk = "spec.qos requires spec.backend spdk: nvmet has no per-namespace rate limits";
const thinNeedsSpdk = "spec.thinProvisioning requires spec.backend spdk: kernel partitions are always thick";
export const replicasNeedSpdk =
  "spec.replicas above 1 requires spec.backend spdk: the kernel nvmet backend has no RAID to mirror copies with";
const replicatedNotPlaced =
  "spec.deviceSerial stays unset on a replicated volume: its replicas are placed, each on its own drive, and spec.nodeName names the node serving it";
const replicaOfSingle = "spec.replicaOf is set only on a single-copy replica (spec.replicas absent or 1)";
const spreadNeedsReplicas = "spec.replicaTopologyKey needs spec.replicas above 1";
const failoverNeedsReplicas = "spec.failoverAfterSeconds needs spec.replicas above 1";
export const replicatedNoSource =
  "spec.contentSource is not supported with spec.replicas above 1 (clones and restores stay on one drive)";
const wholeImmutable = <T>(field: string) =>
  cel<T>(
    `has(self.${field}) == has(oldSelf.${field}) && (!has(self.${field}) || self.${field} == oldSelf.${field})`,
    `spec.${field} is immutable`,
    { fieldPath: `.${field}`, reason: "FieldValueForbidden" },
  );

const NVMePartitionSpecBaseSchema = v.pipe(
  v.object({
    sizeBytes: v.pipe(
      positiveBytes("Requested capacity in bytes; may grow (volume expansion), never shrink."),
      cel("self >= oldSelf", "spec.sizeBytes may not shrink"),
    ),
    nodeName: v.optional(
      name(
        "Storage node chosen by placement; empty until placed, immutable once set. On a replicated volume (spec.replicas > 1): the node serving it (the manager's choice among its current copies), which moves on failover.",
      ),
    ),
    deviceSerial: v.optional(
      str(
        "Serial of the parent NVMeDevice chosen by placement; empty until placed, immutable once set.",
        256,
        1,
      ),
    ),
    claimRef: v.optional(
      v.pipe(ClaimRefSchema, v.description("The NVMeDeviceClaim that authorized placement on the device.")),
    ),
    backend: v.optional(v.pipe(BackendSchema, immutable("spec.backend")), "spdk"),
    volumeManager: v.optional(v.pipe(VolumeManagerSchema, immutable("spec.volumeManager")), "partition"),
    targetOptions: v.optional(TargetOptionsSchema),
    topology: v.optional(TopologyRequirementSchema),
    contentSource: v.optional(ContentSourceSchema),
    qos: v.optional(QosLimitsSchema),
    thinProvisioning: v.optional(
      v.pipe(
        v.boolean(),
        v.description(
          "Thin lvol (spdk backend): clusters are allocated on first write, and placement reserves the size against the drive's overcommit budget (NVMeDeviceClaim spec.overcommitRatio) instead of its physical capacity. Writes fail once the lvstore has no free cluster. Absent or false: thick. Immutable.",
        ),
      ),
    ),
    replicas: v.optional(ReplicaCountSchema),
    replicaTopologyKey: v.optional(TopologyKeySchema),
    replicaOf: v.optional(ReplicaOfSchema),
    failoverAfterSeconds: v.optional(FailoverAfterSchema),
  }),
  // The serving node of a replicated volume moves on failover; a drive's partition never moves.
  cel(
    "(has(self.replicas) && self.replicas > 1) || !has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",
    "spec.nodeName is immutable once set",
    { fieldPath: ".nodeName", reason: "FieldValueForbidden" },
  ),
  immutableOnceSet("spec", "contentSource"),
  immutableOnceSet("spec", "deviceSerial"),
  cel(
    "has(self.targetOptions) == has(oldSelf.targetOptions) && (!has(self.targetOptions) || self.targetOptions == oldSelf.targetOptions)",
    "spec.targetOptions is immutable",
    { fieldPath: ".targetOptions", reason: "FieldValueForbidden" },
  ),
  v.forward(
    v.partialCheck(
      [["nodeName"], ["deviceSerial"], ["replicas"]],
      (s) => (s.replicas ?? 1) > 1 || (s.nodeName === undefined) === (s.deviceSerial === undefined),
      placementTogether,
    ),
    ["deviceSerial"],
  ),
  cel(
    "(has(self.replicas) && self.replicas > 1) || has(self.nodeName) == has(self.deviceSerial)",
    placementTogether,
    { fieldPath: ".deviceSerial" },
  ),
  v.forward(
    v.partialCheck(
      [["volumeManager"], ["backend"]],
      (s) => s.volumeManager !== "spdk-lvol" || s.backend === "spdk",
      lvolNeedsSpdk,
    ),
    ["volumeManager"],
  ),
  cel("self.volumeManager != 'spdk-lvol' || self.backend == 'spdk'", lvolNeedsSpdk, {
    fieldPath: ".volumeManager",
  }),
  v.forward(
    v.partialCheck(
      [["volumeManager"], ["backend"]],
      (s) => s.volumeManager !== "parted" || s.backend === "kernel",
      partedNeedsKernel,
    ),
    ["volumeManager"],
  ),
  cel("self.volumeManager != 'parted' || self.backend == 'kernel'", partedNeedsKernel, {
    fieldPath: ".volumeManager",
  }),
  v.forward(
    v.partialCheck(
      [["targetOptions", "coreMask"], ["backend"]],
      (s) => s.targetOptions?.coreMask === undefined || s.backend === "spdk",
      coreMaskNeedsSpdk,
    ),
    ["targetOptions", "coreMask"],
  ),
  cel(
    "!has(self.targetOptions) || !has(self.targetOptions.coreMask) || self.backend == 'spdk'",
    coreMaskNeedsSpdk,
    {
      fieldPath: ".targetOptions.coreMask",
    },
  ),
  v.forward(
    v.partialCheck([["qos"], ["backend"]], (s) => s.qos === undefined || s.backend === "spdk", qosNeedsSpdk),
    ["qos"],
  ),
  cel("!has(self.qos) || self.backend == 'spdk'", qosNeedsSpdk, { fieldPath: ".qos" }),
  v.forward(
    v.partialCheck(
      [["thinProvisioning"], ["backend"]],
      (s) => s.thinProvisioning !== true || s.backend === "spdk",
      thinNeedsSpdk,
    ),
    ["thinProvisioning"],
  ),
  cel("!has(self.thinProvisioning) || !self.thinProvisioning || self.backend == 'spdk'", thinNeedsSpdk, {
    fieldPath: ".thinProvisioning",
  }),
  cel(
    "has(self.thinProvisioning) == has(oldSelf.thinProvisioning) && (!has(self.thinProvisioning) || self.thinProvisioning == oldSelf.thinProvisioning)",
    "spec.thinProvisioning is immutable",
    { fieldPath: ".thinProvisioning", reason: "FieldValueForbidden" },
  ),
);

export const NVMePartitionSpecSchema = v.pipe(
  NVMePartitionSpecBaseSchema,
  v.forward(
    v.partialCheck(
      [["replicas"], ["backend"]],
      (s) => (s.replicas ?? 1) === 1 || s.backend === "spdk",
      replicasNeedSpdk,
    ),
    ["replicas"],
  ),
  cel("!has(self.replicas) || self.replicas == 1 || self.backend == 'spdk'", replicasNeedSpdk, {
    fieldPath: ".replicas",
  }),
  v.forward(
    v.partialCheck(
      [["replicas"], ["deviceSerial"]],
      (s) => (s.replicas ?? 1) === 1 || s.deviceSerial === undefined,
      replicatedNotPlaced,
    ),
    ["deviceSerial"],
  ),
  cel("!has(self.replicas) || self.replicas == 1 || !has(self.deviceSerial)", replicatedNotPlaced, {
    fieldPath: ".deviceSerial",
  }),
  v.forward(
    v.partialCheck(
      [["replicaOf"], ["replicas"]],
      (s) => s.replicaOf === undefined || (s.replicas ?? 1) === 1,
      replicaOfSingle,
    ),
    ["replicaOf"],
  ),
  cel("!has(self.replicaOf) || !has(self.replicas) || self.replicas == 1", replicaOfSingle, {
    fieldPath: ".replicaOf",
  }),
  v.forward(
    v.partialCheck(
      [["replicaTopologyKey"], ["replicas"]],
      (s) => s.replicaTopologyKey === undefined || (s.replicas ?? 1) > 1,
      spreadNeedsReplicas,
    ),
    ["replicaTopologyKey"],
  ),
  cel("!has(self.replicaTopologyKey) || (has(self.replicas) && self.replicas > 1)", spreadNeedsReplicas, {
    fieldPath: ".replicaTopologyKey",
  }),
  v.forward(
    v.partialCheck(
      [["failoverAfterSeconds"], ["replicas"]],
      (s) => s.failoverAfterSeconds === undefined || (s.replicas ?? 1) > 1,
      failoverNeedsReplicas,
    ),
    ["failoverAfterSeconds"],
  ),
  cel("!has(self.failoverAfterSeconds) || (has(self.replicas) && self.replicas > 1)", failoverNeedsReplicas, {
    fieldPath: ".failoverAfterSeconds",
  }),
  v.forward(
    v.partialCheck(
      [["contentSource"], ["replicas"]],
      (s) => s.contentSource === undefined || (s.replicas ?? 1) === 1,
      replicatedNoSource,
    ),
    ["contentSource"],
  ),
  cel("!has(self.contentSource) || !has(self.replicas) || self.replicas == 1", replicatedNoSource, {
    fieldPath: ".contentSource",
  }),
  wholeImmutable("replicas"),
  wholeImmutable("replicaTopologyKey"),
  wholeImmutable("replicaOf"),
  v.description("Requested volume and, once placed, where it lives."),
);
export type NVMePartitionSpec = v.InferOutput<typeof NVMePartitionSpecSchema>;

export const NVMePartitionStateSchema = v.pipe(
  v.picklist(["Pending", "Placed", "Provisioning", "Exported", "Deleting", "Failed"]),
  v.description(
    "Lifecycle state; conditions carry the reason for Failed and for claim-authorization refusals.",
  ),
);
export type NVMePartitionState = v.InferOutput<typeof NVMePartitionStateSchema>;

export const NVMePartitionStatusSchema = v.pipe(
  v.object({
    state: NVMePartitionStateSchema,
    externalId: v.optional(
      str(
        "Backend identity (vol-<hash of metadata.uid>); immutable once set, used for exact cleanup.",
        128,
        1,
      ),
    ),
    volumeHandle: v.optional(str("Opaque CSI volume handle; immutable once set.", 128, 1)),
    backendPath: v.optional(
      str("Exact backend volume: SPDK lvol bdev name (UUID) or kernel partition device path.", 1024, 1),
    ),
    nqn: v.optional(nqn("NQN of the exporting subsystem.")),
    portalIP: v.optional(ipAddress("status.portalIP", "Listener address initiators connect to.")),
    portalPort: v.optional(v.pipe(PortSchema, v.description("Listener service port."))),
    transport: v.optional(
      v.pipe(TransportSchema, v.description("Transport the listener serves (what nvme connect must use).")),
    ),
    portals: v.optional(
      v.pipe(
        v.array(PortalStatusSchema),
        v.maxLength(MAX_PORTALS),
        v.description(
          "Every listener the export really has (read back from the target), the primary portal first: the paths an initiator connects for multipath.",
        ),
      ),
    ),
    allocatedBytes: v.optional(int64("Bytes actually allocated by the volume manager (after rounding).")),
    capacity: v.optional(quantity("allocatedBytes as a quantity, e.g. 1Gi (agent, with allocatedBytes).")),
    qos: v.optional(AppliedQosSchema),
    dataGeneration: v.optional(
      int64(
        "Replicated volumes: the data generation, raised each time a copy stops receiving writes; a copy whose generation is lower is stale.",
        1,
      ),
    ),
    replicas: v.optional(ReplicaStatusListSchema),
    rebuildSlot: v.optional(RebuildSlotSchema),
    releasedBy: v.optional(
      name(
        "Replicated volumes, planned handover: the serving node that released the volume (its listener ANA inaccessible, its raid torn down: it takes no more writes) after storage.distort.io/handover-from named it. Written by that node's agent; the manager then fences, promotes and serves from another node, and clears it.",
      ),
    ),
    conditions: conditions("Observations, including claim-authorization and export failures."),
    observedGeneration: ObservedGenerationSchema,
  }),
  immutableOnceSet("status", "externalId"),
  immutableOnceSet("status", "volumeHandle"),
  v.description("Export state, written by the agent (and the manager for placement)."),
);
export type NVMePartitionStatus = v.InferOutput<typeof NVMePartitionStatusSchema>;

export const NVMePartitionSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("NVMePartition"),
  metadata: ObjectMetaSchema,
  spec: NVMePartitionSpecSchema,
  status: v.optional(NVMePartitionStatusSchema),
});
export type NVMePartition = v.InferOutput<typeof NVMePartitionSchema>;

export const NVMePartitionPrinterColumns: readonly PrinterColumn[] = [
  { name: "Size", type: "string", jsonPath: ".status.capacity", description: "allocated size" },
  { name: "Requested", type: "integer", jsonPath: ".spec.sizeBytes", description: "bytes", priority: 1 },
  { name: "Node", type: "string", jsonPath: ".spec.nodeName" },
  { name: "Backend", type: "string", jsonPath: ".spec.backend" },
  {
    name: "Copies",
    type: "integer",
    jsonPath: ".spec.replicas",
    description: "replicated volumes",
    priority: 1,
  },
  { name: "State", type: "string", jsonPath: ".status.state" },
  { name: "Ready", type: "string", jsonPath: '.status.conditions[?(@.type=="Ready")].status' },
  {
    name: "Reason",
    type: "string",
    jsonPath: '.status.conditions[?(@.type=="Scheduled")].reason',
    description: "why placement stands where it does (e.g. InsufficientCapacity)",
    priority: 1,
  },
  { name: "NQN", type: "string", jsonPath: ".status.nqn", priority: 1 },
  { name: "Serial", type: "string", jsonPath: ".spec.deviceSerial", priority: 1 },
  { name: "Portal", type: "string", jsonPath: ".status.portalIP", priority: 1 },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const NVMePartitionSelectableFields: readonly SelectableField[] = [
  ".spec.nodeName",
  ".spec.deviceSerial",
  ".spec.replicaOf.name",
];
