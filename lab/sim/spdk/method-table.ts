// The shape of an emulated RPC method (name, the framework states it may run in, its handler) and
// nvmf_tgt v25.05.1's method registration order, which rpc_get_methods reports.
import type { JsonValue } from "./json-stream.ts";

/** SPDK's RPC state machine: STARTUP until framework_start_init completes, then RUNTIME. */
export type RpcState = "startup" | "runtime";

/** What a handler receives: params as sent (undefined when absent or null). */
export interface RpcRequest {
  readonly method: string;
  readonly params: JsonValue | undefined;
  /** Some object inside params repeats a key; SPDK's object decoder rejects such params. */
  readonly duplicateKeys: boolean;
}

/** Services the RPC server offers a running handler. */
export interface RpcContext {
  /**
   * Marks the point where an asynchronous SPDK method stops running inline (a subsystem pause, a
   * blobstore metadata write, a fabric connect...). Replies of synchronous requests that arrived
   * in the same read are sent before this resolves. Never resolves when the emulator crashes or
   * stops meanwhile, so a half-done operation is neither applied nor answered.
   */
  defer(): Promise<void>;
}

/**
 * One emulated method. `handler` returns the JSON `result` (synchronously for SPDK's synchronous
 * methods, as a promise for asynchronous ones) or throws RpcError for an error reply.
 */
export interface MethodSpec {
  readonly name: string;
  readonly states: readonly RpcState[];
  readonly handler: (req: RpcRequest, ctx: RpcContext) => unknown;
}

/** Both states, for methods SPDK registers with SPDK_RPC_STARTUP | SPDK_RPC_RUNTIME. */
export const ANY_STATE: readonly RpcState[] = ["startup", "runtime"];
/** SPDK_RPC_RUNTIME only, the registration of most methods. */
export const RUNTIME: readonly RpcState[] = ["runtime"];
/** SPDK_RPC_STARTUP only: options that must be set before framework_start_init. */
export const STARTUP: readonly RpcState[] = ["startup"];

/**
 * Every method nvmf_tgt v25.05.1 lists in rpc_get_methods, in its order (a real target's answer).
 * The emulator reports the subset it implements in this order; a method it does not implement is
 * "Method not found", exactly as an absent one on a real target.
 */
export const NVMF_TGT_METHOD_ORDER: readonly string[] = [
  "bdev_malloc_delete",
  "bdev_malloc_create",
  "bdev_null_resize",
  "bdev_null_delete",
  "bdev_null_create",
  "bdev_opal_new_user",
  "bdev_opal_set_lock_state",
  "bdev_opal_delete",
  "bdev_opal_get_info",
  "bdev_opal_create",
  "bdev_nvme_opal_revert",
  "bdev_nvme_opal_init",
  "bdev_nvme_send_cmd",
  "bdev_nvme_set_keys",
  "bdev_nvme_get_path_iostat",
  "bdev_nvme_get_mdns_discovery_info",
  "bdev_nvme_stop_mdns_discovery",
  "bdev_nvme_start_mdns_discovery",
  "bdev_nvme_set_multipath_policy",
  "bdev_nvme_set_preferred_path",
  "bdev_nvme_get_io_paths",
  "bdev_nvme_remove_error_injection",
  "bdev_nvme_add_error_injection",
  "bdev_nvme_get_discovery_info",
  "bdev_nvme_stop_discovery",
  "bdev_nvme_start_discovery",
  "bdev_nvme_get_controller_health_info",
  "bdev_nvme_disable_controller",
  "bdev_nvme_enable_controller",
  "bdev_nvme_reset_controller",
  "bdev_nvme_get_transport_statistics",
  "bdev_nvme_apply_firmware",
  "bdev_nvme_detach_controller",
  "bdev_nvme_get_controllers",
  "bdev_nvme_attach_controller",
  "bdev_nvme_set_hotplug",
  "bdev_nvme_set_options",
  "bdev_passthru_delete",
  "bdev_passthru_create",
  "bdev_lvol_set_parent_bdev",
  "bdev_lvol_set_parent",
  "bdev_lvol_check_shallow_copy",
  "bdev_lvol_start_shallow_copy",
  "bdev_lvol_grow_lvstore",
  "bdev_lvol_get_lvols",
  "bdev_lvol_get_lvstores",
  "bdev_lvol_delete",
  "bdev_lvol_set_read_only",
  "bdev_lvol_resize",
  "bdev_lvol_decouple_parent",
  "bdev_lvol_inflate",
  "bdev_lvol_rename",
  "bdev_lvol_clone_bdev",
  "bdev_lvol_clone",
  "bdev_lvol_snapshot",
  "bdev_lvol_create",
  "bdev_lvol_delete_lvstore",
  "bdev_lvol_rename_lvstore",
  "bdev_lvol_create_lvstore",
  "bdev_raid_set_options",
  "bdev_raid_remove_base_bdev",
  "bdev_raid_add_base_bdev",
  "bdev_raid_delete",
  "bdev_raid_create",
  "bdev_raid_get_bdevs",
  "bdev_error_inject_error",
  "bdev_error_delete",
  "bdev_error_create",
  "bdev_split_delete",
  "bdev_split_create",
  "bdev_delay_delete",
  "bdev_delay_create",
  "bdev_delay_update_latency",
  "bdev_zone_block_delete",
  "bdev_zone_block_create",
  "blobfs_create",
  "blobfs_detect",
  "blobfs_set_cache_size",
  "bdev_aio_delete",
  "bdev_aio_rescan",
  "bdev_aio_create",
  "bdev_ftl_set_property",
  "bdev_ftl_get_properties",
  "bdev_ftl_get_stats",
  "bdev_ftl_unmap",
  "bdev_ftl_unload",
  "bdev_ftl_delete",
  "bdev_ftl_load",
  "bdev_ftl_create",
  "accel_error_inject_error",
  "ioat_scan_accel_module",
  "keyring_file_remove_key",
  "keyring_file_add_key",
  "keyring_linux_set_options",
  "fsdev_aio_delete",
  "fsdev_aio_create",
  "fsdev_set_opts",
  "fsdev_get_opts",
  "nvmf_set_crdt",
  "nvmf_set_config",
  "nvmf_set_max_subsystems",
  "nvmf_stop_mdns_prr",
  "nvmf_publish_mdns_prr",
  "nvmf_subsystem_get_listeners",
  "nvmf_subsystem_get_qpairs",
  "nvmf_subsystem_get_controllers",
  "nvmf_get_stats",
  "nvmf_get_transports",
  "nvmf_create_transport",
  "nvmf_get_targets",
  "nvmf_delete_target",
  "nvmf_create_target",
  "nvmf_subsystem_allow_any_host",
  "nvmf_subsystem_set_keys",
  "nvmf_subsystem_remove_host",
  "nvmf_subsystem_add_host",
  "nvmf_ns_remove_host",
  "nvmf_ns_add_host",
  "nvmf_subsystem_remove_ns",
  "nvmf_subsystem_set_ns_ana_group",
  "nvmf_subsystem_add_ns",
  "nvmf_subsystem_listener_set_ana_state",
  "nvmf_discovery_get_referrals",
  "nvmf_discovery_remove_referral",
  "nvmf_discovery_add_referral",
  "nvmf_subsystem_remove_listener",
  "nvmf_subsystem_add_listener",
  "nvmf_delete_subsystem",
  "nvmf_create_subsystem",
  "nvmf_get_subsystems",
  "thread_set_cpumask",
  "scheduler_set_options",
  "framework_get_governor",
  "framework_get_scheduler",
  "framework_set_scheduler",
  "framework_get_reactors",
  "thread_get_io_channels",
  "thread_get_pollers",
  "thread_get_stats",
  "framework_monitor_context_switch",
  "spdk_kill_instance",
  "log_enable_timestamps",
  "log_get_flags",
  "log_clear_flag",
  "log_set_flag",
  "log_get_level",
  "log_set_level",
  "log_get_print_level",
  "log_set_print_level",
  "framework_enable_cpumask_locks",
  "framework_disable_cpumask_locks",
  "framework_wait_init",
  "framework_start_init",
  "env_dpdk_get_mem_stats",
  "nbd_get_disks",
  "nbd_stop_disk",
  "nbd_start_disk",
  "bdev_get_histogram",
  "bdev_enable_histogram",
  "bdev_set_qos_limit",
  "bdev_set_qd_sampling_period",
  "bdev_get_bdevs",
  "bdev_reset_iostat",
  "bdev_get_iostat",
  "bdev_examine",
  "bdev_wait_for_examine",
  "bdev_set_options",
  "notify_get_notifications",
  "notify_get_types",
  "accel_get_stats",
  "accel_set_options",
  "accel_set_driver",
  "accel_crypto_key_destroy",
  "accel_crypto_keys_get",
  "accel_crypto_key_create",
  "accel_assign_opc",
  "accel_get_module_info",
  "accel_get_opc_assignments",
  "vmd_rescan",
  "vmd_remove_device",
  "vmd_enable",
  "sock_get_default_impl",
  "sock_set_default_impl",
  "sock_impl_set_options",
  "sock_impl_get_options",
  "iobuf_get_stats",
  "iobuf_set_options",
  "framework_get_pci_devices",
  "framework_get_config",
  "framework_get_subsystems",
  "trace_get_info",
  "trace_get_tpoint_group_mask",
  "trace_disable_tpoint_group",
  "trace_enable_tpoint_group",
  "trace_clear_tpoint_mask",
  "trace_set_tpoint_mask",
  "keyring_get_keys",
  "spdk_get_version",
  "rpc_get_methods",
];
