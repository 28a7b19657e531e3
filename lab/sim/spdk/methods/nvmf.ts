// nvmf_* methods: transports, subsystems, namespaces, listeners, host ACLs, controllers and
// stats, with v25.05.1's error answers (-32602 "Invalid parameters" for most failures, -32603
// for duplicate subsystems/transports/hosts and invalid host NQNs).
import * as v from "valibot";
import { isInterchangePsk } from "../../../../lib/nvme/tls-psk.ts";
import type { App } from "../app.ts";
import { TICK_RATE } from "../core-mask.ts";
import type { JsonValue } from "../json-stream.ts";
import { type MethodSpec, RUNTIME, STARTUP } from "../method-table.ts";
import { DISCOVERY_NQN, isValidNqn } from "../nqn.ts";
import {
  type Adrfam,
  type ListenAddress,
  Subsystem,
  TargetError,
  type TransportOpts,
  type Trtype,
} from "../nvmf-target.ts";
import { bool, decode, decodeOptional, INVALID_PARAMS, i32, str, u16, u32, u64 } from "../params.ts";
import { Errno, ErrnoError, RpcCode, RpcError } from "../rpc-error.ts";

/** The target every RPC addresses when tgt_name is absent. */
const TARGET_NAME = "nvmf_tgt";
const MAX_CNTLID = 0xffef;

const printable = (max: number) =>
  v.pipe(
    v.string(),
    v.maxLength(max),
    v.check((s) => /^[\x20-\x7e]*$/.test(s)),
  );

const ListenAddressSchema = v.strictObject({
  trtype: str,
  adrfam: v.optional(str),
  traddr: str,
  trsvcid: v.optional(str),
});

const ADRFAM: Readonly<Record<string, Adrfam>> = {
  ipv4: "IPv4",
  ipv6: "IPv6",
  ib: "IB",
  fc: "FC",
  intra_host: "INTRA_HOST",
};

const hex = (n: number) => v.pipe(v.string(), v.regex(new RegExp(`^[0-9a-fA-F]{${n}}$`)));
const uuidStr = v.pipe(
  v.string(),
  v.regex(/^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/),
);

/** The nvmf methods of `app`. */
export function nvmfMethods(app: App): MethodSpec[] {
  const { target } = app;
  const built = new Set(app.config.transports);

  const checkTarget = (name: string | undefined) => {
    if (name !== undefined && name !== TARGET_NAME) {
      throw new RpcError(RpcCode.internalError, "Unable to find a target.");
    }
  };
  /** spdk_nvmf_tgt_find_subsystem, which also knows "discovery" as a shortcut. */
  const find = (nqn: string): Subsystem | undefined =>
    target.subsystem(nqn === "discovery" ? DISCOVERY_NQN : nqn);
  const findOrInvalid = (nqn: string): Subsystem => {
    const s = find(nqn);
    if (!s) throw RpcError.invalidParams();
    return s;
  };
  /** rpc_listen_address_to_trid; undefined when SPDK would reject the address. */
  const toAddress = (a: v.InferOutput<typeof ListenAddressSchema>): ListenAddress | undefined => {
    const t = a.trtype.toUpperCase();
    if (t !== "TCP" && t !== "RDMA") return undefined;
    let adrfam: Adrfam = "IPv4";
    if (a.adrfam !== undefined) {
      const f = ADRFAM[a.adrfam.toLowerCase()];
      if (!f) return undefined;
      adrfam = f;
    }
    if (a.traddr.length > 255 || (a.trsvcid?.length ?? 0) > 32) return undefined;
    return { trtype: t, adrfam, traddr: a.traddr, trsvcid: a.trsvcid ?? "" };
  };
  /** Runs a paused-subsystem step: TargetError becomes -32602 "Invalid parameters". */
  const invalidOnFailure = async <T>(fn: () => T | Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof TargetError) throw RpcError.invalidParams();
      if (err instanceof ErrnoError) throw RpcError.invalidParams();
      throw err;
    }
  };

  return [
    {
      name: "nvmf_create_transport",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.looseObject({
            trtype: str,
            tgt_name: v.optional(str),
            max_queue_depth: v.optional(u16),
            max_io_qpairs_per_ctrlr: v.optional(u16),
            in_capsule_data_size: v.optional(u32),
            max_io_size: v.optional(u32),
            io_unit_size: v.optional(u32),
            max_aq_depth: v.optional(u32),
            num_shared_buffers: v.optional(u32),
            buf_cache_size: v.optional(u32),
            dif_insert_or_strip: v.optional(bool),
            abort_timeout_sec: v.optional(u32),
            zcopy: v.optional(bool),
            acceptor_poll_rate: v.optional(u32),
            ack_timeout: v.optional(u32),
            data_wr_pool_size: v.optional(u32),
            disable_command_passthru: v.optional(bool),
            kas: v.optional(u16),
            min_kato: v.optional(u32),
            c2h_success: v.optional(bool),
            sock_priority: v.optional(u32),
            control_msg_num: v.optional(u32),
            max_srq_depth: v.optional(u32),
            no_srq: v.optional(bool),
            num_cqe: v.optional(i32),
            acceptor_backlog: v.optional(i32),
            no_wr_batching: v.optional(bool),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const t = p.trtype.toUpperCase();
        if ((t !== "TCP" && t !== "RDMA") || !built.has(t)) {
          throw new RpcError(RpcCode.invalidParams, `Invalid transport type '${p.trtype}'`);
        }
        if (target.transports.has(t)) {
          throw new RpcError(RpcCode.internalError, `Transport type '${p.trtype}' already exists`);
        }
        await ctx.defer();
        if (target.transports.has(t)) {
          throw new RpcError(RpcCode.internalError, `Transport type '${p.trtype}' already exists`);
        }
        target.transports.set(t, transportOpts(t, p));
        return true;
      },
    },
    {
      name: "nvmf_get_transports",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ trtype: v.optional(str), tgt_name: v.optional(str) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        if (p.trtype !== undefined) {
          const opts = target.transports.get(p.trtype.toUpperCase() as Trtype);
          if (!opts) throw RpcError.errno(Errno.ENODEV);
          return [opts];
        }
        return [...target.transports.values()];
      },
    },
    {
      // STARTUP only; a second call with a non-zero value in place is refused (nvmf_rpc.c).
      name: "nvmf_set_max_subsystems",
      states: STARTUP,
      handler: (req) => {
        if (target.maxSubsystems !== 0) {
          throw new RpcError(RpcCode.internalError, "Must not call more than once");
        }
        const p = decodeOptional(req, v.strictObject({ max_subsystems: v.optional(u32) }), INVALID_PARAMS);
        target.maxSubsystems = p.max_subsystems ?? 0;
        return true;
      },
    },
    {
      name: "nvmf_create_subsystem",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            nqn: str,
            serial_number: v.optional(printable(20)),
            model_number: v.optional(printable(40)),
            tgt_name: v.optional(str),
            max_namespaces: v.optional(u32),
            allow_any_host: v.optional(bool),
            ana_reporting: v.optional(bool),
            min_cntlid: v.optional(u16),
            max_cntlid: v.optional(u16),
            max_discard_size_kib: v.optional(u64),
            max_write_zeroes_size_kib: v.optional(u64),
            passthrough: v.optional(bool),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        if (!isValidNqn(p.nqn) || find(p.nqn) || target.full) {
          throw new RpcError(RpcCode.internalError, `Unable to create subsystem ${p.nqn}`);
        }
        const min = p.min_cntlid ?? 1;
        const max = p.max_cntlid ?? MAX_CNTLID;
        if (min < 1 || max > MAX_CNTLID || min > max) {
          throw new RpcError(RpcCode.invalidParams, `Invalid cntlid range [${min}-${max}]`);
        }
        const sub = new Subsystem(
          p.nqn,
          "NVMe",
          p.serial_number ?? "00000000000000000000",
          p.model_number ?? "SPDK bdev Controller",
          p.max_namespaces ?? 32,
          min,
          max,
          p.allow_any_host ?? false,
        );
        sub.anaReporting = p.ana_reporting ?? false;
        target.addSubsystem(sub);
        // The reply waits for the subsystem to start.
        await ctx.defer();
        return true;
      },
    },
    {
      name: "nvmf_delete_subsystem",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ nqn: str, tgt_name: v.optional(str) }), INVALID_PARAMS);
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        if (s.subtype === "Discovery") throw RpcError.invalidParams();
        await ctx.defer();
        // Deleting closes the subsystem's listeners: serialised with listener changes.
        await app.listenerLock.run(async () => {
          if (find(p.nqn) !== s) throw RpcError.invalidParams();
          await target.deleteSubsystem(s);
        });
        // The subsystem's host entries let go of their keys.
        for (const h of s.hosts) app.keyring.release(h);
        return true;
      },
    },
    {
      name: "nvmf_get_subsystems",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ nqn: v.optional(str), tgt_name: v.optional(str) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        if (p.nqn !== undefined) {
          const s = find(p.nqn);
          if (!s) throw RpcError.errno(Errno.ENODEV);
          return [subsystemJson(s)];
        }
        return target.subsystems().map(subsystemJson);
      },
    },
    {
      name: "nvmf_subsystem_add_ns",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.looseObject({
            nqn: str,
            tgt_name: v.optional(str),
            namespace: v.strictObject({
              bdev_name: str,
              nsid: v.optional(u32),
              ptpl_file: v.optional(str),
              nguid: v.optional(hex(32)),
              eui64: v.optional(hex(16)),
              uuid: v.optional(uuidStr),
              anagrpid: v.optional(u32),
              no_auto_visible: v.optional(bool),
              hide_metadata: v.optional(bool),
            }),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        await ctx.defer();
        const ns = p.namespace;
        return invalidOnFailure(() => {
          if (s.subtype !== "NVMe" || find(p.nqn) !== s) throw new TargetError("no such NVMe subsystem");
          return target.addNamespace(s, ns.bdev_name, {
            nsid: ns.nsid,
            uuid: ns.uuid?.toLowerCase(),
            nguid: ns.nguid?.toUpperCase(),
            eui64: ns.eui64?.toUpperCase(),
            anagrpid: ns.anagrpid,
          });
        });
      },
    },
    {
      name: "nvmf_subsystem_remove_ns",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ nqn: str, nsid: u32, tgt_name: v.optional(str) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        await ctx.defer();
        await invalidOnFailure(() => target.removeNamespace(s, p.nsid));
        return true;
      },
    },
    {
      name: "nvmf_subsystem_add_listener",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.looseObject({
            nqn: str,
            listen_address: ListenAddressSchema,
            tgt_name: v.optional(str),
            secure_channel: v.optional(bool),
            ana_state: v.optional(str),
            sock_impl: v.optional(str),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        const addr = toAddress(p.listen_address);
        if (!addr) throw RpcError.invalidParams();
        if (s.allowAnyHost && p.secure_channel) {
          throw new RpcError(
            RpcCode.internalError,
            "Cannot establish secure channel, when 'allow_any_host' is set",
          );
        }
        await ctx.defer();
        await app.listenerLock.run(() =>
          invalidOnFailure(async () => {
            if (!target.transports.has(addr.trtype)) throw new TargetError(`no ${addr.trtype} transport`);
            const port = Number(addr.trsvcid);
            if (!/^\d+$/.test(addr.trsvcid) || port < 1 || port > 65535) throw new TargetError("bad trsvcid");
            // spdk_nvmf_tgt_listen_ext: the transport's bind() fails with EADDRNOTAVAIL.
            if (!app.config.hasAddress(addr.traddr)) {
              throw new TargetError(`Cannot assign requested address ${addr.traddr}`);
            }
            await target.addListener(s, addr, p.secure_channel === true);
          }),
        );
        return true;
      },
    },
    {
      name: "nvmf_subsystem_remove_listener",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ nqn: str, listen_address: ListenAddressSchema, tgt_name: v.optional(str) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        const addr = toAddress(p.listen_address);
        if (!addr || !target.transports.has(addr.trtype)) throw RpcError.invalidParams();
        await ctx.defer();
        await app.listenerLock.run(() => invalidOnFailure(() => target.removeListener(s, addr)));
        return true;
      },
    },
    {
      name: "nvmf_subsystem_get_listeners",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ nqn: str, tgt_name: v.optional(str) }), INVALID_PARAMS);
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        await ctx.defer();
        return s.listeners.map((l) => {
          const states = s.anaStates(l);
          return states === undefined
            ? { address: addressJson(l) }
            : {
                address: addressJson(l),
                ana_states: states.map((st, i) => ({ ana_group: i + 1, ana_state: st })),
              };
        });
      },
    },
    {
      name: "nvmf_subsystem_listener_set_ana_state",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            nqn: str,
            listen_address: ListenAddressSchema,
            ana_state: v.picklist(["optimized", "non_optimized", "inaccessible"]),
            anagrpid: v.optional(u32),
            tgt_name: v.optional(str),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        const addr = toAddress(p.listen_address);
        if (!addr) throw RpcError.invalidParams();
        await ctx.defer();
        try {
          target.setAnaState(s, addr, p.ana_state, p.anagrpid);
        } catch (err) {
          if (err instanceof TargetError) throw new RpcError(RpcCode.internalError, err.message);
          throw err;
        }
        return true;
      },
    },
    {
      name: "nvmf_subsystem_add_host",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.looseObject({
            nqn: str,
            host: str,
            tgt_name: v.optional(str),
            dhchap_key: v.optional(str),
            dhchap_ctrlr_key: v.optional(str),
            psk: v.optional(str),
          }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        const keys = [p.dhchap_key, p.dhchap_ctrlr_key].map((k) =>
          k === undefined ? undefined : app.keyring.get(k),
        );
        if ((p.dhchap_key && !keys[0]) || (p.dhchap_ctrlr_key && !keys[1])) throw RpcError.invalidParams();
        // The TCP transport resolves a PSK by key name and derives the retained PSK from it now:
        // an unknown or malformed key fails the host add (-32603), and so does every PSK on
        // v25.05.1, whose NULL HKDF salt OpenSSL 3.0.17+ refuses ("Unable to derive retained PSK").
        const pskKey = p.psk === undefined ? undefined : app.keyring.get(p.psk);
        if (p.psk !== undefined) {
          if (!pskKey) throw RpcError.internal();
          let text: string;
          try {
            text = app.keyring.read(pskKey);
          } catch {
            throw RpcError.internal();
          }
          if (!isInterchangePsk(text) || !app.tlsPskWorks) throw RpcError.internal();
        }
        if (!isValidNqn(p.host) || s.subtype !== "NVMe") throw RpcError.internal();
        const host = {
          nqn: p.host,
          ...(p.dhchap_key ? { dhchapKey: p.dhchap_key } : {}),
          ...(p.dhchap_ctrlr_key ? { dhchapCtrlrKey: p.dhchap_ctrlr_key } : {}),
          ...(p.psk ? { psk: p.psk } : {}),
        };
        try {
          target.addHost(s, host);
        } catch (err) {
          if (err instanceof TargetError) throw RpcError.internal();
          throw err;
        }
        // The host entry holds its keys (the target reads them at each connect).
        app.keyring.hold(
          host,
          [...keys, pskKey].filter((k) => k !== undefined),
        );
        return true;
      },
    },
    {
      // rpc_nvmf_subsystem_set_keys (v25.05.1): both key names are set at once, an omitted one
      // clears that key; a controller key needs a host key; controllers already connected stay.
      name: "nvmf_subsystem_set_keys",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            nqn: str,
            host: str,
            tgt_name: v.optional(str),
            dhchap_key: v.optional(str),
            dhchap_ctrlr_key: v.optional(str),
          }),
          INVALID_PARAMS,
        );
        if (p.tgt_name !== undefined && p.tgt_name !== TARGET_NAME) {
          throw new RpcError(RpcCode.internalError, "Invalid parameters");
        }
        const s = findOrInvalid(p.nqn);
        const keys = [p.dhchap_key, p.dhchap_ctrlr_key].map((k) =>
          k === undefined ? undefined : app.keyring.get(k),
        );
        if ((p.dhchap_key && !keys[0]) || (p.dhchap_ctrlr_key && !keys[1])) throw RpcError.invalidParams();
        // spdk_nvmf_subsystem_set_keys: -EINVAL for an unknown host or a controller key alone.
        if (!s.hosts.some((h) => h.nqn === p.host)) throw RpcError.errno(22);
        if (!p.dhchap_key && p.dhchap_ctrlr_key) throw RpcError.errno(22);
        const host = {
          nqn: p.host,
          ...(p.dhchap_key ? { dhchapKey: p.dhchap_key } : {}),
          ...(p.dhchap_ctrlr_key ? { dhchapCtrlrKey: p.dhchap_ctrlr_key } : {}),
        };
        const old = target.setHostKeys(s, host);
        app.keyring.hold(
          host,
          keys.filter((k) => k !== undefined),
        );
        app.keyring.release(old);
        return true;
      },
    },
    {
      name: "nvmf_subsystem_remove_host",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ nqn: str, host: str, tgt_name: v.optional(str), timeout_ms: v.optional(u64) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        const host = s.hosts.find((h) => h.nqn === p.host);
        if (!host) throw RpcError.internal();
        target.removeHost(s, p.host);
        app.keyring.release(host);
        // Disconnecting the host's controllers completes asynchronously.
        await ctx.defer();
        return true;
      },
    },
    {
      name: "nvmf_subsystem_allow_any_host",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({ nqn: str, allow_any_host: bool, tgt_name: v.optional(str) }),
          INVALID_PARAMS,
        );
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        s.allowAnyHost = p.allow_any_host;
        return true;
      },
    },
    {
      name: "nvmf_subsystem_get_controllers",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ nqn: str, tgt_name: v.optional(str) }), INVALID_PARAMS);
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        await ctx.defer();
        return s.controllers.map((c) => ({
          cntlid: c.cntlid,
          hostnqn: c.hostnqn,
          hostid: c.hostid,
          num_io_qpairs: c.ioQpairs,
        }));
      },
    },
    {
      name: "nvmf_subsystem_get_qpairs",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ nqn: str, tgt_name: v.optional(str) }), INVALID_PARAMS);
        checkTarget(p.tgt_name);
        const s = findOrInvalid(p.nqn);
        await ctx.defer();
        return s.controllers.flatMap((c) => {
          const qpair = (qid: number) => ({
            cntlid: c.cntlid,
            qid,
            state: "enabled",
            thread: `nvmf_tgt_poll_group_${String(c.pollGroup).padStart(3, "0")}`,
            hostnqn: c.hostnqn,
            listen_address: addressJson(c.listen),
            peer_address: addressJson({ ...c.listen, traddr: c.peer.traddr, trsvcid: c.peer.trsvcid }),
          });
          return c.inflight > 0 ? [qpair(0), qpair(1)] : [qpair(0)];
        });
      },
    },
    {
      name: "nvmf_get_stats",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decodeOptional(req, v.strictObject({ tgt_name: v.optional(str) }), INVALID_PARAMS);
        checkTarget(p.tgt_name);
        // Stats are gathered by visiting every poll group thread.
        await ctx.defer();
        return {
          tick_rate: TICK_RATE,
          poll_groups: target.pollGroupStats().map((g, i) => ({
            name: `nvmf_tgt_poll_group_${String(i).padStart(3, "0")}`,
            admin_qpairs: g.adminQpairs,
            io_qpairs: g.ioQpairs,
            current_admin_qpairs: g.currentAdminQpairs,
            current_io_qpairs: g.currentIoQpairs,
            pending_bdev_io: 0,
            completed_nvme_io: g.completedNvmeIo,
            transports: [...target.transports.keys()].map((trtype) => ({ trtype })),
          })),
        };
      },
    },
  ];
}

/** nvmf_transport_listen_dump_trid. */
function addressJson(a: ListenAddress): JsonValue {
  return { trtype: a.trtype, adrfam: a.adrfam, traddr: a.traddr, trsvcid: a.trsvcid };
}

/** One nvmf_get_subsystems entry in v25.05.1's shape. */
function subsystemJson(s: Subsystem): JsonValue {
  const out: { [key: string]: JsonValue } = {
    nqn: s.nqn,
    subtype: s.subtype,
    listen_addresses: s.listeners.map(addressJson),
    allow_any_host: s.allowAnyHost,
    hosts: s.hosts.map((h) => ({
      nqn: h.nqn,
      ...(h.dhchapKey ? { dhchap_key: h.dhchapKey } : {}),
      ...(h.dhchapCtrlrKey ? { dhchap_ctrlr_key: h.dhchapCtrlrKey } : {}),
    })),
  };
  if (s.subtype === "NVMe") {
    out.serial_number = s.serialNumber;
    out.model_number = s.modelNumber;
    if (s.maxNamespaces !== 0) out.max_namespaces = s.maxNamespaces;
    out.min_cntlid = s.minCntlid;
    out.max_cntlid = s.maxCntlid;
    out.namespaces = s.sortedNamespaces().map((ns) => {
      const n: { [key: string]: JsonValue } = { nsid: ns.nsid, bdev_name: ns.bdev.name, name: ns.bdev.name };
      if (!/^0*$/.test(ns.nguid)) n.nguid = ns.nguid;
      if (ns.eui64 && !/^0*$/.test(ns.eui64)) n.eui64 = ns.eui64;
      n.uuid = ns.uuid;
      if (s.anaReporting) n.anagrpid = ns.anagrpid;
      return n;
    });
  }
  return out;
}

/** nvmf_get_transports entry: defaults of the transport, overridden by the create request. */
function transportOpts(t: Trtype, p: { [key: string]: unknown }): TransportOpts {
  const num = (k: string, d: number) => (typeof p[k] === "number" ? (p[k] as number) : d);
  const flag = (k: string, d: boolean) => (typeof p[k] === "boolean" ? (p[k] as boolean) : d);
  const tcp = t === "TCP";
  const out: TransportOpts = {
    trtype: t,
    max_queue_depth: num("max_queue_depth", 128),
    max_io_qpairs_per_ctrlr: num("max_io_qpairs_per_ctrlr", 127),
    in_capsule_data_size: num("in_capsule_data_size", 4096),
    max_io_size: num("max_io_size", 131072),
    io_unit_size: num("io_unit_size", tcp ? 131072 : 8192),
    max_aq_depth: num("max_aq_depth", 128),
    num_shared_buffers: num("num_shared_buffers", tcp ? 511 : 4095),
    buf_cache_size: num("buf_cache_size", tcp ? 4294967295 : 32),
    dif_insert_or_strip: flag("dif_insert_or_strip", false),
    zcopy: flag("zcopy", false),
  };
  if (tcp) {
    out.c2h_success = flag("c2h_success", true);
    out.sock_priority = num("sock_priority", 0);
  } else {
    out.max_srq_depth = num("max_srq_depth", 4096);
    out.no_srq = flag("no_srq", false);
    if (out.no_srq) out.num_cqe = num("num_cqe", 4096);
    out.acceptor_backlog = num("acceptor_backlog", 100);
    out.no_wr_batching = flag("no_wr_batching", false);
  }
  out.abort_timeout_sec = num("abort_timeout_sec", 1);
  out.ack_timeout = num("ack_timeout", 0);
  out.data_wr_pool_size = num("data_wr_pool_size", 0);
  return out;
}
