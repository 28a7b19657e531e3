// The bdev_nvme module of one app: controllers attached over PCIe (simulated drives) or over the
// SimFabric (tcp/rdma, as an initiator such as SNAP or bdevperf), their namespace bdevs
// "<name>n<nsid>", path state, reconnects and detach.
import type { Clock } from "../../../lib/clock.ts";
import type { Logger } from "../../../lib/log.ts";
import { Bdev, type BdevRegistry, IO_TYPES, type IoTypes, SYSTEM_DOMAIN } from "./bdev.ts";
import { type BlockIo, checkRange, FileExtentIo } from "./block-io.ts";
import { connectController, FabricConnectError, type FabricController, type SimFabric } from "./fabric.ts";
import type { HostDhchapOptions } from "./fabric-auth.ts";
import type { ControllerInfo, NamespaceInfo } from "./fabric-protocol.ts";
import type { JsonValue } from "./json-stream.ts";
import { Errno, ErrnoError, PATH_ERRNO } from "./rpc-error.ts";
import type { PreparedDrive, SimDrive } from "./sim-drive.ts";

/** g_opts.nvme_adminq_poll_period_us (10 ms): how often the admin queue poller runs. */
export const ADMINQ_POLL_PERIOD_MS = 10;
/** The delay bdev_nvme_io_complete gives an I/O that found no usable path (-ENXIO): 1 s. */
export const NO_PATH_RETRY_MS = 1000;

/** A transport ID as bdev_nvme prints it (absent members are omitted). */
export interface Trid {
  readonly trtype: string; // "PCIe" | "TCP" | "RDMA"
  readonly adrfam?: string; // "IPv4" | "IPv6" | "IB" | "FC" | "INTRA_HOST"
  readonly traddr: string;
  readonly trsvcid?: string;
  readonly subnqn?: string;
}

/** Reconnect behaviour chosen at attach (SPDK's I/O error resiliency options). */
export interface ResiliencyOpts {
  readonly ctrlrLossTimeoutSec: number;
  readonly reconnectDelaySec: number;
  readonly fastIoFailTimeoutSec: number;
}

/** The printed controller states of bdev_nvme_get_controllers (nvme_ctrlr_get_state_str). */
export type CtrlrState = "enabled" | "failed" | "resetting" | "reconnect_is_delayed" | "deleting";

/**
 * One path of a controller: SPDK's struct nvme_ctrlr, with the flags its reset machinery keeps
 * (module/bdev/nvme/bdev_nvme.c). The printed state is derived from them in SPDK's order.
 */
export class CtrlrPath {
  fabric: FabricController | undefined;
  /** Set while a PCIe path's namespaces are open. */
  files: FileExtentIo[] = [];
  /** nvme_ctrlr->destruct: detached or declared lost. */
  destruct = false;
  /** spdk_nvme_ctrlr_is_failed: the last reconnect attempt failed (reconnect_delay_sec 0). */
  failed = false;
  /** nvme_ctrlr->resetting: a reset (disconnect and reconnect attempt) is under way. */
  resetting = false;
  /** nvme_ctrlr->reconnect_is_delayed: waiting reconnect_delay_sec before the next attempt. */
  reconnectDelayed = false;
  /**
   * nvme_ctrlr->fast_io_fail_timedout. v25.05.1 sets it when a reset fails past
   * fast_io_fail_timeout_sec and never clears it, so a later outage fails I/O at once.
   */
  fastIoFailTimedout = false;
  /** nvme_ctrlr->reset_start_tsc (ms on the app's clock): when the current outage began. */
  resetStart: number | undefined;
  /** The last attempt reached the target and was refused at CONNECT (host not allowed, auth). */
  refusedAtConnect = false;
  /** Cancels the pending reconnect timer. */
  cancelTimer: (() => void) | undefined;

  constructor(
    readonly trid: Trid,
    /** The fabric transport the path runs on (differs from trid.trtype for an alias like NVDA_TCP). */
    readonly transport: string,
    readonly hostaddr: string,
    readonly hostsvcid: string,
    public cntlid: number,
    public ctrlrData: ControllerInfo,
    fabric: FabricController | undefined,
  ) {
    this.fabric = fabric;
  }

  /** nvme_ctrlr_get_state_str. */
  get state(): CtrlrState {
    if (this.destruct) return "deleting";
    // Between the attempts of the reconnect_delay_sec 0 loop (see NvmeControllers.#attemptFailed)
    // the flag reads failed; an attempt refused at CONNECT is counted as still resetting.
    if (this.failed) return this.refusedAtConnect ? "resetting" : "failed";
    if (this.resetting) return "resetting";
    if (this.reconnectDelayed) return "reconnect_is_delayed";
    return "enabled";
  }

  /** nvme_qpair_is_connected + nvme_ctrlr_is_available: the path can carry I/O now. */
  get usable(): boolean {
    return (
      !this.destruct &&
      !this.resetting &&
      !this.failed &&
      !this.reconnectDelayed &&
      (this.trid.trtype === "PCIe" || (this.fabric !== undefined && !this.fabric.closed))
    );
  }
}

/** An attached NVMe controller (bdev_nvme's nvme_bdev_ctrlr). */
export interface NvmeCtrlr {
  readonly name: string;
  readonly hostnqn: string;
  readonly opts: ResiliencyOpts;
  readonly paths: CtrlrPath[];
  /** Namespace bdevs by NSID. */
  readonly bdevs: Map<number, Bdev>;
  /** Per-namespace identity, kept current by the target's notices. */
  namespaces: NamespaceInfo[];
  /** DH-HMAC-CHAP secrets every path (and reconnect) authenticates with. */
  readonly dhchap?: HostDhchapOptions;
  /** The local drive behind a PCIe controller (its Identify data); none over the fabric. */
  readonly drive?: SimDrive;
}

/** Options of a fabric attach. */
export interface FabricAttach {
  readonly name: string;
  readonly trid: Required<Pick<Trid, "trtype" | "traddr">> & Trid;
  /** The built-in transport behind trid.trtype ("TCP" or "RDMA"). */
  readonly transport: string;
  readonly hostnqn: string;
  readonly hostaddr: string;
  readonly hostsvcid: string;
  readonly maxBdevs: number;
  readonly opts: ResiliencyOpts;
  readonly dhchap?: HostDhchapOptions;
}

/**
 * Controllers of one app. Methods throw ErrnoError with the errno SPDK reports; the RPC layer
 * formats replies. Not safe for overlapping attach/detach of the same name (the RPC layer runs
 * them one after another per emulator).
 */
export class NvmeControllers {
  readonly #ctrlrs: NvmeCtrlr[] = [];
  /** g_opts.bdev_retry_count; bdev_nvme_set_options is not emulated, so SPDK's default. */
  readonly bdevRetryCount = 3;

  constructor(
    private readonly registry: BdevRegistry,
    private readonly drives: readonly PreparedDrive[],
    private readonly fabric: SimFabric | undefined,
    /** The app's default host NQN and host ID (used when an attach names no hostnqn). */
    readonly defaultHostnqn: string,
    readonly hostid: string,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  list(): readonly NvmeCtrlr[] {
    return this.#ctrlrs;
  }

  get(name: string): NvmeCtrlr | undefined {
    return this.#ctrlrs.find((c) => c.name === name);
  }

  /** The controller, under any name, that already reaches `trid` for `hostnqn`. */
  findByTrid(trid: Trid, hostnqn: string): NvmeCtrlr | undefined {
    return this.#ctrlrs.find((c) => c.hostnqn === hostnqn && c.paths.some((p) => sameTrid(p.trid, trid)));
  }

  /**
   * Attaches the simulated drive at PCI address `traddr` (normalised) as `name`. ENODEV when no
   * drive is there, EEXIST when another controller holds it. Resolves with the new bdev names.
   */
  async attachPcie(name: string, traddr: string, hostnqn: string): Promise<string[]> {
    const drive = this.drives.find((d) => d.pciAddress === traddr);
    if (!drive) throw new ErrnoError(Errno.ENODEV, `no drive at ${traddr}`);
    const trid: Trid = { trtype: "PCIe", traddr };
    if (this.#ctrlrs.some((c) => c.paths.some((p) => sameTrid(p.trid, trid)))) {
      throw new ErrnoError(Errno.EEXIST, `${traddr} is attached`);
    }
    const d = drive.drive;
    const ctrlrData: ControllerInfo = {
      cntlid: 0,
      vendorId: "0x8086",
      modelNumber: d.model,
      serialNumber: d.serial,
      firmwareRevision: d.firmware ?? "SIM1.0",
      // Identify Controller SUBNQN of a PCIe drive: vendor IDs, then padded serial and model.
      subnqn: `nqn.2014.08.org.nvmexpress:80868086${d.serial.padEnd(20)}${d.model.padEnd(40)}`,
      nvmeVersion: "1.4",
    };
    const path = new CtrlrPath(trid, "PCIe", "", "", 0, ctrlrData, undefined);
    const ctrlr: NvmeCtrlr = {
      name,
      hostnqn,
      opts: { ctrlrLossTimeoutSec: 0, reconnectDelaySec: 0, fastIoFailTimeoutSec: 0 },
      drive: d,
      paths: [path],
      bdevs: new Map(),
      namespaces: drive.namespaces.map((ns) => ({
        nsid: ns.nsid,
        uuid: ns.uuid,
        nguid: ns.uuid.replaceAll("-", "").toUpperCase(),
        blockSize: drive.blockSize,
        numBlocks: ns.sizeBytes / drive.blockSize,
      })),
    };
    this.#ctrlrs.push(ctrlr);
    const created: string[] = [];
    for (const ns of drive.namespaces) {
      const io = new FileExtentIo(drive.path, ns.offset, ns.sizeBytes);
      path.files.push(io);
      const bdev = this.#nvmeBdev(ctrlr, ns.nsid, io, d.numaNode ?? 0, IO_TYPES.nvmePcie, undefined);
      if (await this.#register(ctrlr, ns.nsid, bdev)) created.push(bdev.name);
    }
    return created;
  }

  /**
   * Connects `a.name` to a subsystem over the fabric. ENODEV when nothing listens at the address,
   * EIO when the target refuses the host, EEXIST when another controller already has this path.
   * Resolves with the namespace bdevs it could register (a bdev whose UUID is taken is skipped).
   */
  async attachFabric(a: FabricAttach): Promise<string[]> {
    if (this.findByTrid(a.trid, a.hostnqn))
      throw new ErrnoError(Errno.EEXIST, `${a.trid.traddr} is attached`);
    if (!this.fabric) throw new ErrnoError(Errno.ENODEV, "no fabric");
    const conn = await connectController(this.fabric, {
      trtype: a.transport,
      traddr: a.trid.traddr,
      trsvcid: a.trid.trsvcid ?? "",
      subnqn: a.trid.subnqn ?? "",
      hostnqn: a.hostnqn,
      hostid: this.hostid,
      hostaddr: a.hostaddr || undefined,
      dhchap: a.dhchap,
    });
    const path = new CtrlrPath(
      a.trid,
      a.transport,
      a.hostaddr,
      a.hostsvcid,
      conn.ctrlr.cntlid,
      conn.ctrlr,
      conn,
    );
    const ctrlr: NvmeCtrlr = {
      name: a.name,
      hostnqn: a.hostnqn,
      opts: a.opts,
      paths: [path],
      bdevs: new Map(),
      namespaces: [...conn.namespaces],
      ...(a.dhchap ? { dhchap: a.dhchap } : {}),
    };
    this.#ctrlrs.push(ctrlr);
    this.#watch(ctrlr, path);
    const created: string[] = [];
    for (const ns of conn.namespaces.slice(0, a.maxBdevs)) {
      const name = await this.#addFabricNamespace(ctrlr, ns);
      if (name) created.push(name);
    }
    return created;
  }

  /**
   * Adds another path to an existing controller (multipath). The new path must reach the same
   * subsystem; EIO/ENODEV as for attachFabric. Resolves with the controller's bdev names.
   */
  async addPath(ctrlr: NvmeCtrlr, a: FabricAttach): Promise<string[]> {
    if (ctrlr.paths.some((x) => sameTrid(x.trid, a.trid))) throw new ErrnoError(Errno.EEXIST, "path exists");
    if (!this.fabric) throw new ErrnoError(Errno.ENODEV, "no fabric");
    const conn = await connectController(this.fabric, {
      trtype: a.transport,
      traddr: a.trid.traddr,
      trsvcid: a.trid.trsvcid ?? "",
      subnqn: a.trid.subnqn ?? "",
      hostnqn: a.hostnqn,
      hostid: this.hostid,
      hostaddr: a.hostaddr || undefined,
      dhchap: a.dhchap,
    });
    const path = new CtrlrPath(
      a.trid,
      a.transport,
      a.hostaddr,
      a.hostsvcid,
      conn.ctrlr.cntlid,
      conn.ctrlr,
      conn,
    );
    ctrlr.paths.push(path);
    this.#watch(ctrlr, path);
    return [...ctrlr.bdevs.values()].map((b) => b.name);
  }

  /**
   * Detaches `ctrlr`, or only its paths matching `filter` (ENXIO when none matches). Removing the
   * last path removes the controller and hot-removes its bdevs.
   */
  async detach(
    ctrlr: NvmeCtrlr,
    filter?: (t: Trid, hostaddr: string, hostsvcid: string) => boolean,
  ): Promise<void> {
    const victims = filter
      ? ctrlr.paths.filter((p) => filter(p.trid, p.hostaddr, p.hostsvcid))
      : [...ctrlr.paths];
    if (victims.length === 0) throw new ErrnoError(Errno.ENXIO, "no matching path");
    for (const p of victims) {
      this.#deletePath(p);
      ctrlr.paths.splice(ctrlr.paths.indexOf(p), 1);
    }
    if (ctrlr.paths.length === 0) await this.#destruct(ctrlr);
    for (const p of victims) this.#closePath(p);
  }

  /** Drops every controller at once (a crashed app): connections cut, files closed. */
  crash(): void {
    for (const c of this.#ctrlrs) {
      for (const p of c.paths) {
        this.#deletePath(p);
        this.#closePath(p);
      }
    }
    this.#ctrlrs.length = 0;
  }

  /** bdev_nvme_get_controllers entry. */
  toJson(c: NvmeCtrlr): JsonValue {
    return {
      name: c.name,
      ctrlrs: c.paths.map((p) => ({
        state: p.state,
        trid: tridJson(p.trid),
        cntlid: p.cntlid,
        host: { nqn: c.hostnqn, addr: p.hostaddr, svcid: p.hostsvcid },
      })),
    };
  }

  #closePath(p: CtrlrPath): void {
    p.fabric?.close();
    for (const f of p.files) f.close();
    p.files = [];
  }

  /** Marks a path destructed (bdev_nvme_delete_ctrlr) and stops its reconnect timer. */
  #deletePath(p: CtrlrPath): void {
    p.destruct = true;
    p.cancelTimer?.();
    p.cancelTimer = undefined;
  }

  async #destruct(ctrlr: NvmeCtrlr): Promise<void> {
    for (const p of ctrlr.paths) this.#deletePath(p);
    const at = this.#ctrlrs.indexOf(ctrlr);
    if (at >= 0) this.#ctrlrs.splice(at, 1);
    for (const b of [...ctrlr.bdevs.values()]) await this.registry.unregister(b);
    ctrlr.bdevs.clear();
  }

  /** Follows a fabric path: namespace notices, and what to do when the connection drops. */
  #watch(ctrlr: NvmeCtrlr, path: CtrlrPath): void {
    const conn = path.fabric as FabricController;
    conn.onNamespaces((list) => {
      if (path !== ctrlr.paths[0]) return;
      void this.#reconcile(ctrlr, list);
    });
    // An ANA change (read from the ANA log page on its AEN) clears the cached paths.
    conn.onAnaState(() => this.#clearCurrent(ctrlr));
    conn.onClose(() => {
      if (path.destruct || path.fabric !== conn) return;
      this.#clearCurrent(ctrlr);
      this.log.info("fabric path lost", {
        ctrlr: ctrlr.name,
        traddr: path.trid.traddr,
        trsvcid: path.trid.trsvcid,
      });
      this.#startReset(ctrlr, path);
    });
  }

  /** bdev_nvme_clear_io_path_caches: every namespace of `ctrlr` forgets its current path. */
  #clearCurrent(ctrlr: NvmeCtrlr): void {
    for (const b of ctrlr.bdevs.values()) if (b.io instanceof FabricNamespaceIo) b.io.current = undefined;
  }

  /**
   * bdev_nvme_failover_ctrlr on a lost connection: the path goes resetting and one reconnect
   * attempt runs. Nothing happens while a reset runs, a reconnect is delayed or the path is gone.
   */
  #startReset(ctrlr: NvmeCtrlr, path: CtrlrPath): void {
    if (path.destruct || path.resetting || path.reconnectDelayed) return;
    path.resetting = true;
    // nvme_ctrlr_disconnect clears the failed flag as the new attempt starts.
    path.failed = false;
    path.resetStart ??= this.clock.now();
    void this.#attempt(ctrlr, path);
  }

  /** One reconnect attempt (bdev_nvme_reconnect_ctrlr) and what follows it. */
  async #attempt(ctrlr: NvmeCtrlr, path: CtrlrPath): Promise<void> {
    const live = () => this.#ctrlrs.includes(ctrlr) && ctrlr.paths.includes(path) && !path.destruct;
    if (!live() || !this.fabric) return;
    let conn: FabricController;
    try {
      conn = await connectController(this.fabric, {
        trtype: path.transport,
        traddr: path.trid.traddr,
        trsvcid: path.trid.trsvcid ?? "",
        subnqn: path.trid.subnqn ?? "",
        hostnqn: ctrlr.hostnqn,
        hostid: this.hostid,
        hostaddr: path.hostaddr || undefined,
        dhchap: ctrlr.dhchap,
      });
    } catch (err) {
      if (!live()) return;
      path.refusedAtConnect = err instanceof FabricConnectError && err.errno !== Errno.ENODEV;
      await this.#attemptFailed(ctrlr, path);
      return;
    }
    if (!live()) {
      conn.close();
      return;
    }
    // bdev_nvme_reset_ctrlr_complete(success): the outage is over.
    path.fabric = conn;
    path.cntlid = conn.ctrlr.cntlid;
    path.ctrlrData = conn.ctrlr;
    path.resetting = false;
    path.failed = false;
    path.refusedAtConnect = false;
    path.resetStart = undefined;
    this.#watch(ctrlr, path);
    await this.#reconcile(ctrlr, conn.namespaces);
    this.log.info("fabric path reconnected", { ctrlr: ctrlr.name });
  }

  /**
   * bdev_nvme_reset_ctrlr_complete(failure) and bdev_nvme_check_op_after_reset: fast_io_fail
   * is judged first; with reconnect_delay_sec 0 the controller is left failed and the admin queue
   * poller starts the next reset on its next run; otherwise past ctrlr_loss_timeout_sec the
   * controller is deleted, else the next attempt waits reconnect_delay_sec.
   */
  async #attemptFailed(ctrlr: NvmeCtrlr, path: CtrlrPath): Promise<void> {
    const o = ctrlr.opts;
    const elapsedSec = Math.floor((this.clock.now() - (path.resetStart ?? this.clock.now())) / 1000);
    if (o.fastIoFailTimeoutSec !== 0 && elapsedSec >= o.fastIoFailTimeoutSec) path.fastIoFailTimedout = true;
    path.resetting = false;
    if (o.reconnectDelaySec === 0) {
      // nvme_ctrlr_fail; spdk_nvme_qpair_process_completions then answers the admin queue
      // poller with -ENXIO, which calls bdev_nvme_failover_ctrlr again: SPDK keeps retrying
      // every nvme_adminq_poll_period_us for as long as the controller stays attached.
      path.failed = true;
      path.cancelTimer = this.clock.setTimeout(() => {
        path.cancelTimer = undefined;
        this.#startReset(ctrlr, path);
      }, ADMINQ_POLL_PERIOD_MS);
      return;
    }
    const loss = o.ctrlrLossTimeoutSec;
    if (loss !== 0 && loss !== -1 && elapsedSec >= loss) {
      this.log.info("controller loss timeout; deleting controller", { ctrlr: ctrlr.name });
      await this.#deleteLostPath(ctrlr, path);
      return;
    }
    // OP_DELAYED_RECONNECT: bdev_nvme_start_reconnect_delay_timer.
    path.reconnectDelayed = true;
    path.cancelTimer = this.clock.setTimeout(() => {
      path.cancelTimer = undefined;
      if (!path.reconnectDelayed || path.destruct) return;
      path.reconnectDelayed = false;
      path.resetting = true;
      void this.#attempt(ctrlr, path);
    }, o.reconnectDelaySec * 1000);
  }

  /** OP_DESTRUCT: the lost path is deleted; the controller and its bdevs go with the last one. */
  async #deleteLostPath(ctrlr: NvmeCtrlr, path: CtrlrPath): Promise<void> {
    this.#deletePath(path);
    const at = ctrlr.paths.indexOf(path);
    if (at >= 0) ctrlr.paths.splice(at, 1);
    this.#closePath(path);
    if (ctrlr.paths.length === 0) await this.#destruct(ctrlr);
  }

  /** Brings namespace bdevs in line with the target's current namespace list. */
  async #reconcile(ctrlr: NvmeCtrlr, list: readonly NamespaceInfo[]): Promise<void> {
    ctrlr.namespaces = [...list];
    for (const [nsid, bdev] of [...ctrlr.bdevs]) {
      const ns = list.find((n) => n.nsid === nsid);
      if (!ns || ns.uuid !== bdev.uuid) {
        ctrlr.bdevs.delete(nsid);
        await this.registry.unregister(bdev);
      } else if (ns.numBlocks !== bdev.numBlocks) {
        await this.registry.notifyResize(bdev);
      }
    }
    for (const ns of list) if (!ctrlr.bdevs.has(ns.nsid)) await this.#addFabricNamespace(ctrlr, ns);
  }

  async #addFabricNamespace(ctrlr: NvmeCtrlr, ns: NamespaceInfo): Promise<string | undefined> {
    const io = new FabricNamespaceIo(ctrlr, ns.nsid, this.clock, this.bdevRetryCount);
    // bdev_nvme_io_type_supported: UNMAP follows the controller's ONCS Dataset Management bit.
    const ioTypes = { ...IO_TYPES.nvmeFabric, unmap: ctrlr.paths[0]?.ctrlrData.dsm === true };
    const bdev = this.#nvmeBdev(ctrlr, ns.nsid, io, -1, ioTypes, SYSTEM_DOMAIN);
    io.claimOf = () => bdev.claim;
    return (await this.#register(ctrlr, ns.nsid, bdev)) ? bdev.name : undefined;
  }

  async #register(ctrlr: NvmeCtrlr, nsid: number, bdev: Bdev): Promise<boolean> {
    ctrlr.bdevs.set(nsid, bdev);
    try {
      await this.registry.register(bdev);
      return true;
    } catch (err) {
      // spdk_bdev_register fails for a taken name or UUID alias; the namespace gets no bdev.
      ctrlr.bdevs.delete(nsid);
      this.log.warn("namespace bdev not registered", { bdev: bdev.name, err: String(err) });
      return false;
    }
  }

  #nvmeBdev(
    ctrlr: NvmeCtrlr,
    nsid: number,
    io: BlockIo,
    numaId: number,
    ioTypes: IoTypes,
    memoryDomains: JsonValue | undefined,
  ): Bdev {
    const ns = ctrlr.namespaces.find((n) => n.nsid === nsid) as NamespaceInfo;
    return new Bdev({
      name: `${ctrlr.name}n${nsid}`,
      uuid: ns.uuid,
      module: "nvme",
      productName: "NVMe disk",
      blockSize: ns.blockSize,
      io,
      ioTypes,
      // bdev_nvme_get_memory_domains: each path's controller contributes its domains.
      ...(memoryDomains === undefined
        ? {}
        : { memoryDomainsOf: () => ctrlr.paths.flatMap(() => memoryDomains as JsonValue[]) }),
      numaId,
      driverSpecific: () => {
        // nvme_bdev_dump_info_json: the selector (and rr_min_io) only with active_active.
        const mp: { [key: string]: JsonValue } = { mp_policy: "active_passive" };
        if (io instanceof FabricNamespaceIo) {
          mp.mp_policy = io.policy;
          if (io.policy === "active_active") {
            mp.selector = io.selector;
            if (io.selector === "round_robin") mp.rr_min_io = io.rrMinIo;
          }
        }
        return { nvme: ctrlr.paths.map((p) => namespaceJson(p, nsid)), ...mp };
      },
      onRemoved: () => {
        if (ctrlr.bdevs.get(nsid)?.uuid === ns.uuid) ctrlr.bdevs.delete(nsid);
      },
    });
  }
}

/** The ANA state the initiator knows for a path (optimized when the subsystem reports none). */
function anaOf(p: CtrlrPath): string {
  return p.fabric?.anaState ?? "optimized";
}

/** nvme_ns_is_accessible: optimized or non-optimized. */
export function anaAccessible(p: CtrlrPath): boolean {
  const a = anaOf(p);
  return a === "optimized" || a === "non_optimized";
}

/** nvme_io_path_is_available: connected and accessible. */
function available(p: CtrlrPath): boolean {
  return p.usable && anaAccessible(p);
}

/**
 * nvme_ctrlr_is_failed: whether a path counts as failed for holding I/O. A resetting path counts
 * as failed only with reconnect_delay_sec 0; a delayed reconnect never does; fast_io_fail and a
 * destructed controller always do.
 */
function pathFailed(c: NvmeCtrlr, p: CtrlrPath): boolean {
  if (p.destruct || p.fastIoFailTimedout) return true;
  if (p.resetting) return c.opts.reconnectDelaySec === 0;
  if (p.reconnectDelayed) return false;
  return p.failed;
}

/** bdev_nvme_set_multipath_policy's policy and selector. */
export type MpPolicy = "active_passive" | "active_active";
export type MpSelector = "round_robin" | "queue_depth";

/**
 * The data path of a namespace reached over the fabric (bdev_nvme_submit_request), with the
 * multipath state SPDK keeps per nvme_bdev and per channel (one channel: the emulator's thread).
 * I/O goes to a usable path in an optimized ANA state, else a non-optimized one
 * (bdev_nvme_find_io_path: active_passive sticks to the cached current path; active_active
 * round-robins over the optimized paths every rr_min_io I/Os, or picks the fewest outstanding
 * with queue_depth). With no such path the I/O is held and retried every second while any path
 * may still become available (any_io_path_may_become_available: connected, or its controller not
 * failed), and fails with EIO once none may; an I/O whose path drops under it, or that the
 * target answers with an ANA path error, is retried the same way.
 */
export class FabricNamespaceIo implements BlockIo {
  policy: MpPolicy = "active_passive";
  selector: MpSelector = "round_robin";
  rrMinIo = 1;
  /** nbdev_ch->current_io_path. */
  #current: CtrlrPath | undefined;
  #rrCounter = 0;
  /**
   * The consumer the cache belongs to. SPDK caches the path per I/O channel, and a consumer that
   * opens the bdev (an NVMe-oF namespace, a raid) gets a fresh channel with no path cached,
   * whatever examine read before: the emulator has one channel, so a new claim clears it.
   */
  #owner: unknown;
  /** The bdev's claim, for the cache's owner (set when the bdev is made). */
  claimOf: () => unknown = () => null;
  readonly #outstanding = new Map<CtrlrPath, number>();

  constructor(
    private readonly ctrlr: NvmeCtrlr,
    private readonly nsid: number,
    private readonly clock: Clock,
    /** g_opts.bdev_retry_count (3): 0 fails an I/O that found no path at once. */
    private readonly retryCount: number,
  ) {}

  get sizeBytes(): number {
    const ns = this.ctrlr.namespaces.find((n) => n.nsid === this.nsid);
    return ns ? ns.numBlocks * ns.blockSize : 0;
  }

  get current(): CtrlrPath | undefined {
    const owner = this.claimOf();
    if (owner !== this.#owner) {
      this.#owner = owner;
      this.#current = undefined;
    }
    return this.#current;
  }

  set current(p: CtrlrPath | undefined) {
    this.#owner = this.claimOf();
    this.#current = p;
  }

  /** nvme_io_path_is_current, for bdev_nvme_get_io_paths. */
  isCurrent(p: CtrlrPath): boolean {
    if (!available(p)) return false;
    if (this.policy === "active_active") {
      const optimized = this.ctrlr.paths.some((x) => anaOf(x) === "optimized");
      return anaOf(p) === "optimized" || !optimized;
    }
    return p === this.current;
  }

  #findPath(): CtrlrPath | undefined {
    const cur = this.current;
    if (cur && available(cur)) {
      if (this.policy === "active_passive") return cur;
      if (this.selector === "round_robin") {
        if (++this.#rrCounter < this.rrMinIo) return cur;
        this.#rrCounter = 0;
      }
    }
    if (this.policy === "active_active" && this.selector === "queue_depth") {
      // _bdev_nvme_find_io_path_min_qd.
      let best: CtrlrPath | undefined;
      let bestRank = 2;
      let bestQd = Number.POSITIVE_INFINITY;
      for (const p of this.ctrlr.paths) {
        if (!available(p)) continue;
        const rank = anaOf(p) === "optimized" ? 0 : 1;
        const qd = this.#outstanding.get(p) ?? 0;
        if (rank < bestRank || (rank === bestRank && qd < bestQd)) [best, bestRank, bestQd] = [p, rank, qd];
      }
      return best;
    }
    // _bdev_nvme_find_io_path: from the path after the current one, round the list.
    const paths = this.ctrlr.paths;
    const from = cur ? paths.indexOf(cur) + 1 : 0;
    let nonOptimized: CtrlrPath | undefined;
    for (let i = 0; i < paths.length; i++) {
      const p = paths[(from + i) % paths.length] as CtrlrPath;
      if (!available(p)) continue;
      if (anaOf(p) === "optimized") {
        this.current = p;
        return p;
      }
      nonOptimized ??= p;
    }
    this.current = nonOptimized;
    return nonOptimized;
  }

  #mayBecomeAvailable(): boolean {
    return this.ctrlr.paths.some((p) => p.usable || !pathFailed(this.ctrlr, p));
  }

  async #submit<T>(cmd: (c: FabricController) => Promise<T>): Promise<T> {
    for (;;) {
      const p = this.#findPath();
      const conn = p?.fabric;
      if (p && conn) {
        this.#outstanding.set(p, (this.#outstanding.get(p) ?? 0) + 1);
        try {
          return await cmd(conn);
        } catch (err) {
          // bdev_nvme_check_retry_io: a path error clears the cached path.
          this.current = undefined;
          // Aborted by SQ deletion (the connection dropped) or an ANA path status: a path error,
          // retried at once on whatever path is usable; any other status fails the I/O (the
          // emulated target's errors all carry Do Not Retry).
          const pathError = conn.closed || (err instanceof ErrnoError && err.errno === PATH_ERRNO);
          if (!pathError) throw err;
          if (!this.#mayBecomeAvailable()) throw new ErrnoError(Errno.EIO, `${this.ctrlr.name}: path lost`);
          continue;
        } finally {
          this.#outstanding.set(p, (this.#outstanding.get(p) ?? 1) - 1);
        }
      }
      if (this.retryCount === 0 || !this.#mayBecomeAvailable()) {
        throw new ErrnoError(Errno.EIO, `controller ${this.ctrlr.name} has no usable path`);
      }
      await this.clock.sleep(NO_PATH_RETRY_MS);
    }
  }

  async read(offset: number, length: number): Promise<Buffer> {
    checkRange(offset, length, this.sizeBytes);
    return this.#submit((c) => c.read(this.nsid, offset, length));
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    checkRange(offset, data.length, this.sizeBytes);
    await this.#submit((c) => c.write(this.nsid, offset, data));
  }
}

/** Trids are the same path when transport, address, service and subsystem agree. */
export function sameTrid(a: Trid, b: Trid): boolean {
  return (
    a.trtype.toUpperCase() === b.trtype.toUpperCase() &&
    a.traddr === b.traddr &&
    (a.trsvcid ?? "") === (b.trsvcid ?? "") &&
    (a.subnqn ?? "") === (b.subnqn ?? "")
  );
}

/** nvme_bdev_dump_trid_json: members in order, empty ones omitted. */
export function tridJson(t: Trid): JsonValue {
  const out: { [key: string]: JsonValue } = { trtype: t.trtype };
  if (t.adrfam) out.adrfam = t.adrfam;
  if (t.traddr) out.traddr = t.traddr;
  if (t.trsvcid) out.trsvcid = t.trsvcid;
  if (t.subnqn) out.subnqn = t.subnqn;
  return out;
}

function namespaceJson(p: CtrlrPath, nsid: number): JsonValue {
  const pcie = p.trid.trtype === "PCIe";
  const d = p.ctrlrData;
  const out: { [key: string]: JsonValue } = {};
  if (pcie) out.pci_address = p.trid.traddr;
  out.trid = tridJson(p.trid);
  out.ctrlr_data = {
    cntlid: p.cntlid,
    vendor_id: d.vendorId,
    model_number: d.modelNumber,
    serial_number: d.serialNumber,
    firmware_revision: d.firmwareRevision,
    subnqn: d.subnqn,
    oacs: pcie
      ? { security: 0, format: 1, firmware: 1, ns_manage: 1 }
      : { security: 0, format: 0, firmware: 0, ns_manage: 0 },
    multi_ctrlr: !pcie,
    ana_reporting: p.fabric?.anaReporting ?? false,
  };
  out.vs = { nvme_version: d.nvmeVersion };
  // nvme_namespace_info_json prints the namespace's ANA state when the controller reports ANA.
  out.ns_data = p.fabric?.anaReporting
    ? { id: nsid, ana_state: p.fabric.anaState, can_share: !pcie }
    : { id: nsid, can_share: !pcie };
  return out;
}
