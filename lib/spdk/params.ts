// valibot schemas for the params DISTORT sends to SPDK. Keys are SPDK's own parameter names, sent
// verbatim, so a wrapper's input reads like SPDK's documentation. Objects are strict: SPDK's decoder
// fails on an unknown key, and refusing it here names the key instead of "decode failed".

import * as v from "valibot";
import { MAX_NQN_BYTES, nqnProblem, UUID_NQN_PREFIX } from "./nqn.ts";

/** Any SPDK object name (bdev, lvol, alias, controller, key): a non-empty string. */
export const NameSchema = v.pipe(v.string(), v.minLength(1, "must not be empty"));
const Name = NameSchema;
const U32 = v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(0xffff_ffff));
/** A whole number 1..2^32-1: sizes in MiB, nsids, counts. */
export const PositiveSchema = v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(0xffff_ffff));
const Positive = PositiveSchema;
const Uuid = v.pipe(v.string(), v.uuid("must be a UUID"));
const AbsolutePath = v.pipe(Name, v.startsWith("/", "must be an absolute path"));

/** A subsystem NQN. Its syntax is left to SPDK, which names the NQN in its reply. */
export const NqnSchema = v.pipe(
  v.string(),
  v.minLength(1, "must not be empty"),
  v.check((s) => Buffer.byteLength(s) <= MAX_NQN_BYTES, `must be at most ${MAX_NQN_BYTES} bytes`),
);

/**
 * A host NQN to allow on a subsystem. SPDK v25.05.1 answers a `…:uuid:` host NQN without a real
 * UUID with a bare "Internal error", so it is refused here with the reason.
 */
export const HostNqnSchema = v.pipe(
  NqnSchema,
  v.rawCheck(({ dataset, addIssue }) => {
    if (!dataset.typed || !dataset.value.startsWith(UUID_NQN_PREFIX)) return;
    const problem = nqnProblem(dataset.value);
    if (problem !== undefined) addIssue({ message: problem });
  }),
);

/** NVMe/TCP or RDMA service id: a port number as a JSON string, never a number. */
const Trsvcid = v.pipe(
  v.string("must be a string (SPDK rejects a JSON number)"),
  v.regex(/^\d{1,5}$/, "must be a port number"),
);
/** SPDK matches transport types case-insensitively ("tcp", "TCP", "rdma", SNAP's "NVDA_TCP"). */
export const TrtypeSchema = Name;
const Trtype = TrtypeSchema;
const Adrfam = v.pipe(
  v.string(),
  v.regex(/^(ipv4|ipv6|ib|fc|intra_host)$/i, "must be ipv4, ipv6, ib, fc or intra_host"),
);
const Nguid = v.pipe(v.string(), v.regex(/^[0-9a-f]{32}$/i, "must be 32 hexadecimal digits"));
const Eui64 = v.pipe(v.string(), v.regex(/^[0-9a-f]{16}$/i, "must be 16 hexadecimal digits"));
/** SPDK limits: serial number 20, model number 40 printable ASCII characters. */
const Serial = v.pipe(v.string(), v.regex(/^[\x20-\x7e]{1,20}$/, "must be 1-20 printable ASCII characters"));
const Model = v.pipe(v.string(), v.regex(/^[\x20-\x7e]{1,40}$/, "must be 1-40 printable ASCII characters"));

/** Counts the keys of `o` that are set; for "one of" rules SPDK checks only after decoding. */
function given(o: Record<string, unknown>, keys: readonly string[]): number {
  return keys.filter((k) => o[k] !== undefined).length;
}

export const OptionalNameParams = v.strictObject({ name: v.optional(Name) });
export const OptionalTrtypeParams = v.strictObject({ trtype: v.optional(Trtype) });
/** nvmf_subsystem_allow_any_host: DISTORT only ever closes a subsystem. */
export const AllowAnyHostSchema = v.literal(false, "DISTORT never lets a subsystem allow any host");

export const RpcGetMethodsParams = v.strictObject({
  current: v.optional(v.boolean()),
  include_aliases: v.optional(v.boolean()),
});

/** STARTUP-only: the subsystems the target can hold (SPDK's default is 1024, discovery included). */
export const NvmfSetMaxSubsystemsParams = v.strictObject({
  max_subsystems: v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(0xffffffff)),
});

/** STARTUP-only (before framework_start_init). */
export const IobufSetOptionsParams = v.strictObject({
  small_pool_count: v.optional(Positive),
  large_pool_count: v.optional(Positive),
  small_bufsize: v.optional(Positive),
  large_bufsize: v.optional(Positive),
});

export const BdevGetBdevsParams = v.strictObject({
  name: v.optional(Name),
  /** Milliseconds to wait for the bdev to appear. */
  timeout: v.optional(U32),
});

/** A QoS limit: SPDK decodes a uint64 and refuses fractions, negatives and strings. */
const QosLimit = v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(Number.MAX_SAFE_INTEGER));

/**
 * bdev_set_qos_limit: at least one limit (SPDK: -22 "No rate limits specified"). A limit left out
 * keeps its value on the bdev; 0 clears it. rw_ios_per_sec not a multiple of 1000 is rounded up by
 * SPDK, silently to the caller.
 */
export const BdevSetQosLimitParams = v.pipe(
  v.strictObject({
    name: Name,
    rw_ios_per_sec: v.optional(QosLimit),
    rw_mbytes_per_sec: v.optional(QosLimit),
    r_mbytes_per_sec: v.optional(QosLimit),
    w_mbytes_per_sec: v.optional(QosLimit),
  }),
  v.check(
    (p) =>
      p.rw_ios_per_sec !== undefined ||
      p.rw_mbytes_per_sec !== undefined ||
      p.r_mbytes_per_sec !== undefined ||
      p.w_mbytes_per_sec !== undefined,
    "at least one rate limit is required",
  ),
);

export const NvmeAttachParams = v.strictObject({
  name: Name,
  trtype: Trtype,
  traddr: Name,
  adrfam: v.optional(Adrfam),
  trsvcid: v.optional(Trsvcid),
  subnqn: v.optional(NqnSchema),
  hostnqn: v.optional(NqnSchema),
  /** Keyring key names (keyring_file_add_key), not secrets. */
  dhchap_key: v.optional(Name),
  dhchap_ctrlr_key: v.optional(Name),
  ctrlr_loss_timeout_sec: v.optional(v.pipe(v.number(), v.integer(), v.minValue(-1))),
  reconnect_delay_sec: v.optional(U32),
  fast_io_fail_timeout_sec: v.optional(U32),
  multipath: v.optional(v.picklist(["disable", "failover", "multipath"])),
});

/** Optional path filter for a detach: only the matching path goes, the last one takes the controller. */
export const NvmeDetachPathParams = v.strictObject({
  trtype: v.optional(Trtype),
  traddr: v.optional(Name),
  adrfam: v.optional(Adrfam),
  trsvcid: v.optional(Trsvcid),
  subnqn: v.optional(NqnSchema),
});

export const LvstoreSelectorParams = v.pipe(
  v.strictObject({ uuid: v.optional(Uuid), lvs_name: v.optional(Name) }),
  v.check((o) => given(o, ["uuid", "lvs_name"]) <= 1, "give at most one of uuid, lvs_name"),
);
export const LvstoreDeleteParams = v.pipe(
  v.strictObject({ uuid: v.optional(Uuid), lvs_name: v.optional(Name) }),
  v.check((o) => given(o, ["uuid", "lvs_name"]) === 1, "give exactly one of uuid, lvs_name"),
);

export const LvstoreCreateParams = v.strictObject({
  bdev_name: Name,
  lvs_name: v.pipe(Name, v.maxLength(63, "must be at most 63 characters")),
  /** Cluster size in bytes (SPDK default 4 MiB). */
  cluster_sz: v.optional(Positive),
  clear_method: v.optional(v.picklist(["none", "unmap", "write_zeroes"])),
  num_md_pages_per_cluster_ratio: v.optional(Positive),
});

export const LvolCreateParams = v.pipe(
  v.strictObject({
    lvol_name: Name,
    /** Rounded up to the lvstore's cluster size by SPDK. */
    size_in_mib: Positive,
    thin_provision: v.optional(v.boolean()),
    /** The lvstore, by UUID or by name: exactly one. */
    uuid: v.optional(Uuid),
    lvs_name: v.optional(Name),
    clear_method: v.optional(v.picklist(["default", "none", "unmap", "write_zeroes"])),
  }),
  v.check((o) => given(o, ["uuid", "lvs_name"]) === 1, "give exactly one of uuid (lvstore UUID), lvs_name"),
);

export const LvolListParams = v.pipe(
  v.strictObject({ lvs_uuid: v.optional(Uuid), lvs_name: v.optional(Name) }),
  v.check((o) => given(o, ["lvs_uuid", "lvs_name"]) <= 1, "give at most one of lvs_uuid, lvs_name"),
);

/** bdev_lvol_start_shallow_copy: a snapshot (lvol bdev name or alias) onto another bdev. */
export const ShallowCopyStartParams = v.strictObject({
  src_lvol_name: Name,
  dst_bdev_name: Name,
});

/** bdev_lvol_check_shallow_copy's operation_id (SPDK decodes it as a uint32). */
export const OperationIdSchema = U32;

export const AioCreateParams = v.strictObject({
  name: Name,
  filename: AbsolutePath,
  block_size: v.optional(Positive),
  readonly: v.optional(v.boolean()),
  fallocate: v.optional(v.boolean()),
  uuid: v.optional(Uuid),
});

/** bdev_null_create: a bdev with no medium (writes dropped, reads zeros). */
export const NullCreateParams = v.strictObject({
  name: Name,
  num_blocks: Positive,
  block_size: v.pipe(
    Positive,
    v.check((n) => n % 512 === 0, "block_size must be a multiple of 512"),
  ),
  uuid: v.optional(Uuid),
});

/** Common TCP/RDMA transport options; SPDK fills in the rest. */
export const TransportCreateParams = v.strictObject({
  trtype: Trtype,
  max_queue_depth: v.optional(Positive),
  max_io_qpairs_per_ctrlr: v.optional(Positive),
  in_capsule_data_size: v.optional(U32),
  max_io_size: v.optional(Positive),
  io_unit_size: v.optional(Positive),
  max_aq_depth: v.optional(Positive),
  num_shared_buffers: v.optional(Positive),
  buf_cache_size: v.optional(U32),
  zcopy: v.optional(v.boolean()),
  abort_timeout_sec: v.optional(U32),
  ack_timeout: v.optional(U32),
  c2h_success: v.optional(v.boolean()),
  dif_insert_or_strip: v.optional(v.boolean()),
  sock_priority: v.optional(U32),
  num_cqe: v.optional(Positive),
  max_srq_depth: v.optional(Positive),
  no_srq: v.optional(v.boolean()),
  acceptor_backlog: v.optional(Positive),
  no_wr_batching: v.optional(v.boolean()),
  disable_command_passthru: v.optional(v.boolean()),
});

export const SubsystemCreateParams = v.strictObject({
  nqn: NqnSchema,
  serial_number: v.optional(Serial),
  model_number: v.optional(Model),
  max_namespaces: v.optional(Positive),
  /** Only `false` (SPDK's default): DISTORT subsystems never allow any host. */
  allow_any_host: v.optional(v.literal(false, "DISTORT never creates a subsystem that allows any host")),
  ana_reporting: v.optional(v.boolean()),
  min_cntlid: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(0xffef))),
  max_cntlid: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(0xffef))),
});

export const NamespaceAddParams = v.strictObject({
  nqn: NqnSchema,
  namespace: v.strictObject({
    /** A bdev name or alias; SPDK reports the bdev's real name (an lvol's UUID) afterwards. */
    bdev_name: Name,
    /** Absent: SPDK picks the lowest free nsid. */
    nsid: v.optional(Positive),
    nguid: v.optional(Nguid),
    eui64: v.optional(Eui64),
    uuid: v.optional(Uuid),
    anagrpid: v.optional(Positive),
    no_auto_visible: v.optional(v.boolean()),
    hide_metadata: v.optional(v.boolean()),
  }),
});

export const ListenAddressParams = v.strictObject({
  trtype: Trtype,
  /** SPDK defaults to IPv4 for TCP and RDMA. */
  adrfam: v.optional(Adrfam),
  traddr: Name,
  trsvcid: v.optional(Trsvcid),
});

export const ListenerAddParams = v.strictObject({
  nqn: NqnSchema,
  listen_address: ListenAddressParams,
  secure_channel: v.optional(v.boolean()),
  ana_state: v.optional(v.picklist(["optimized", "non_optimized", "inaccessible"])),
});

export const ListenerSetAnaStateParams = v.strictObject({
  nqn: NqnSchema,
  listen_address: ListenAddressParams,
  ana_state: v.picklist(["optimized", "non_optimized", "inaccessible"]),
  /** 0 or absent: every ANA group of the listener. */
  anagrpid: v.optional(v.pipe(v.number(), v.integer(), v.minValue(0))),
});

export const ListenerRemoveParams = v.strictObject({
  nqn: NqnSchema,
  listen_address: ListenAddressParams,
});

export const HostAddParams = v.strictObject({
  nqn: NqnSchema,
  host: HostNqnSchema,
  /** Keyring key names for DH-HMAC-CHAP (v24.05+), not secrets. */
  dhchap_key: v.optional(Name),
  dhchap_ctrlr_key: v.optional(Name),
  /** Keyring key name of the host's TLS PSK (interchange file; v24.09+), not the PSK. */
  psk: v.optional(Name),
});

export const KeyringFileAddParams = v.strictObject({
  name: Name,
  /** SPDK wants an absolute path to a 0600 file owned by its own uid. */
  path: AbsolutePath,
});

export const FsdevAioCreateParams = v.strictObject({
  name: Name,
  root_path: AbsolutePath,
  enable_xattr: v.optional(v.boolean()),
  enable_writeback_cache: v.optional(v.boolean()),
  max_write: v.optional(Positive),
});

export const KillSignalSchema = v.picklist(["SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGKILL", "SIGUSR1"]);

/** bdev_raid_create, raid1 only (the level DISTORT replicates with; raid1 takes no strip size). */
export const RaidCreateParams = v.strictObject({
  name: Name,
  raid_level: v.literal("raid1", "DISTORT creates raid1 only"),
  strip_size_kb: v.optional(v.literal(0, "raid1 takes no strip size")),
  base_bdevs: v.pipe(v.array(Name), v.minLength(2, "raid1 needs at least 2 base bdevs")),
  superblock: v.optional(v.boolean()),
  uuid: v.optional(v.pipe(v.string(), v.uuid())),
});

/** bdev_raid_get_bdevs: category is required by SPDK. */
export const RaidCategorySchema = v.picklist(["all", "online", "configuring", "offline"]);

/** bdev_raid_set_options; a zero window is refused by SPDK (-22). */
export const RaidSetOptionsParams = v.strictObject({
  process_window_size_kb: v.optional(PositiveSchema),
  process_max_bandwidth_mb_sec: v.optional(U32),
});
