// Typed wrappers for the SPDK RPCs the agent and the DPU plugin use: each checks its params before
// sending (a bad value is refused with the key it concerns), sends them under SPDK's own names,
// parses the result with valibot, and serialises mutations of one NVMe-oF subsystem.

import * as v from "valibot";
import { StorageError } from "../errors.ts";
import type { CallOptions, SpdkRpc } from "./client.ts";
import * as P from "./params.ts";
import * as S from "./schemas.ts";

export type RpcGetMethodsParams = v.InferInput<typeof P.RpcGetMethodsParams>;
export type IobufSetOptionsParams = v.InferInput<typeof P.IobufSetOptionsParams>;
export type BdevGetBdevsParams = v.InferInput<typeof P.BdevGetBdevsParams>;
export type NvmeAttachParams = v.InferInput<typeof P.NvmeAttachParams>;
export type BdevSetQosLimitParams = v.InferInput<typeof P.BdevSetQosLimitParams>;
export type NvmeDetachPathParams = v.InferInput<typeof P.NvmeDetachPathParams>;
export type LvstoreSelector = v.InferInput<typeof P.LvstoreSelectorParams>;
export type LvstoreCreateParams = v.InferInput<typeof P.LvstoreCreateParams>;
export type LvolCreateParams = v.InferInput<typeof P.LvolCreateParams>;
export type LvolListParams = v.InferInput<typeof P.LvolListParams>;
export type ShallowCopyStartParams = v.InferInput<typeof P.ShallowCopyStartParams>;
export type AioCreateParams = v.InferInput<typeof P.AioCreateParams>;
export type NullCreateParams = v.InferInput<typeof P.NullCreateParams>;
export type TransportCreateParams = v.InferInput<typeof P.TransportCreateParams>;
export type SubsystemCreateParams = v.InferInput<typeof P.SubsystemCreateParams>;
export type NamespaceAddParams = v.InferInput<typeof P.NamespaceAddParams>;
export type ListenAddressParams = v.InferInput<typeof P.ListenAddressParams>;
export type ListenerAddParams = v.InferInput<typeof P.ListenerAddParams>;
export type ListenerRemoveParams = v.InferInput<typeof P.ListenerRemoveParams>;
export type ListenerSetAnaStateParams = v.InferInput<typeof P.ListenerSetAnaStateParams>;
export type HostAddParams = v.InferInput<typeof P.HostAddParams>;
export type KeyringFileAddParams = v.InferInput<typeof P.KeyringFileAddParams>;
export type FsdevAioCreateParams = v.InferInput<typeof P.FsdevAioCreateParams>;
export type KillSignal = v.InferInput<typeof P.KillSignalSchema>;
export type RaidCreateParams = v.InferInput<typeof P.RaidCreateParams>;
export type RaidCategory = v.InferInput<typeof P.RaidCategorySchema>;
export type RaidSetOptionsParams = v.InferInput<typeof P.RaidSetOptionsParams>;

/**
 * The serialize() key under which SpdkMethods runs every mutation of subsystem `nqn`. It is not
 * the bare NQN, so a caller may hold serialize(nqn) around a multi-call sequence (list, then
 * add) and still call these wrappers inside it without deadlocking the non-reentrant mutex.
 */
export function subsystemLockKey(nqn: string): string {
  return `nvmf-subsystem:${nqn}`;
}

type AnySchema = v.GenericSchema<unknown, unknown>;

/** Checks `input` against a params schema; StorageError("invalid") naming method and key otherwise. */
function checkParams<T extends AnySchema>(method: string, schema: T, input: unknown): v.InferOutput<T> {
  const r = v.safeParse(schema, input);
  if (r.success) return r.output;
  const issue = r.issues[0];
  const path = v.getDotPath(issue) ?? "params";
  throw new StorageError("invalid", `${method}: ${path}: ${issue.message}`, { details: { method, path } });
}

/** Parses a result; StorageError("internal") naming method and path when SPDK's reply does not fit. */
function parseResult<T extends AnySchema>(method: string, schema: T, raw: unknown): v.InferOutput<T> {
  const r = v.safeParse(schema, raw);
  if (r.success) return r.output;
  const issue = r.issues[0];
  const path = v.getDotPath(issue) ?? "<result>";
  throw new StorageError("internal", `${method}: unexpected reply from SPDK at ${path}: ${issue.message}`, {
    details: { method, path },
  });
}

/**
 * Typed SPDK RPCs over an SpdkRpc (normally an SpdkClient).
 *
 * Every method: refuses bad params with StorageError("invalid") before sending anything; rejects
 * with SpdkError (a StorageError whose kind follows classifySpdkError) when SPDK answers with an
 * error, with StorageError("internal") when the result does not have the expected shape, and with
 * the client's "timeout"/"unavailable" errors. None is idempotent on its own: SPDK's creates fail
 * with "already-exists" and its deletes with "not-found" the second time, which callers turn into
 * "done" after listing state (DESIGN: look up before create, already gone is done). Reads may run
 * concurrently; mutations of one subsystem run one at a time under subsystemLockKey(nqn).
 */
export class SpdkMethods {
  readonly #rpc: SpdkRpc;

  constructor(client: SpdkRpc) {
    this.#rpc = client;
  }

  async #call<T extends AnySchema>(
    method: string,
    params: object | undefined,
    result: T,
    opts?: CallOptions,
  ): Promise<v.InferOutput<T>> {
    const raw = await this.#rpc.call(method, params, opts);
    return parseResult(method, result, raw);
  }

  #subsystem<T>(nqn: string, fn: () => Promise<T>): Promise<T> {
    return this.#rpc.serialize(subsystemLockKey(nqn), fn);
  }

  // --- process, startup ---------------------------------------------------------------------

  /** spdk_get_version: works before and after framework init; a round trip proves readiness. */
  async spdkGetVersion(opts?: CallOptions): Promise<S.SpdkVersion> {
    return this.#call("spdk_get_version", undefined, S.VersionSchema, opts);
  }

  /** rpc_get_methods; `current: true` lists only the methods callable in the current phase. */
  async rpcGetMethods(params: RpcGetMethodsParams = {}, opts?: CallOptions): Promise<string[]> {
    const p = checkParams("rpc_get_methods", P.RpcGetMethodsParams, params);
    return this.#call("rpc_get_methods", p, S.MethodListSchema, opts);
  }

  /** framework_get_reactors: after init only (-1 before: "precondition"). */
  async frameworkGetReactors(opts?: CallOptions): Promise<S.Reactors> {
    return this.#call("framework_get_reactors", undefined, S.ReactorsSchema, opts);
  }

  /**
   * framework_start_init (--wait-for-rpc only). A second call fails with "precondition" (SPDK's
   * -1 "may only be called before framework is initialized"), which callers treat as done.
   */
  async frameworkStartInit(opts?: CallOptions): Promise<void> {
    await this.#call("framework_start_init", undefined, S.TrueResultSchema, opts);
  }

  /** framework_wait_init: resolves once the framework is initialised; idempotent. */
  async frameworkWaitInit(opts?: CallOptions): Promise<void> {
    await this.#call("framework_wait_init", undefined, S.TrueResultSchema, opts);
  }

  /**
   * nvmf_set_max_subsystems: before framework_start_init only ("precondition" after); SPDK
   * refuses a second call once a limit is set. Without it a target holds 1024 subsystems,
   * discovery included.
   */
  async nvmfSetMaxSubsystems(maxSubsystems: number, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_set_max_subsystems", P.NvmfSetMaxSubsystemsParams, {
      max_subsystems: maxSubsystems,
    });
    await this.#call("nvmf_set_max_subsystems", p, S.TrueResultSchema, opts);
  }

  /** iobuf_set_options: before framework_start_init only ("precondition" after). */
  async iobufSetOptions(params: IobufSetOptionsParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("iobuf_set_options", P.IobufSetOptionsParams, params);
    await this.#call("iobuf_set_options", p, S.TrueResultSchema, opts);
  }

  /** iobuf_get_options: absent in v25.05.1, where it fails with "unimplemented". */
  async iobufGetOptions(opts?: CallOptions): Promise<S.IobufOptions> {
    return this.#call("iobuf_get_options", undefined, S.IobufOptionsSchema, opts);
  }

  /**
   * spdk_kill_instance: asks the application to signal itself. SPDK may close the socket before
   * its reply is flushed; a connection closed by the server is taken as success, as rpc.py does.
   */
  async spdkKillInstance(sig: KillSignal = "SIGTERM", opts?: CallOptions): Promise<void> {
    const sig_name = checkParams("spdk_kill_instance", P.KillSignalSchema, sig);
    try {
      await this.#call("spdk_kill_instance", { sig_name }, S.TrueResultSchema, opts);
    } catch (err) {
      if (
        err instanceof StorageError &&
        err.kind === "unavailable" &&
        err.details.reason === "closed-by-server"
      )
        return;
      throw err;
    }
  }

  // --- bdevs ----------------------------------------------------------------------------------

  /** bdev_get_bdevs; with `name` (name or alias) an unknown bdev is "not-found" (-19). */
  async bdevGetBdevs(params: BdevGetBdevsParams = {}, opts?: CallOptions): Promise<S.Bdev[]> {
    const p = checkParams("bdev_get_bdevs", P.BdevGetBdevsParams, params);
    return this.#call("bdev_get_bdevs", p, S.BdevListSchema, opts);
  }

  /**
   * bdev_set_qos_limit: sets the named limits of one bdev (name or alias), leaving the others as
   * they are; 0 clears a limit. Idempotent. Unknown bdev: "not-found" (-19). SPDK rounds an
   * rw_ios_per_sec that is not a multiple of 1000 up: read assigned_rate_limits back for the truth.
   */
  async bdevSetQosLimit(params: BdevSetQosLimitParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("bdev_set_qos_limit", P.BdevSetQosLimitParams, params);
    await this.#call("bdev_set_qos_limit", p, S.TrueResultSchema, opts);
  }

  /**
   * bdev_nvme_attach_controller; resolves with the names of the bdevs created (`<name>n<nsid>`,
   * possibly none). Same name and path again: "already-exists" (-114). Host NQN not allowed by
   * the target: "precondition" (-5). Nothing listening: "unavailable" (-19). Takes up to about a
   * second over NVMe/TCP.
   */
  async bdevNvmeAttachController(params: NvmeAttachParams, opts?: CallOptions): Promise<string[]> {
    const p = checkParams("bdev_nvme_attach_controller", P.NvmeAttachParams, params);
    return this.#call("bdev_nvme_attach_controller", p, S.AttachResultSchema, opts);
  }

  /** bdev_nvme_detach_controller (optionally one path only); unknown name: "not-found" (-19). */
  async bdevNvmeDetachController(
    name: string,
    path: NvmeDetachPathParams = {},
    opts?: CallOptions,
  ): Promise<void> {
    const n = checkParams("bdev_nvme_detach_controller", P.NameSchema, name);
    const p = checkParams("bdev_nvme_detach_controller", P.NvmeDetachPathParams, path);
    await this.#call("bdev_nvme_detach_controller", { name: n, ...p }, S.TrueResultSchema, opts);
  }

  /** bdev_nvme_get_controllers; `[]` when there are none. */
  async bdevNvmeGetControllers(name?: string, opts?: CallOptions): Promise<S.NvmeController[]> {
    const p = checkParams("bdev_nvme_get_controllers", P.OptionalNameParams, { name });
    return this.#call("bdev_nvme_get_controllers", p, S.NvmeControllerListSchema, opts);
  }

  // --- lvol -----------------------------------------------------------------------------------

  /** bdev_lvol_get_lvstores; selecting one that does not exist is "not-found" (-19). */
  async bdevLvolGetLvstores(selector: LvstoreSelector = {}, opts?: CallOptions): Promise<S.Lvstore[]> {
    const p = checkParams("bdev_lvol_get_lvstores", P.LvstoreSelectorParams, selector);
    return this.#call("bdev_lvol_get_lvstores", p, S.LvstoreListSchema, opts);
  }

  /**
   * bdev_lvol_create_lvstore; resolves with the lvstore UUID. Name taken: "already-exists" (-17).
   * Base bdev already claimed (an lvstore on it, or exported): "precondition" (-1).
   */
  async bdevLvolCreateLvstore(params: LvstoreCreateParams, opts?: CallOptions): Promise<string> {
    const p = checkParams("bdev_lvol_create_lvstore", P.LvstoreCreateParams, params);
    return this.#call("bdev_lvol_create_lvstore", p, S.UuidResultSchema, opts);
  }

  /** bdev_lvol_delete_lvstore, with the lvols it holds; gone already: "not-found" (-19). */
  async bdevLvolDeleteLvstore(selector: LvstoreSelector, opts?: CallOptions): Promise<void> {
    const p = checkParams("bdev_lvol_delete_lvstore", P.LvstoreDeleteParams, selector);
    await this.#call("bdev_lvol_delete_lvstore", p, S.TrueResultSchema, opts);
  }

  /**
   * bdev_lvol_create; resolves with the lvol UUID, which is also its bdev name (`lvs/lvol` is
   * only an alias). Name taken: "already-exists" (-17); too big for a thick lvol: "exhausted".
   */
  async bdevLvolCreate(params: LvolCreateParams, opts?: CallOptions): Promise<string> {
    const p = checkParams("bdev_lvol_create", P.LvolCreateParams, params);
    return this.#call("bdev_lvol_create", p, S.UuidResultSchema, opts);
  }

  /**
   * bdev_lvol_delete by UUID or alias; gone already: "not-found" (-19); a snapshot with more
   * than one clone: "precondition". Hot-removes any namespace exporting it.
   */
  async bdevLvolDelete(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_lvol_delete", P.NameSchema, name);
    await this.#call("bdev_lvol_delete", { name: n }, S.TrueResultSchema, opts);
  }

  /** bdev_lvol_resize to `sizeInMib` (rounded up to the cluster size); idempotent for the same size. */
  async bdevLvolResize(name: string, sizeInMib: number, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_lvol_resize", P.NameSchema, name);
    const size_in_mib = checkParams("bdev_lvol_resize", P.PositiveSchema, sizeInMib);
    await this.#call("bdev_lvol_resize", { name: n, size_in_mib }, S.TrueResultSchema, opts);
  }

  /** bdev_lvol_snapshot; resolves with the snapshot's UUID. Name taken: "already-exists". */
  async bdevLvolSnapshot(lvolName: string, snapshotName: string, opts?: CallOptions): Promise<string> {
    const lvol_name = checkParams("bdev_lvol_snapshot", P.NameSchema, lvolName);
    const snapshot_name = checkParams("bdev_lvol_snapshot", P.NameSchema, snapshotName);
    return this.#call("bdev_lvol_snapshot", { lvol_name, snapshot_name }, S.UuidResultSchema, opts);
  }

  /** bdev_lvol_clone; resolves with the clone's UUID. Source not a snapshot: "invalid". */
  async bdevLvolClone(snapshotName: string, cloneName: string, opts?: CallOptions): Promise<string> {
    const snapshot_name = checkParams("bdev_lvol_clone", P.NameSchema, snapshotName);
    const clone_name = checkParams("bdev_lvol_clone", P.NameSchema, cloneName);
    return this.#call("bdev_lvol_clone", { snapshot_name, clone_name }, S.UuidResultSchema, opts);
  }

  /** bdev_lvol_get_lvols, optionally of one lvstore; includes degraded lvols. */
  async bdevLvolGetLvols(selector: LvolListParams = {}, opts?: CallOptions): Promise<S.Lvol[]> {
    const p = checkParams("bdev_lvol_get_lvols", P.LvolListParams, selector);
    return this.#call("bdev_lvol_get_lvols", p, S.LvolListSchema, opts);
  }

  /**
   * bdev_lvol_start_shallow_copy: starts copying the clusters `src_lvol_name` has allocated itself
   * (not its parents') to the same offsets of bdev `dst_bdev_name`, which it claims until done;
   * resolves with the id to poll with lvolCheckShallowCopy. Not idempotent: every call starts a
   * new copy (ids count up per target process and are lost with it). Unknown source or not an
   * lvol: "not-found" (-19); unknown destination: "not-found" (-32602 "No such device", which
   * still uses up an id); destination claimed by something else: "precondition" (-32602
   * "Operation not permitted"). A writable source, a too small destination or another copy of
   * the same source is accepted here and fails in the check.
   */
  async lvolStartShallowCopy(
    params: ShallowCopyStartParams,
    opts?: CallOptions,
  ): Promise<S.ShallowCopyStart> {
    const p = checkParams("bdev_lvol_start_shallow_copy", P.ShallowCopyStartParams, params);
    return this.#call("bdev_lvol_start_shallow_copy", p, S.ShallowCopyStartSchema, opts);
  }

  /**
   * bdev_lvol_check_shallow_copy: progress of a copy ("in progress", copied_clusters <
   * total_clusters), or its end: "complete", or "error" with SPDK's strerror text in `error`
   * ("Operation not permitted": the source is not read-only, i.e. not a snapshot; "Invalid
   * argument": the destination is smaller than the source or of an incompatible block size;
   * "Device or resource busy": another copy of the source runs; "Input/output error": a cluster
   * read or write failed). NOT a pure read: SPDK forgets the operation once it has reported its end, so the next check
   * of that id fails with "not-found" (-19), as an unknown id does. A caller that loses the reply
   * of the terminal check cannot ask again and must start a new copy. An unknown state string
   * in the reply is StorageError("internal").
   */
  async lvolCheckShallowCopy(operationId: number, opts?: CallOptions): Promise<S.ShallowCopyStatus> {
    const operation_id = checkParams("bdev_lvol_check_shallow_copy", P.OperationIdSchema, operationId);
    return this.#call("bdev_lvol_check_shallow_copy", { operation_id }, S.ShallowCopyStatusSchema, opts);
  }

  /** bdev_aio_create; resolves with the bdev name. Name taken: "already-exists"; no file: "not-found". */
  async bdevAioCreate(params: AioCreateParams, opts?: CallOptions): Promise<string> {
    const p = checkParams("bdev_aio_create", P.AioCreateParams, params);
    return this.#call("bdev_aio_create", p, S.NameResultSchema, opts);
  }

  /** bdev_aio_delete; gone already: "not-found" (-19). */
  async bdevAioDelete(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_aio_delete", P.NameSchema, name);
    await this.#call("bdev_aio_delete", { name: n }, S.TrueResultSchema, opts);
  }

  /** bdev_null_create; resolves with the bdev name. Name taken: "already-exists" (-17). */
  async bdevNullCreate(params: NullCreateParams, opts?: CallOptions): Promise<string> {
    const p = checkParams("bdev_null_create", P.NullCreateParams, params);
    return this.#call("bdev_null_create", p, S.NameResultSchema, opts);
  }

  /** bdev_null_delete; gone already: "not-found" (-19). */
  async bdevNullDelete(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_null_delete", P.NameSchema, name);
    await this.#call("bdev_null_delete", { name: n }, S.TrueResultSchema, opts);
  }

  // --- NVMe-oF target -------------------------------------------------------------------------

  /**
   * nvmf_create_transport. Exists already: "already-exists" (-32603); type not built in:
   * "unimplemented". v25.05.1 cannot delete a transport: create it once per process.
   */
  async nvmfCreateTransport(params: TransportCreateParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_create_transport", P.TransportCreateParams, params);
    await this.#call("nvmf_create_transport", p, S.TrueResultSchema, opts);
  }

  /** nvmf_get_transports; with `trtype` not created: "not-found" (-19). */
  async nvmfGetTransports(trtype?: string, opts?: CallOptions): Promise<S.NvmfTransport[]> {
    const p = checkParams("nvmf_get_transports", P.OptionalTrtypeParams, { trtype });
    return this.#call("nvmf_get_transports", p, S.NvmfTransportListSchema, opts);
  }

  /**
   * nvmf_create_subsystem, never allowing any host. Exists already: "already-exists" (SPDK's
   * -32603 "Unable to create subsystem"); malformed NQN: "invalid".
   */
  async nvmfCreateSubsystem(params: SubsystemCreateParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_create_subsystem", P.SubsystemCreateParams, params);
    await this.#subsystem(p.nqn, () => this.#call("nvmf_create_subsystem", p, S.TrueResultSchema, opts));
  }

  /** nvmf_delete_subsystem; gone already: "not-found" (SPDK's -32602 "Invalid parameters"). */
  async nvmfDeleteSubsystem(nqn: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("nvmf_delete_subsystem", P.NqnSchema, nqn);
    await this.#subsystem(n, () => this.#call("nvmf_delete_subsystem", { nqn: n }, S.TrueResultSchema, opts));
  }

  /**
   * nvmf_get_subsystems; without `nqn` the discovery subsystem is included. An unknown `nqn` is
   * "not-found".
   */
  async nvmfGetSubsystems(nqn?: string, opts?: CallOptions): Promise<S.NvmfSubsystem[]> {
    const n = nqn === undefined ? undefined : checkParams("nvmf_get_subsystems", P.NqnSchema, nqn);
    return this.#call("nvmf_get_subsystems", { nqn: n }, S.NvmfSubsystemListSchema, opts);
  }

  /**
   * nvmf_subsystem_add_ns; resolves with the nsid. SPDK answers a duplicate, a missing bdev and an
   * unknown subsystem alike ("Invalid parameters", classified "already-exists"): list the
   * subsystem's namespaces first.
   */
  async nvmfSubsystemAddNs(params: NamespaceAddParams, opts?: CallOptions): Promise<number> {
    const p = checkParams("nvmf_subsystem_add_ns", P.NamespaceAddParams, params);
    return this.#subsystem(p.nqn, () => this.#call("nvmf_subsystem_add_ns", p, S.NsidResultSchema, opts));
  }

  /** nvmf_subsystem_remove_ns; nsid absent: "not-found". */
  async nvmfSubsystemRemoveNs(nqn: string, nsid: number, opts?: CallOptions): Promise<void> {
    const n = checkParams("nvmf_subsystem_remove_ns", P.NqnSchema, nqn);
    const id = checkParams("nvmf_subsystem_remove_ns", P.PositiveSchema, nsid);
    await this.#subsystem(n, () =>
      this.#call("nvmf_subsystem_remove_ns", { nqn: n, nsid: id }, S.TrueResultSchema, opts),
    );
  }

  /**
   * nvmf_subsystem_add_listener. SPDK answers a duplicate listener, a missing transport and a failed
   * listen alike ("Invalid parameters", classified "already-exists"): list the listeners first.
   */
  async nvmfSubsystemAddListener(params: ListenerAddParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_subsystem_add_listener", P.ListenerAddParams, params);
    await this.#subsystem(p.nqn, () =>
      this.#call("nvmf_subsystem_add_listener", p, S.TrueResultSchema, opts),
    );
  }

  /** nvmf_subsystem_remove_listener; not present: "not-found". */
  async nvmfSubsystemRemoveListener(params: ListenerRemoveParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_subsystem_remove_listener", P.ListenerRemoveParams, params);
    await this.#subsystem(p.nqn, () =>
      this.#call("nvmf_subsystem_remove_listener", p, S.TrueResultSchema, opts),
    );
  }

  /**
   * nvmf_subsystem_listener_set_ana_state. v25.05.1 refuses (-32603 "error setting ANA state: -22",
   * classified "internal") a subsystem created without ana_reporting, an unknown listener and a
   * group beyond max_namespaces.
   */
  async nvmfSubsystemListenerSetAnaState(
    params: ListenerSetAnaStateParams,
    opts?: CallOptions,
  ): Promise<void> {
    const p = checkParams("nvmf_subsystem_listener_set_ana_state", P.ListenerSetAnaStateParams, params);
    await this.#subsystem(p.nqn, () =>
      this.#call("nvmf_subsystem_listener_set_ana_state", p, S.TrueResultSchema, opts),
    );
  }

  /** nvmf_subsystem_get_listeners; newest first in v25.05.1. */
  async nvmfSubsystemGetListeners(nqn: string, opts?: CallOptions): Promise<S.NvmfListener[]> {
    const n = checkParams("nvmf_subsystem_get_listeners", P.NqnSchema, nqn);
    return this.#call("nvmf_subsystem_get_listeners", { nqn: n }, S.NvmfListenerListSchema, opts);
  }

  /**
   * nvmf_subsystem_add_host. Already allowed: "already-exists" (SPDK's -32603 "Internal
   * error"); unknown subsystem: "not-found". A `…:uuid:` host NQN without a real UUID is refused
   * here ("invalid"), as SPDK refuses it without saying why.
   */
  async nvmfSubsystemAddHost(params: HostAddParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_subsystem_add_host", P.HostAddParams, params);
    await this.#subsystem(p.nqn, () => this.#call("nvmf_subsystem_add_host", p, S.TrueResultSchema, opts));
  }

  /**
   * nvmf_subsystem_set_keys: replaces an allowed host's DH-HMAC-CHAP key names (keyring entries
   * loaded before) for its later authentications; its connected controllers stay. Both names are
   * set at once: one left out is cleared. A host not allowed: -22 ("invalid"); a key name the
   * keyring lacks or an unknown subsystem: -32602.
   */
  async nvmfSubsystemSetKeys(params: HostAddParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("nvmf_subsystem_set_keys", P.HostAddParams, params);
    await this.#subsystem(p.nqn, () => this.#call("nvmf_subsystem_set_keys", p, S.TrueResultSchema, opts));
  }

  /** nvmf_subsystem_remove_host (disconnects that host's controllers); not listed: "not-found". */
  async nvmfSubsystemRemoveHost(nqn: string, host: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("nvmf_subsystem_remove_host", P.NqnSchema, nqn);
    const h = checkParams("nvmf_subsystem_remove_host", P.NqnSchema, host);
    await this.#subsystem(n, () =>
      this.#call("nvmf_subsystem_remove_host", { nqn: n, host: h }, S.TrueResultSchema, opts),
    );
  }

  /**
   * nvmf_subsystem_allow_any_host with `false` only: it closes a subsystem to hosts not in its
   * list (secure by default); DISTORT never opens one. Idempotent.
   */
  async nvmfSubsystemAllowAnyHost(nqn: string, allow: false, opts?: CallOptions): Promise<void> {
    const n = checkParams("nvmf_subsystem_allow_any_host", P.NqnSchema, nqn);
    const allow_any_host = checkParams("nvmf_subsystem_allow_any_host", P.AllowAnyHostSchema, allow);
    await this.#subsystem(n, () =>
      this.#call("nvmf_subsystem_allow_any_host", { nqn: n, allow_any_host }, S.TrueResultSchema, opts),
    );
  }

  /** nvmf_subsystem_get_controllers: the hosts connected now; `[]` when none. */
  async nvmfSubsystemGetControllers(nqn: string, opts?: CallOptions): Promise<S.NvmfController[]> {
    const n = checkParams("nvmf_subsystem_get_controllers", P.NqnSchema, nqn);
    return this.#call("nvmf_subsystem_get_controllers", { nqn: n }, S.NvmfControllerListSchema, opts);
  }

  // --- keyring, fsdev -------------------------------------------------------------------------

  /**
   * keyring_file_add_key: registers a key file (absolute path, mode 0600, owned by SPDK's uid,
   * else "precondition") under `name`. Name taken: "already-exists" (-17).
   */
  async keyringFileAddKey(params: KeyringFileAddParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("keyring_file_add_key", P.KeyringFileAddParams, params);
    await this.#call("keyring_file_add_key", p, S.TrueResultSchema, opts);
  }

  /** keyring_file_remove_key; unknown name: "not-found" (-126). */
  async keyringFileRemoveKey(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("keyring_file_remove_key", P.NameSchema, name);
    await this.#call("keyring_file_remove_key", { name: n }, S.TrueResultSchema, opts);
  }

  /** keyring_get_keys: names and sources of registered keys. */
  async keyringGetKeys(opts?: CallOptions): Promise<S.KeyringKey[]> {
    return this.#call("keyring_get_keys", undefined, S.KeyringKeyListSchema, opts);
  }

  /** fsdev_aio_create; resolves with the fsdev name. */
  async fsdevAioCreate(params: FsdevAioCreateParams, opts?: CallOptions): Promise<string> {
    const p = checkParams("fsdev_aio_create", P.FsdevAioCreateParams, params);
    return this.#call("fsdev_aio_create", p, S.NameResultSchema, opts);
  }

  /** fsdev_aio_delete. */
  async fsdevAioDelete(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("fsdev_aio_delete", P.NameSchema, name);
    await this.#call("fsdev_aio_delete", { name: n }, S.TrueResultSchema, opts);
  }

  // --- raid1 ----------------------------------------------------------------------------------

  /**
   * bdev_raid_create (raid1). A base bdev that does not exist is not an error: the raid waits in
   * state "configuring". Name taken: "already-exists" (-17); a base claimed elsewhere: -1.
   */
  async bdevRaidCreate(params: RaidCreateParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("bdev_raid_create", P.RaidCreateParams, params);
    await this.#call("bdev_raid_create", p, S.TrueResultSchema, opts);
  }

  /** bdev_raid_get_bdevs of one category (default all); a degraded raid is still "online". */
  async bdevRaidGetBdevs(category: RaidCategory = "all", opts?: CallOptions): Promise<S.RaidBdev[]> {
    const c = checkParams("bdev_raid_get_bdevs", P.RaidCategorySchema, category);
    return this.#call("bdev_raid_get_bdevs", { category: c }, S.RaidBdevListSchema, opts);
  }

  /** bdev_raid_delete; gone already: "not-found" (-19). Superblocks on the members stay. */
  async bdevRaidDelete(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_raid_delete", P.NameSchema, name);
    await this.#call("bdev_raid_delete", { name: n }, S.TrueResultSchema, opts);
  }

  /**
   * bdev_raid_add_base_bdev: into an empty slot of `raidBdev`, starting a rebuild onto it. No
   * empty slot: -22; a rebuild already running: -1; no such raid: -19.
   */
  async bdevRaidAddBaseBdev(raidBdev: string, baseBdev: string, opts?: CallOptions): Promise<void> {
    const raid_bdev = checkParams("bdev_raid_add_base_bdev", P.NameSchema, raidBdev);
    const base_bdev = checkParams("bdev_raid_add_base_bdev", P.NameSchema, baseBdev);
    await this.#call("bdev_raid_add_base_bdev", { raid_bdev, base_bdev }, S.TrueResultSchema, opts);
  }

  /**
   * bdev_raid_remove_base_bdev by the member's bdev name; not a member (any more): -19. Removing
   * the last member deletes the raid.
   */
  async bdevRaidRemoveBaseBdev(name: string, opts?: CallOptions): Promise<void> {
    const n = checkParams("bdev_raid_remove_base_bdev", P.NameSchema, name);
    await this.#call("bdev_raid_remove_base_bdev", { name: n }, S.TrueResultSchema, opts);
  }

  /** bdev_raid_set_options: rebuild window and bandwidth cap (0 = unlimited), at runtime. */
  async bdevRaidSetOptions(params: RaidSetOptionsParams, opts?: CallOptions): Promise<void> {
    const p = checkParams("bdev_raid_set_options", P.RaidSetOptionsParams, params);
    await this.#call("bdev_raid_set_options", p, S.TrueResultSchema, opts);
  }
}
