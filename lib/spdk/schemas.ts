// valibot schemas for the results of the SPDK RPCs DISTORT calls, shaped after real v25.05.1
// replies. Objects are loose: SPDK adds fields between releases, and unknown fields are kept.
// Only what DISTORT reads (or needs to identify an object) is required.

import * as v from "valibot";

/** Non-negative whole number. Tick counters can pass 2^53 after weeks; they stay whole floats. */
const Count = v.pipe(v.number(), v.integer(), v.minValue(0));
const Uuid = v.pipe(v.string(), v.uuid());
const Name = v.pipe(v.string(), v.minLength(1));

/** `true`, the result of most mutating RPCs. */
export const TrueResultSchema = v.literal(true);

/** A bare UUID string: bdev_lvol_create_lvstore, bdev_lvol_create, _snapshot, _clone. */
export const UuidResultSchema = Uuid;

/** A bare name string: bdev_aio_create, fsdev_aio_create. */
export const NameResultSchema = Name;

/** nvmf_subsystem_add_ns: the namespace id SPDK assigned. */
export const NsidResultSchema = v.pipe(v.number(), v.integer(), v.minValue(1));

/**
 * bdev_nvme_attach_controller: the names of the bdevs created (may be empty: an attach to a
 * subsystem without namespaces still creates a controller that needs a detach). DPF's SNAP
 * clients also accept a single string, which is normalised to a one-element list.
 */
export const AttachResultSchema = v.pipe(
  v.union([v.array(Name), Name]),
  v.transform((r): string[] => (typeof r === "string" ? [r] : r)),
);

export const VersionSchema = v.looseObject({
  version: v.string(),
  fields: v.looseObject({
    major: Count,
    minor: Count,
    patch: Count,
    suffix: v.string(),
    commit: v.optional(v.string()),
  }),
});
export type SpdkVersion = v.InferOutput<typeof VersionSchema>;

export const MethodListSchema = v.array(Name);

export const ReactorSchema = v.looseObject({
  lcore: Count,
  tid: v.optional(Count),
  busy: v.optional(v.number()),
  idle: v.optional(v.number()),
  in_interrupt: v.optional(v.boolean()),
  lw_threads: v.optional(v.array(v.looseObject({ name: v.string(), id: Count, cpumask: v.string() }))),
});
/** framework_get_reactors; `pid` exists from v24.09. The core mask is the OR of 1 << lcore. */
export const ReactorsSchema = v.looseObject({
  tick_rate: v.number(),
  pid: v.optional(Count),
  reactors: v.array(ReactorSchema),
});
export type Reactors = v.InferOutput<typeof ReactorsSchema>;

export const IobufOptionsSchema = v.looseObject({
  small_pool_count: Count,
  large_pool_count: Count,
  small_bufsize: Count,
  large_bufsize: Count,
});
export type IobufOptions = v.InferOutput<typeof IobufOptionsSchema>;

/** A transport id as SPDK prints it: trtype "TCP"/"RDMA"/"PCIe", adrfam "IPv4"… (compare case-insensitively). */
export const TransportIdSchema = v.looseObject({
  trtype: v.string(),
  adrfam: v.optional(v.string()),
  traddr: v.string(),
  trsvcid: v.optional(v.string()),
  subnqn: v.optional(v.string()),
});
export type TransportId = v.InferOutput<typeof TransportIdSchema>;

export const LvolBdevInfoSchema = v.looseObject({
  lvol_store_uuid: Uuid,
  base_bdev: v.string(),
  thin_provision: v.boolean(),
  num_allocated_clusters: v.optional(Count),
  snapshot: v.boolean(),
  clone: v.boolean(),
  base_snapshot: v.optional(v.string()),
  clones: v.optional(v.array(v.string())),
  esnap_clone: v.optional(v.boolean()),
});

export const NvmeBdevPathSchema = v.looseObject({
  trid: TransportIdSchema,
  ctrlr_data: v.optional(
    v.looseObject({
      cntlid: Count,
      model_number: v.string(),
      serial_number: v.string(),
      firmware_revision: v.optional(v.string()),
      subnqn: v.optional(v.string()),
    }),
  ),
  ns_data: v.optional(v.looseObject({ id: Count })),
});

/**
 * One bdev from bdev_get_bdevs. An lvol bdev is named by its UUID with `lvs/lvol` as alias; an
 * NVMe-oF bdev on an initiator has the remote namespace UUID as alias.
 */
export const BdevSchema = v.looseObject({
  name: Name,
  aliases: v.array(v.string()),
  product_name: v.string(),
  block_size: Count,
  num_blocks: Count,
  uuid: v.optional(Uuid),
  assigned_rate_limits: v.optional(
    v.object({
      rw_ios_per_sec: Count,
      rw_mbytes_per_sec: Count,
      r_mbytes_per_sec: Count,
      w_mbytes_per_sec: Count,
    }),
  ),
  claimed: v.optional(v.boolean()),
  claim_type: v.optional(v.string()),
  /** What the bdev's module serves natively; NVMe: unmap iff ONCS DSM, write_zeroes iff ONCS Write Zeroes. */
  supported_io_types: v.optional(
    v.looseObject({ unmap: v.optional(v.boolean()), write_zeroes: v.optional(v.boolean()) }),
  ),
  driver_specific: v.optional(
    v.looseObject({
      lvol: v.optional(LvolBdevInfoSchema),
      nvme: v.optional(v.array(NvmeBdevPathSchema)),
      aio: v.optional(v.looseObject({ filename: v.string() })),
    }),
  ),
});
export type Bdev = v.InferOutput<typeof BdevSchema>;
export const BdevListSchema = v.array(BdevSchema);

export const NvmeControllerSchema = v.looseObject({
  name: Name,
  ctrlrs: v.array(
    v.looseObject({
      state: v.optional(v.string()),
      trid: TransportIdSchema,
      cntlid: v.optional(Count),
      host: v.optional(
        v.looseObject({ nqn: v.string(), addr: v.optional(v.string()), svcid: v.optional(v.string()) }),
      ),
    }),
  ),
});
export type NvmeController = v.InferOutput<typeof NvmeControllerSchema>;
export const NvmeControllerListSchema = v.array(NvmeControllerSchema);

export const LvstoreSchema = v.looseObject({
  uuid: Uuid,
  name: Name,
  base_bdev: v.string(),
  total_data_clusters: Count,
  free_clusters: Count,
  block_size: Count,
  cluster_size: Count,
});
export type Lvstore = v.InferOutput<typeof LvstoreSchema>;
export const LvstoreListSchema = v.array(LvstoreSchema);

/** One lvol from bdev_lvol_get_lvols (degraded lvols without a bdev included). */
export const LvolSchema = v.looseObject({
  alias: v.string(),
  uuid: Uuid,
  name: Name,
  is_thin_provisioned: v.boolean(),
  is_snapshot: v.boolean(),
  is_clone: v.boolean(),
  is_esnap_clone: v.optional(v.boolean()),
  is_degraded: v.optional(v.boolean()),
  num_allocated_clusters: v.optional(Count),
  lvs: v.looseObject({ name: v.string(), uuid: Uuid }),
});
export type Lvol = v.InferOutput<typeof LvolSchema>;
export const LvolListSchema = v.array(LvolSchema);

/** bdev_lvol_start_shallow_copy: the id to poll with bdev_lvol_check_shallow_copy. */
export const ShallowCopyStartSchema = v.looseObject({
  operation_id: v.pipe(Count, v.maxValue(0xffff_ffff)),
});
export type ShallowCopyStart = v.InferOutput<typeof ShallowCopyStartSchema>;

const SHALLOW_COPY_STATES = ["in progress", "complete", "error"] as const;

/**
 * bdev_lvol_check_shallow_copy. `error` (a strerror text) comes with state "error" only. A state
 * this list does not know is refused: a caller must never mistake it for "in progress" or done.
 */
export const ShallowCopyStatusSchema = v.looseObject({
  copied_clusters: Count,
  total_clusters: Count,
  state: v.picklist(
    SHALLOW_COPY_STATES,
    (issue) => `unknown shallow copy state ${issue.received} (expected "in progress", "complete" or "error")`,
  ),
  error: v.optional(v.string()),
});
export type ShallowCopyStatus = v.InferOutput<typeof ShallowCopyStatusSchema>;

export const NvmfTransportSchema = v.looseObject({
  trtype: v.string(),
  max_queue_depth: v.optional(Count),
  max_io_qpairs_per_ctrlr: v.optional(Count),
  in_capsule_data_size: v.optional(Count),
  max_io_size: v.optional(Count),
});
export type NvmfTransport = v.InferOutput<typeof NvmfTransportSchema>;
export const NvmfTransportListSchema = v.array(NvmfTransportSchema);

export const ListenAddressSchema = v.looseObject({
  trtype: v.string(),
  adrfam: v.optional(v.string()),
  traddr: v.string(),
  trsvcid: v.optional(v.string()),
});
export type ListenAddress = v.InferOutput<typeof ListenAddressSchema>;

export const NvmfNamespaceSchema = v.looseObject({
  nsid: v.pipe(v.number(), v.integer(), v.minValue(1)),
  /** The bdev's name: for an lvol its UUID, even when it was added by alias. */
  bdev_name: v.string(),
  name: v.optional(v.string()),
  nguid: v.optional(v.string()),
  eui64: v.optional(v.string()),
  uuid: v.optional(v.string()),
  anagrpid: v.optional(Count),
});

export const NvmfHostSchema = v.looseObject({
  nqn: v.string(),
  dhchap_key: v.optional(v.string()),
  dhchap_ctrlr_key: v.optional(v.string()),
});

/** One subsystem from nvmf_get_subsystems; the discovery subsystem has no namespaces. */
export const NvmfSubsystemSchema = v.looseObject({
  nqn: v.string(),
  subtype: v.string(),
  listen_addresses: v.array(ListenAddressSchema),
  allow_any_host: v.boolean(),
  hosts: v.array(NvmfHostSchema),
  serial_number: v.optional(v.string()),
  model_number: v.optional(v.string()),
  max_namespaces: v.optional(Count),
  min_cntlid: v.optional(Count),
  max_cntlid: v.optional(Count),
  namespaces: v.optional(v.array(NvmfNamespaceSchema)),
});
export type NvmfSubsystem = v.InferOutput<typeof NvmfSubsystemSchema>;
export const NvmfSubsystemListSchema = v.array(NvmfSubsystemSchema);

/** ANA states a listener can report (SPDK's set_ana_state accepts the first three only). */
export const AnaStateSchema = v.picklist([
  "optimized",
  "non_optimized",
  "inaccessible",
  "persistent_loss",
  "change",
]);
export type AnaState = v.InferOutput<typeof AnaStateSchema>;

/**
 * One listener of nvmf_subsystem_get_listeners. `ana_states` (one entry per ANA group 1..max_namespaces)
 * is present only on a subsystem created with ana_reporting (v25.05.1).
 */
export const NvmfListenerSchema = v.looseObject({
  address: ListenAddressSchema,
  ana_states: v.optional(
    v.array(
      v.looseObject({ ana_group: v.pipe(v.number(), v.integer(), v.minValue(1)), ana_state: AnaStateSchema }),
    ),
  ),
});
export type NvmfListener = v.InferOutput<typeof NvmfListenerSchema>;
export const NvmfListenerListSchema = v.array(NvmfListenerSchema);

export const NvmfControllerSchema = v.looseObject({
  cntlid: Count,
  hostnqn: v.string(),
  hostid: v.optional(v.string()),
  num_io_qpairs: v.optional(Count),
});
export type NvmfController = v.InferOutput<typeof NvmfControllerSchema>;
export const NvmfControllerListSchema = v.array(NvmfControllerSchema);

/** keyring_get_keys: key names and where they come from; never the key material. */
export const KeyringKeySchema = v.looseObject({
  name: Name,
  module: v.optional(v.string()),
  removed: v.optional(v.boolean()),
  probed: v.optional(v.boolean()),
  refcnt: v.optional(Count),
  path: v.optional(v.string()),
});
export type KeyringKey = v.InferOutput<typeof KeyringKeySchema>;
export const KeyringKeyListSchema = v.array(KeyringKeySchema);

/** One bdev of bdev_get_iostat (by name or all): totals since registration, latencies in ticks. */
export const BdevIostatSchema = v.looseObject({
  name: Name,
  bytes_read: Count,
  num_read_ops: Count,
  bytes_written: Count,
  num_write_ops: Count,
  bytes_unmapped: v.optional(Count),
  num_unmap_ops: v.optional(Count),
  read_latency_ticks: Count,
  write_latency_ticks: Count,
  unmap_latency_ticks: v.optional(Count),
});
export type BdevIostat = v.InferOutput<typeof BdevIostatSchema>;
/** bdev_get_iostat without per_channel: the tick rate that converts latency ticks to seconds. */
export const IostatSchema = v.looseObject({
  tick_rate: v.pipe(v.number(), v.minValue(1)),
  ticks: Count,
  bdevs: v.array(BdevIostatSchema),
});
export type Iostat = v.InferOutput<typeof IostatSchema>;

/** thread_get_stats: busy and idle ticks per SPDK thread. */
export const ThreadStatsSchema = v.looseObject({
  tick_rate: v.pipe(v.number(), v.minValue(1)),
  threads: v.array(
    v.looseObject({ name: v.string(), id: Count, cpumask: v.string(), busy: Count, idle: Count }),
  ),
});
export type ThreadStats = v.InferOutput<typeof ThreadStatsSchema>;

/** One base_bdevs_list slot; a failed or removed member has name null and an all-zero uuid. */
export const RaidBaseBdevSchema = v.looseObject({
  name: v.nullable(v.string()),
  uuid: Uuid,
  is_configured: v.boolean(),
  data_offset: Count,
  data_size: Count,
});

/** A running background process (a rebuild onto `target`). */
export const RaidProcessSchema = v.looseObject({
  type: v.string(),
  target: v.string(),
  progress: v.looseObject({ blocks: Count, percent: Count }),
});

/** The raid object of bdev_get_bdevs driver_specific.raid (no name). */
export const RaidInfoSchema = v.looseObject({
  uuid: Uuid,
  strip_size_kb: Count,
  state: v.picklist(["online", "configuring", "offline"]),
  raid_level: v.string(),
  superblock: v.boolean(),
  num_base_bdevs: Count,
  num_base_bdevs_discovered: Count,
  num_base_bdevs_operational: Count,
  process: v.optional(RaidProcessSchema),
  base_bdevs_list: v.array(RaidBaseBdevSchema),
});

/**
 * One bdev_raid_get_bdevs entry. SPDK prints "uuid" twice with the same value; a JSON parser
 * keeps one, which is all DISTORT reads.
 */
export const RaidBdevSchema = v.looseObject({ name: Name, ...RaidInfoSchema.entries });
export type RaidBdev = v.InferOutput<typeof RaidBdevSchema>;
export const RaidBdevListSchema = v.array(RaidBdevSchema);
