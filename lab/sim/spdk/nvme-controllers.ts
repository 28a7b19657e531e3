// The bdev_nvme module of one app: controllers attached over PCIe (simulated drives) or over the
// SimFabric (tcp/rdma, as an initiator such as SNAP or bdevperf), their namespace bdevs
// "<name>n<nsid>", path state, reconnects and detach.
import type { Clock } from "../../../lib/clock.ts";
import type { Logger } from "../../../lib/log.ts";
import { Bdev, type BdevRegistry, IO_TYPES, SYSTEM_DOMAIN } from "./bdev.ts";
import { type BlockIo, checkRange, FileExtentIo } from "./block-io.ts";
import { connectController, type FabricController, type SimFabric } from "./fabric.ts";
import type { HostDhchapOptions } from "./fabric-auth.ts";
import type { ControllerInfo, NamespaceInfo } from "./fabric-protocol.ts";
import type { JsonValue } from "./json-stream.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";
import type { PreparedDrive, SimDrive } from "./sim-drive.ts";

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

/** One path of a controller. */
export interface CtrlrPath {
  readonly trid: Trid;
  /** The fabric transport the path runs on (differs from trid.trtype for an alias like NVDA_TCP). */
  readonly transport: string;
  readonly hostaddr: string;
  readonly hostsvcid: string;
  state: "enabled" | "failed" | "reconnect_is_delayed" | "deleting";
  cntlid: number;
  ctrlrData: ControllerInfo;
  fabric: FabricController | undefined;
  /** Set while a PCIe path's namespaces are open. */
  files: FileExtentIo[];
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
  cancelReconnect?: () => void;
  lostAt?: number;
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
    const path: CtrlrPath = {
      trid,
      transport: "PCIe",
      hostaddr: "",
      hostsvcid: "",
      state: "enabled",
      cntlid: 0,
      ctrlrData,
      fabric: undefined,
      files: [],
    };
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
    const path: CtrlrPath = {
      trid: a.trid,
      transport: a.transport,
      hostaddr: a.hostaddr,
      hostsvcid: a.hostsvcid,
      state: "enabled",
      cntlid: conn.ctrlr.cntlid,
      ctrlrData: conn.ctrlr,
      fabric: conn,
      files: [],
    };
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
    const path: CtrlrPath = {
      trid: a.trid,
      transport: a.transport,
      hostaddr: a.hostaddr,
      hostsvcid: a.hostsvcid,
      state: "enabled",
      cntlid: conn.ctrlr.cntlid,
      ctrlrData: conn.ctrlr,
      fabric: conn,
      files: [],
    };
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
      p.state = "deleting";
      ctrlr.paths.splice(ctrlr.paths.indexOf(p), 1);
    }
    if (ctrlr.paths.length === 0) await this.#destruct(ctrlr);
    for (const p of victims) this.#closePath(p);
  }

  /** Drops every controller at once (a crashed app): connections cut, files closed. */
  crash(): void {
    for (const c of this.#ctrlrs) {
      c.cancelReconnect?.();
      for (const p of c.paths) {
        p.state = "deleting";
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

  async #destruct(ctrlr: NvmeCtrlr): Promise<void> {
    ctrlr.cancelReconnect?.();
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
    conn.onClose(() => {
      if (path.state === "deleting" || path.fabric !== conn) return;
      this.log.info("fabric path lost", {
        ctrlr: ctrlr.name,
        traddr: path.trid.traddr,
        trsvcid: path.trid.trsvcid,
      });
      // With reconnect_delay_sec 0 (the default) bdev_nvme leaves the controller failed.
      if (ctrlr.opts.reconnectDelaySec === 0) {
        path.state = "failed";
        return;
      }
      ctrlr.lostAt ??= this.clock.now();
      this.#scheduleReconnect(ctrlr, path);
    });
  }

  #scheduleReconnect(ctrlr: NvmeCtrlr, path: CtrlrPath): void {
    path.state = "reconnect_is_delayed";
    ctrlr.cancelReconnect = this.clock.setTimeout(() => {
      void this.#reconnect(ctrlr, path);
    }, ctrlr.opts.reconnectDelaySec * 1000);
  }

  async #reconnect(ctrlr: NvmeCtrlr, path: CtrlrPath): Promise<void> {
    if (!this.#ctrlrs.includes(ctrlr) || !ctrlr.paths.includes(path) || !this.fabric) return;
    try {
      const conn = await connectController(this.fabric, {
        trtype: path.transport,
        traddr: path.trid.traddr,
        trsvcid: path.trid.trsvcid ?? "",
        subnqn: path.trid.subnqn ?? "",
        hostnqn: ctrlr.hostnqn,
        hostid: this.hostid,
        hostaddr: path.hostaddr || undefined,
        dhchap: ctrlr.dhchap,
      });
      if (!this.#ctrlrs.includes(ctrlr) || !ctrlr.paths.includes(path)) {
        conn.close();
        return;
      }
      path.fabric = conn;
      path.cntlid = conn.ctrlr.cntlid;
      path.ctrlrData = conn.ctrlr;
      path.state = "enabled";
      ctrlr.lostAt = undefined;
      this.#watch(ctrlr, path);
      await this.#reconcile(ctrlr, conn.namespaces);
      this.log.info("fabric path reconnected", { ctrlr: ctrlr.name });
    } catch {
      const loss = ctrlr.opts.ctrlrLossTimeoutSec;
      const lostFor = (this.clock.now() - (ctrlr.lostAt ?? this.clock.now())) / 1000;
      if (loss !== -1 && lostFor >= loss) {
        this.log.info("controller loss timeout; deleting controller", { ctrlr: ctrlr.name });
        await this.#destruct(ctrlr);
        return;
      }
      this.#scheduleReconnect(ctrlr, path);
    }
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
    const io = new FabricNamespaceIo(ctrlr, ns.nsid);
    const bdev = this.#nvmeBdev(ctrlr, ns.nsid, io, -1, IO_TYPES.nvmeFabric, SYSTEM_DOMAIN);
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
    ioTypes: (typeof IO_TYPES)[keyof typeof IO_TYPES],
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
      memoryDomains,
      numaId,
      driverSpecific: () => ({
        nvme: ctrlr.paths.map((p) => namespaceJson(p, nsid)),
        mp_policy: "active_passive",
      }),
      onRemoved: () => {
        if (ctrlr.bdevs.get(nsid)?.uuid === ns.uuid) ctrlr.bdevs.delete(nsid);
      },
    });
  }
}

/** The data path of a namespace reached over the fabric, through the first usable path. */
class FabricNamespaceIo implements BlockIo {
  constructor(
    private readonly ctrlr: NvmeCtrlr,
    private readonly nsid: number,
  ) {}

  get sizeBytes(): number {
    const ns = this.ctrlr.namespaces.find((n) => n.nsid === this.nsid);
    return ns ? ns.numBlocks * ns.blockSize : 0;
  }

  #conn(): FabricController {
    const p = this.ctrlr.paths.find((x) => x.state === "enabled" && x.fabric && !x.fabric.closed);
    if (!p?.fabric) throw new ErrnoError(Errno.EIO, `controller ${this.ctrlr.name} has no usable path`);
    return p.fabric;
  }

  async read(offset: number, length: number): Promise<Buffer> {
    checkRange(offset, length, this.sizeBytes);
    return this.#conn().read(this.nsid, offset, length);
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    checkRange(offset, data.length, this.sizeBytes);
    await this.#conn().write(this.nsid, offset, data);
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
    ana_reporting: false,
  };
  out.vs = { nvme_version: d.nvmeVersion };
  out.ns_data = { id: nsid, can_share: !pcie };
  return out;
}
