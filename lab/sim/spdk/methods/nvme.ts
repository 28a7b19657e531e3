// bdev_nvme_* methods: attach a simulated drive over PCIe or a remote subsystem over the fabric
// (ACL refusals -5, nothing listening -19, same controller twice -114), detach, list.
import * as v from "valibot";
import { normalizePciAddress } from "../../../../lib/pci-address.ts";
import type { App } from "../app.ts";
import type { Bdev } from "../bdev.ts";
import { FabricConnectError } from "../fabric.ts";
import type { HostDhchapOptions } from "../fabric-auth.ts";
import type { JsonValue } from "../json-stream.ts";
import type { Key } from "../keyring.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import { anaAccessible, FabricNamespaceIo, type NvmeCtrlr, type Trid } from "../nvme-controllers.ts";
import { bool, DECODE_FAILED_INTERNAL, decode, decodeOptional, i32, str, u32, u64 } from "../params.ts";
import { Errno, ErrnoError, RpcError } from "../rpc-error.ts";

const ADRFAM: Readonly<Record<string, string>> = {
  ipv4: "IPv4",
  ipv6: "IPv6",
  ib: "IB",
  fc: "FC",
  intra_host: "INTRA_HOST",
};

const AttachSchema = v.strictObject({
  name: str,
  trtype: str,
  traddr: str,
  adrfam: v.optional(str),
  trsvcid: v.optional(str),
  priority: v.optional(str),
  subnqn: v.optional(str),
  hostnqn: v.optional(str),
  hostaddr: v.optional(str),
  hostsvcid: v.optional(str),
  prchk_reftag: v.optional(bool),
  prchk_guard: v.optional(bool),
  hdgst: v.optional(bool),
  ddgst: v.optional(bool),
  fabrics_connect_timeout_us: v.optional(u64),
  multipath: v.optional(v.picklist(["disable", "failover", "multipath"])),
  num_io_queues: v.optional(u32),
  ctrlr_loss_timeout_sec: v.optional(i32),
  reconnect_delay_sec: v.optional(u32),
  fast_io_fail_timeout_sec: v.optional(u32),
  psk: v.optional(str),
  max_bdevs: v.optional(u32),
  dhchap_key: v.optional(str),
  dhchap_ctrlr_key: v.optional(str),
  allow_unrecognized_csi: v.optional(bool),
});

/** bdev_nvme_check_io_error_resiliency_params. */
function resiliencyValid(loss: number, delay: number, fastFail: number): boolean {
  if (loss < -1) return false;
  if (loss === -1) return delay !== 0 && (fastFail === 0 || fastFail >= delay);
  if (loss !== 0) {
    if (delay === 0 || delay > loss) return false;
    return fastFail === 0 || (fastFail >= delay && fastFail <= loss);
  }
  return delay === 0 && fastFail === 0;
}

/**
 * The DH-HMAC-CHAP secrets behind an attach's key names, read from the key files now (as SPDK
 * loads a key when the controller takes it); a file that cannot be read fails the attach -EIO.
 */
function dhchapSecrets(
  app: App,
  key: string | undefined,
  ctrlrKey: string | undefined,
): HostDhchapOptions | undefined {
  if (key === undefined) return undefined;
  const read = (name: string) => {
    try {
      return app.keyring.read(app.keyring.get(name) as Key);
    } catch {
      throw RpcError.errno(Errno.EIO);
    }
  };
  return { secret: read(key), ...(ctrlrKey !== undefined ? { ctrlSecret: read(ctrlrKey) } : {}) };
}

/** The bdev_nvme methods of `app`. */
export function nvmeMethods(app: App): MethodSpec[] {
  const { nvme } = app;
  const aliases = app.config.trtypeAliases;

  return [
    {
      name: "bdev_nvme_attach_controller",
      states: RUNTIME,
      handler: (req, ctx) => {
        const p = decode(req, AttachSchema, DECODE_FAILED_INTERNAL);
        if (p.trtype.length >= 32) throw new RpcError(-Errno.EINVAL, `Failed to parse trtype: ${p.trtype}`);
        const upper = p.trtype.toUpperCase();
        // A transport alias (SNAP's NVDA_TCP) keeps its own name in the trid, as a custom
        // transport's trstring does, and runs over the built-in transport it stands for.
        const trtype: string = upper === "PCIE" ? "PCIe" : upper;
        const transport: string = trtype === "PCIe" ? "PCIe" : (aliases[p.trtype] ?? aliases[upper] ?? upper);
        let adrfam: string | undefined;
        if (p.adrfam !== undefined) {
          adrfam = ADRFAM[p.adrfam.toLowerCase()];
          if (!adrfam) throw new RpcError(-Errno.EINVAL, `Failed to parse adrfam: ${p.adrfam}`);
        }
        const hostnqn = p.hostnqn ?? nvme.defaultHostnqn;
        const opts = {
          ctrlrLossTimeoutSec: p.ctrlr_loss_timeout_sec ?? 0,
          reconnectDelaySec: p.reconnect_delay_sec ?? 0,
          fastIoFailTimeoutSec: p.fast_io_fail_timeout_sec ?? 0,
        };
        if (!resiliencyValid(opts.ctrlrLossTimeoutSec, opts.reconnectDelaySec, opts.fastIoFailTimeoutSec)) {
          throw RpcError.errno(Errno.EINVAL);
        }
        for (const k of [p.psk, p.dhchap_key, p.dhchap_ctrlr_key]) {
          if (k !== undefined && !app.keyring.get(k)) throw RpcError.errno(Errno.ENOKEY);
        }
        const dhchap = dhchapSecrets(app, p.dhchap_key, p.dhchap_ctrlr_key);
        const traddr = trtype === "PCIe" ? (normalizePciAddress(p.traddr) ?? p.traddr) : p.traddr;
        const trid: Trid & { trtype: string; traddr: string } = {
          trtype,
          ...(adrfam ? { adrfam } : {}),
          traddr,
          ...(p.trsvcid ? { trsvcid: p.trsvcid } : {}),
          ...(p.subnqn ? { subnqn: p.subnqn } : {}),
        };
        /** The RPC's checks against a controller already holding this name. */
        const checkExisting = (existing: NvmeCtrlr) => {
          const first = existing.paths[0];
          if (p.multipath === "disable") {
            throw new RpcError(
              -Errno.EALREADY,
              `A controller named ${p.name} already exists and multipath is disabled`,
            );
          }
          // rpc_bdev_nvme_attach_controller compares with the name's first controller only; the
          // same trid as a later path fails in bdev_nvme_add_secondary_trid/create with -EEXIST.
          const samePath =
            first !== undefined &&
            first.trid.traddr === traddr &&
            (first.trid.trsvcid ?? "") === (p.trsvcid ?? "") &&
            first.hostaddr === (p.hostaddr ?? "") &&
            first.hostsvcid === (p.hostsvcid ?? "");
          if (samePath) {
            throw new RpcError(
              -Errno.EALREADY,
              `A controller named ${p.name} already exists with the specified network path`,
            );
          }
          if (first && (first.trid.subnqn ?? "") !== (p.subnqn ?? "")) {
            throw new RpcError(
              -Errno.EINVAL,
              `A controller named ${p.name} already exists, but uses a different subnqn (${first.trid.subnqn ?? ""})`,
            );
          }
          if (existing.hostnqn !== hostnqn) {
            throw new RpcError(
              -Errno.EINVAL,
              `A controller named ${p.name} already exists, but uses a different hostnqn (${existing.hostnqn})`,
            );
          }
        };
        const existing = nvme.get(p.name);
        if (existing) checkExisting(existing);
        return app.nvmeLock.run(async () => {
          await ctx.defer();
          try {
            if (trtype === "PCIe") {
              if (nvme.get(p.name)) throw new ErrnoError(Errno.EEXIST, p.name);
              return await nvme.attachPcie(p.name, traddr, hostnqn);
            }
            const attach = {
              name: p.name,
              trid,
              hostnqn,
              hostaddr: p.hostaddr ?? "",
              hostsvcid: p.hostsvcid ?? "",
              maxBdevs: p.max_bdevs ?? 128,
              opts,
              transport,
              ...(dhchap ? { dhchap } : {}),
            };
            // Another attach of this name may have completed meanwhile (pipelined requests).
            const again = nvme.get(p.name);
            if (again) {
              checkExisting(again);
              return await nvme.addPath(again, attach);
            }
            if (transport !== "TCP" && transport !== "RDMA")
              throw new ErrnoError(Errno.ENODEV, `no ${transport} transport`);
            return await nvme.attachFabric(attach);
          } catch (err) {
            // A refused connect, DH-HMAC-CHAP failures included, fails the attach with -EIO.
            if (err instanceof FabricConnectError && err.errno !== Errno.ENODEV)
              throw RpcError.errno(Errno.EIO);
            if (err instanceof ErrnoError) throw RpcError.errno(err.errno);
            throw err;
          }
        });
      },
    },
    {
      name: "bdev_nvme_detach_controller",
      states: RUNTIME,
      handler: (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            trtype: v.optional(str),
            traddr: v.optional(str),
            adrfam: v.optional(str),
            trsvcid: v.optional(str),
            subnqn: v.optional(str),
            hostaddr: v.optional(str),
            hostsvcid: v.optional(str),
          }),
          DECODE_FAILED_INTERNAL,
        );
        if (!nvme.get(p.name)) throw RpcError.errno(Errno.ENODEV);
        const filtered =
          p.trtype !== undefined ||
          p.traddr !== undefined ||
          p.adrfam !== undefined ||
          p.trsvcid !== undefined ||
          p.subnqn !== undefined ||
          p.hostaddr !== undefined ||
          p.hostsvcid !== undefined;
        const match = (t: Trid, hostaddr: string, hostsvcid: string) =>
          (p.trtype === undefined || t.trtype.toUpperCase() === p.trtype.toUpperCase()) &&
          (p.traddr === undefined || t.traddr === p.traddr) &&
          (p.adrfam === undefined || (t.adrfam ?? "").toUpperCase() === p.adrfam.toUpperCase()) &&
          (p.trsvcid === undefined || (t.trsvcid ?? "") === p.trsvcid) &&
          (p.subnqn === undefined || (t.subnqn ?? "") === p.subnqn) &&
          (p.hostaddr === undefined || hostaddr === p.hostaddr) &&
          (p.hostsvcid === undefined || hostsvcid === p.hostsvcid);
        return app.nvmeLock.run(async () => {
          await ctx.defer();
          const ctrlr = nvme.get(p.name);
          if (!ctrlr) throw RpcError.errno(Errno.ENODEV);
          try {
            await nvme.detach(ctrlr, filtered ? match : undefined);
          } catch (err) {
            if (err instanceof ErrnoError) throw RpcError.errno(err.errno);
            throw err;
          }
          return true;
        });
      },
    },
    {
      // bdev_nvme_rpc.c rpc_bdev_nvme_set_multipath_policy and spdk_bdev_nvme_set_multipath_policy.
      name: "bdev_nvme_set_multipath_policy",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            policy: v.picklist(["active_passive", "active_active"]),
            selector: v.optional(v.picklist(["round_robin", "queue_depth"])),
            rr_min_io: v.optional(u32),
          }),
          DECODE_FAILED_INTERNAL,
        );
        // "selector only works in active_active mode", reported as a decode failure.
        if (p.selector !== undefined && p.policy !== "active_active") throw DECODE_FAILED_INTERNAL();
        const selector = p.selector ?? "round_robin";
        const rrMinIo = p.rr_min_io ?? 1;
        if (p.policy === "active_active" && selector === "round_robin" && rrMinIo === 0) {
          throw RpcError.errno(Errno.EINVAL);
        }
        const io = app.registry.get(p.name)?.io;
        if (!(io instanceof FabricNamespaceIo)) throw RpcError.errno(Errno.ENODEV);
        io.policy = p.policy;
        io.selector = selector;
        io.rrMinIo = rrMinIo;
        io.current = undefined;
        return true;
      },
    },
    {
      // rpc_bdev_nvme_get_io_paths: per poll group, the I/O paths of the channels it holds. A
      // bdev has channels on every poll group while it is a namespace of this app's NVMe-oF
      // target, directly or as a member of a raid that is; otherwise none are listed.
      name: "bdev_nvme_get_io_paths",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ name: v.optional(str) }),
          () => new RpcError(-32602, "bdev_nvme_get_io_paths requires no parameters"),
        );
        const exported = new Set<Bdev>();
        for (const s of app.target.subsystems())
          for (const ns of s.namespaces.values()) exported.add(ns.bdev);
        const held = (b: Bdev, depth = 0): boolean => {
          if (exported.has(b)) return true;
          const m = app.raids.memberOf(b);
          return depth < 4 && !!m?.slot.configured && !!m.raid.bdev && held(m.raid.bdev, depth + 1);
        };
        const ioPaths: JsonValue[] = [];
        for (const c of nvme.list()) {
          for (const path of c.paths) {
            for (const bdev of [...c.bdevs.entries()].sort((x, y) => x[0] - y[0]).map(([, b]) => b)) {
              const io = bdev.io;
              if (!(io instanceof FabricNamespaceIo) || !held(bdev)) continue;
              if (p.name !== undefined && p.name !== bdev.name) continue;
              const transport: { [key: string]: JsonValue } = {
                trtype: path.trid.trtype,
                traddr: path.trid.traddr,
              };
              if (path.trid.trsvcid) transport.trsvcid = path.trid.trsvcid;
              if (path.trid.adrfam) transport.adrfam = path.trid.adrfam;
              ioPaths.push({
                bdev_name: bdev.name,
                cntlid: path.cntlid,
                current: io.isCurrent(path),
                connected: path.usable,
                accessible: anaAccessible(path),
                transport,
              });
            }
          }
        }
        if (ioPaths.length === 0) return { poll_groups: [] };
        const groups = app.target.pollGroupStats().length || 1;
        return {
          poll_groups: Array.from({ length: groups }, (_, i) => ({
            thread: `nvmf_tgt_poll_group_${String(i).padStart(3, "0")}`,
            io_paths: ioPaths,
          })),
        };
      },
    },
    {
      name: "bdev_nvme_get_controllers",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(req, v.strictObject({ name: v.optional(str) }), DECODE_FAILED_INTERNAL);
        if (p.name === undefined) return nvme.list().map((c) => nvme.toJson(c));
        const c = nvme.get(p.name);
        if (!c) throw new RpcError(-Errno.EINVAL, `Controller ${p.name} does not exist`);
        return [nvme.toJson(c)];
      },
    },
  ];
}
