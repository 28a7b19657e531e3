// The lab host's NVMe-oF driver, as the kernel's nvme-core/nvme-fabrics/multipath keep it: fabric
// controllers (paths) per subsystem with keep-alive, reconnect every reconnect_delay until
// ctrl_loss_tmo, fast_io_fail_tmo, and one block device per namespace (a FUSE file under a loop
// device) whose every read, write, flush, discard and write-zeroes is a command on a live path.

import {
  type ConnectedSubsystem,
  type ConnectParams,
  type ConnectSecrets,
  type NvmeInitiator,
  namespaceIdDigits,
} from "../../../csi/host/nvme-initiator.ts";
import { KeyedMutex } from "../../../lib/concurrency/keyed-mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec } from "../../../lib/exec.ts";
import { runChecked } from "../../../lib/exec.ts";
import { detachArgv, parseAttached, setCapacityArgv } from "../../../lib/host/losetup.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import { connectController, type FabricController, type SimFabric } from "../spdk/fabric.ts";
import type { AnaState, NamespaceInfo } from "../spdk/fabric-protocol.ts";

/** What serves one block file (the FUSE server's handler contract, lab/sim/fuse/block-files.ts). */
export interface HostBlockHandler {
  size(): number;
  read(offset: number, length: number): Promise<Uint8Array>;
  write(offset: number, data: Uint8Array): Promise<void>;
  flush(): Promise<void>;
  discard(offset: number, length: number): Promise<void>;
  writeZeroes(offset: number, length: number): Promise<void>;
}

/** The block-file mount the host shows its namespaces in. */
export interface HostBlockFiles {
  readonly mountpoint: string;
  add(name: string, h: HostBlockHandler): void;
  remove(name: string): void;
}

export interface NvmeHostOptions {
  fabric: SimFabric;
  files: HostBlockFiles;
  /** Runs losetup. */
  exec: Exec;
  /** Host ID presented on connect (/etc/nvme/hostid). */
  hostId: string;
  logger?: Logger;
  /** Keep Alive Timeout in ms; the kernel's default for fabrics is 5 s (NVME_DEFAULT_KATO). */
  katoMs?: number;
  /** Deadline of each losetup. Default 30 s. */
  commandTimeoutMs?: number;
}

// nvme-cli's defaults (drivers/nvme/host/fabrics.h): reconnect every 10 s for 600 s, no fast fail.
const DEFAULT_RECONNECT_DELAY_S = 10;
const DEFAULT_CTRL_LOSS_TMO_S = 600;
const DEFAULT_KATO_MS = 5000;

type PathState = "live" | "connecting" | "deleting";

interface Path {
  readonly name: string;
  readonly instance: number;
  readonly transport: "tcp" | "rdma";
  readonly traddr: string;
  readonly trsvcid: string;
  /** The DH-HMAC-CHAP secrets it connected with, kept for reconnects as the kernel keeps its options. */
  readonly dhchap: ConnectSecrets | undefined;
  /** The TLS PSK it connected with (the kernel keeps the key serial for reconnects). */
  readonly tls: { readonly psk: string } | undefined;
  state: PathState;
  ctrl: FabricController | undefined;
  /** When the link was lost (the start of ctrl_loss_tmo and fast_io_fail_tmo). */
  lostAt: number | undefined;
  /** fast_io_fail_tmo passed while connecting: queued and new I/O fail instead of waiting. */
  failfast: boolean;
  timers: ReturnType<typeof setTimeout>[];
}

interface HostNamespace {
  readonly nsid: number;
  uuid: string;
  nguid: string;
  blockSize: number;
  sizeBytes: number;
  /** The FUSE file's name and the loop device over it. */
  readonly file: string;
  device: string;
}

interface Subsys {
  readonly nqn: string;
  readonly hostNqn: string;
  readonly instance: number;
  readonly ctrlLossTmo: number;
  readonly reconnectDelay: number;
  readonly fastIoFailTmo: number;
  readonly paths: Path[];
  readonly namespaces: Map<number, HostNamespace>;
  /** Set once the subsystem is gone (disconnected or every path lost): its devices answer EIO. */
  gone: boolean;
  /** Wakes I/O held while no path was usable. */
  waiters: Set<() => void>;
}

/**
 * The host's NVMe driver. connect/disconnect/list/findNamespaceDevice/rescan follow the
 * NvmeInitiator port (csi/host/nvme-initiator.ts); calls for one NQN are serialised inside.
 * Block I/O on a namespace goes to a live path, optimized ANA paths first (numa-like: the first
 * usable one), and is held while every path reconnects, failed with EIO once fast_io_fail_tmo
 * passed for all of them or the subsystem is gone. A path whose link stays lost for
 * ctrl_loss_tmo is deleted; the subsystem and its devices go with its last path.
 */
export class NvmeHost implements NvmeInitiator {
  readonly #fabric: SimFabric;
  readonly #files: HostBlockFiles;
  readonly #exec: Exec;
  readonly #hostId: string;
  readonly #log: Logger;
  readonly #kato: number;
  readonly #timeoutMs: number;
  readonly #subsystems = new Map<string, Subsys>();
  readonly #lock = new KeyedMutex();
  /** Files of subsystems lost to ctrl_loss_tmo: still served (every request EIO) until reused. */
  readonly #retired = new Set<string>();
  #closed = false;

  constructor(o: NvmeHostOptions) {
    this.#fabric = o.fabric;
    this.#files = o.files;
    this.#exec = o.exec;
    this.#hostId = o.hostId;
    this.#log = (o.logger ?? silentLogger).with({ component: "nvme-host" });
    this.#kato = o.katoMs ?? DEFAULT_KATO_MS;
    this.#timeoutMs = o.commandTimeoutMs ?? 30_000;
  }

  /**
   * Adds a path to subsystem `p.nqn` at `p.address:p.port` (creating the subsystem and its
   * namespace devices on the first). Resolves at once when that path exists. StorageError
   * "unavailable" when the target cannot be reached or refuses the host, "precondition" when the
   * subsystem is connected with another host NQN.
   */
  connect(p: ConnectParams): Promise<void> {
    return this.#lock.run(p.nqn, async () => {
      const trsvcid = String(p.port);
      let sub = this.#subsystems.get(p.nqn);
      if (sub && sub.hostNqn !== p.hostNqn) {
        throw new StorageError(
          "precondition",
          `subsystem ${p.nqn} is connected as ${sub.hostNqn}, not ${p.hostNqn}`,
        );
      }
      if (sub?.paths.some((x) => x.traddr === p.address && x.trsvcid === trsvcid && x.state !== "deleting"))
        return;
      const ctrl = await this.#dial(p.nqn, p.hostNqn, p.transport, p.address, trsvcid, p.dhchap, p.tls);
      if (sub) this.#refuseDuplicateCntlid(sub, undefined, ctrl);
      const created = sub === undefined;
      if (!sub) {
        sub = {
          nqn: p.nqn,
          hostNqn: p.hostNqn,
          instance: this.#freeSubsysInstance(),
          ctrlLossTmo: p.ctrlLossTmo ?? DEFAULT_CTRL_LOSS_TMO_S,
          reconnectDelay: p.reconnectDelay ?? DEFAULT_RECONNECT_DELAY_S,
          fastIoFailTmo: p.fastIoFailTmo ?? -1,
          paths: [],
          namespaces: new Map(),
          gone: false,
          waiters: new Set(),
        };
      }
      const instance = this.#freePathInstance();
      const path: Path = {
        name: `nvme${instance}`,
        instance,
        transport: p.transport,
        traddr: p.address,
        trsvcid,
        dhchap: p.dhchap,
        tls: p.tls,
        state: "live",
        ctrl: undefined,
        lostAt: undefined,
        failfast: false,
        timers: [],
      };
      sub.paths.push(path);
      if (created) this.#subsystems.set(p.nqn, sub);
      this.#adopt(sub, path, ctrl);
      try {
        await this.#scan(sub, ctrl.namespaces);
      } catch (err) {
        if (created) await this.#remove(sub);
        else this.#dropPath(sub, path);
        throw err;
      }
      this.#log.info("connected", {
        nqn: p.nqn,
        path: path.name,
        traddr: p.address,
        trsvcid,
        namespaces: ctrl.namespaces.length,
      });
    });
  }

  /** Deletes every path of `nqn` and its namespace devices; resolves when none is left. Idempotent. */
  disconnect(nqn: string): Promise<void> {
    return this.#lock.run(nqn, async () => {
      const sub = this.#subsystems.get(nqn);
      if (sub) await this.#remove(sub);
    });
  }

  /** Subsystems and their paths, as `nvme list-subsys` prints them. */
  async list(): Promise<ConnectedSubsystem[]> {
    return [...this.#subsystems.values()]
      .sort((a, b) => a.instance - b.instance)
      .map((s) => ({
        nqn: s.nqn,
        hostNqn: s.hostNqn,
        name: `nvme-subsys${s.instance}`,
        paths: s.paths.map((p) => ({
          name: p.name,
          transport: p.transport,
          traddr: p.traddr,
          trsvcid: p.trsvcid,
          state: p.state,
        })),
      }));
  }

  /** The loop device of namespace `namespaceId` (UUID/NGUID) of `nqn`, or of its only namespace. */
  async findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined> {
    const want = namespaceId === undefined ? undefined : namespaceIdDigits(namespaceId);
    if (namespaceId !== undefined && want === undefined) {
      throw new StorageError("invalid", `namespace id ${JSON.stringify(namespaceId)} is not a UUID or NGUID`);
    }
    const sub = this.#subsystems.get(nqn);
    if (!sub) return undefined;
    const all = [...sub.namespaces.values()];
    if (want === undefined) {
      if (all.length > 1) {
        throw new StorageError(
          "precondition",
          `subsystem ${nqn} has ${all.length} namespaces and no namespace UUID was given`,
        );
      }
      return all[0]?.device;
    }
    return all.find((ns) => namespaceIdDigits(ns.uuid) === want || namespaceIdDigits(ns.nguid) === want)
      ?.device;
  }

  /** Rescans namespaces on a live path: new ones get devices, resized ones their new capacity. */
  rescan(nqn: string): Promise<void> {
    return this.#lock.run(nqn, async () => {
      const sub = this.#subsystems.get(nqn);
      const ctrl = sub?.paths.find((p) => p.state === "live")?.ctrl;
      if (!sub || !ctrl)
        throw new StorageError("not-found", `subsystem ${nqn} has no live controller to rescan`);
      await this.#scan(sub, ctrl.namespaces);
    });
  }

  /** Tears everything down (the host shutting down): every subsystem disconnected. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const sub of [...this.#subsystems.values()]) await this.#lock.run(sub.nqn, () => this.#remove(sub));
    for (const f of this.#retired) this.#files.remove(f);
    this.#retired.clear();
  }

  async #dial(
    nqn: string,
    hostNqn: string,
    transport: string,
    traddr: string,
    trsvcid: string,
    dhchap: ConnectSecrets | undefined,
    tls?: { readonly psk: string },
  ): Promise<FabricController> {
    try {
      return await connectController(this.#fabric, {
        ...(dhchap === undefined ? {} : { dhchap }),
        ...(tls === undefined ? {} : { tls }),
        trtype: transport.toUpperCase(),
        traddr,
        trsvcid,
        subnqn: nqn,
        hostnqn: hostNqn,
        hostid: this.#hostId,
        kato: this.#kato,
      });
    } catch (err) {
      throw new StorageError(
        "unavailable",
        `connect to ${nqn} at ${transport}:${traddr}:${trsvcid} failed: ${(err as Error).message}`,
        { cause: err, details: { nqn } },
      );
    }
  }

  /** Makes `ctrl` the live controller of `path` and watches it for loss and notices. */
  #adopt(sub: Subsys, path: Path, ctrl: FabricController): void {
    path.ctrl = ctrl;
    path.state = "live";
    path.lostAt = undefined;
    path.failfast = false;
    for (const t of path.timers) clearTimeout(t);
    path.timers = [];
    ctrl.onNamespaces((ns) => {
      if (path.ctrl === ctrl) void this.#lock.run(sub.nqn, () => this.#scan(sub, ns)).catch(() => {});
    });
    ctrl.onAnaState(() => this.#wake(sub));
    ctrl.onClose(() => {
      if (path.ctrl !== ctrl || path.state === "deleting") return;
      this.#lost(sub, path);
    });
    this.#wake(sub);
  }

  /**
   * The link of `path` dropped: "connecting", a reconnect every reconnect_delay, fast fail after
   * fast_io_fail_tmo, deletion after ctrl_loss_tmo (nvme_tcp_error_recovery_work and
   * nvme_tcp_reconnect_or_remove).
   */
  #lost(sub: Subsys, path: Path): void {
    path.ctrl = undefined;
    path.state = "connecting";
    path.lostAt = Date.now();
    this.#log.info("path lost, reconnecting", { nqn: sub.nqn, path: path.name });
    if (sub.fastIoFailTmo >= 0) {
      path.timers.push(
        setTimeout(() => {
          if (path.state !== "connecting") return;
          path.failfast = true;
          this.#log.info("fast_io_fail_tmo passed, failing I/O", { nqn: sub.nqn, path: path.name });
          this.#wake(sub);
        }, sub.fastIoFailTmo * 1000),
      );
    }
    this.#scheduleReconnect(sub, path);
    this.#wake(sub);
  }

  /**
   * As the kernel's nvme core does: a controller whose ID repeats one another path of the same
   * subsystem already holds is refused (closed, StorageError "unavailable"), since the host
   * tells a subsystem's controllers apart by it.
   */
  #refuseDuplicateCntlid(sub: Subsys, self: Path | undefined, ctrl: FabricController): void {
    const id = ctrl.ctrlr.cntlid;
    const other = sub.paths.find((x) => x !== self && x.ctrl !== undefined && x.ctrl.ctrlr.cntlid === id);
    if (!other) return;
    ctrl.close();
    throw new StorageError(
      "unavailable",
      `duplicate cntlid ${id} with ${other.name} in subsystem ${sub.nqn}: the new controller is refused`,
    );
  }

  #scheduleReconnect(sub: Subsys, path: Path): void {
    if (this.#closed) return;
    path.timers.push(setTimeout(() => void this.#reconnect(sub, path), sub.reconnectDelay * 1000));
  }

  async #reconnect(sub: Subsys, path: Path): Promise<void> {
    if (path.state !== "connecting" || sub.gone) return;
    try {
      const ctrl = await this.#dial(
        sub.nqn,
        sub.hostNqn,
        path.transport,
        path.traddr,
        path.trsvcid,
        path.dhchap,
        path.tls,
      );
      if (path.state !== "connecting" || sub.gone) {
        ctrl.close();
        return;
      }
      this.#refuseDuplicateCntlid(sub, path, ctrl);
      this.#log.info("path reconnected", { nqn: sub.nqn, path: path.name });
      this.#adopt(sub, path, ctrl);
      void this.#lock.run(sub.nqn, () => this.#scan(sub, ctrl.namespaces)).catch(() => {});
    } catch (err) {
      const lostMs = Date.now() - (path.lostAt ?? Date.now());
      const give = sub.ctrlLossTmo >= 0 && lostMs + sub.reconnectDelay * 1000 > sub.ctrlLossTmo * 1000;
      this.#log.info("reconnect failed", { nqn: sub.nqn, path: path.name, error: (err as Error).message });
      if (!give) return this.#scheduleReconnect(sub, path);
      // ctrl_loss_tmo: the controller is removed; the namespace head goes with its last path.
      this.#log.info("controller lost after ctrl_loss_tmo, removing", { nqn: sub.nqn, path: path.name });
      await this.#lock.run(sub.nqn, async () => {
        if (this.#subsystems.get(sub.nqn) !== sub) return;
        this.#dropPath(sub, path);
        if (sub.paths.length === 0) await this.#remove(sub, true);
      });
    }
  }

  #dropPath(sub: Subsys, path: Path): void {
    path.state = "deleting";
    for (const t of path.timers) clearTimeout(t);
    path.timers = [];
    path.ctrl?.close();
    path.ctrl = undefined;
    const at = sub.paths.indexOf(path);
    if (at >= 0) sub.paths.splice(at, 1);
    this.#wake(sub);
  }

  /** Removes the subsystem: paths deleted, held I/O failed, loop devices detached, files removed. */
  async #remove(sub: Subsys, lost = false): Promise<void> {
    sub.gone = true;
    for (const p of [...sub.paths]) this.#dropPath(sub, p);
    this.#subsystems.delete(sub.nqn);
    for (const ns of sub.namespaces.values()) {
      // A mounted loop device is only marked for autoclear, as the kernel defers it.
      if (ns.device) await this.#losetup(detachArgv(ns.device)).catch(() => {});
      // A lost namespace's file keeps answering EIO (its handler sees the subsystem gone), as
      // I/O to a removed NVMe namespace fails with EIO; a disconnected one goes at once.
      if (lost) this.#retired.add(ns.file);
      else this.#files.remove(ns.file);
    }
    sub.namespaces.clear();
    this.#wake(sub);
    this.#log.info("subsystem removed", { nqn: sub.nqn });
  }

  /** Brings the namespace devices in line with `list`: new ones attached, resized ones grown. */
  async #scan(sub: Subsys, list: readonly NamespaceInfo[]): Promise<void> {
    if (sub.gone) return;
    for (const info of list) {
      const known = sub.namespaces.get(info.nsid);
      const size = info.numBlocks * info.blockSize;
      if (known) {
        known.uuid = info.uuid;
        known.nguid = info.nguid;
        if (known.sizeBytes !== size) {
          known.sizeBytes = size;
          await this.#losetup(setCapacityArgv(known.device));
        }
        continue;
      }
      const ns: HostNamespace = {
        nsid: info.nsid,
        uuid: info.uuid,
        nguid: info.nguid,
        blockSize: info.blockSize,
        sizeBytes: size,
        file: `nvme${sub.instance}n${info.nsid}`,
        device: "",
      };
      if (this.#retired.delete(ns.file)) this.#files.remove(ns.file);
      this.#files.add(ns.file, this.#handler(sub, ns));
      try {
        // --direct-io=on: the loop driver submits its requests to the FUSE file as asynchronous
        // direct I/O (FUSE_ASYNC_DIO), so several are in flight at once and become commands in
        // flight together on the I/O queue, like the block layer's queue depth over NVMe. With
        // it off, loop sends one buffered request at a time and waits for each.
        ns.device = parseAttached(
          await this.#losetup([
            "losetup",
            "--find",
            "--show",
            "--direct-io=on",
            `${this.#files.mountpoint}/${ns.file}`,
          ]),
        );
        // A new NVMe namespace is a new, writable disk. A loop device is reused, and BLKROSET
        // (blockdev --setro, which a reader-only stage sets) outlives its detach.
        await this.#losetup(["blockdev", "--setrw", ns.device]);
      } catch (err) {
        if (ns.device) await this.#losetup(detachArgv(ns.device)).catch(() => {});
        this.#files.remove(ns.file);
        throw err;
      }
      sub.namespaces.set(ns.nsid, ns);
    }
  }

  #losetup(argv: string[]): Promise<string> {
    return runChecked(this.#exec, argv, { timeoutMs: this.#timeoutMs });
  }

  /** The block file handler of `ns`: every call a command on a usable path of `sub`. */
  #handler(sub: Subsys, ns: HostNamespace): HostBlockHandler {
    return {
      size: () => ns.sizeBytes,
      read: (offset, length) => this.#submit(sub, (c) => c.read(ns.nsid, offset, length)),
      write: (offset, data) => this.#submit(sub, (c) => c.write(ns.nsid, offset, data)),
      flush: () => this.#submit(sub, (c) => c.flush(ns.nsid)),
      discard: (offset, length) => this.#submit(sub, (c) => c.discard(ns.nsid, offset, length)),
      writeZeroes: (offset, length) => this.#submit(sub, (c) => c.writeZeroes(ns.nsid, offset, length)),
    };
  }

  /**
   * nvme_ns_head_submit_bio: on a usable path now; else held until one is usable while some path
   * may still come back (connecting, not failfast), else EIO. A command that fails because its
   * path dropped is retried on the next usable path (nvme_failover_req); a command the target
   * answered with an error fails with it.
   */
  async #submit<T>(sub: Subsys, cmd: (c: FabricController) => Promise<T>): Promise<T> {
    for (;;) {
      if (sub.gone) throw new Error("namespace is gone");
      const path = pickPath(sub.paths);
      if (path?.ctrl) {
        const ctrl = path.ctrl;
        try {
          return await cmd(ctrl);
        } catch (err) {
          if (!ctrl.closed) throw err;
          continue;
        }
      }
      // nvme_available_path: a path that may still serve (live but ANA-inaccessible, or
      // reconnecting before fast_io_fail_tmo) keeps the I/O queued.
      if (!sub.paths.some((p) => p.state === "live" || (p.state === "connecting" && !p.failfast))) {
        throw new Error("no usable path");
      }
      await new Promise<void>((resolve) => sub.waiters.add(resolve));
    }
  }

  #wake(sub: Subsys): void {
    const w = [...sub.waiters];
    sub.waiters.clear();
    for (const fn of w) fn();
  }

  #freeSubsysInstance(): number {
    const used = new Set([...this.#subsystems.values()].map((s) => s.instance));
    let i = 0;
    while (used.has(i)) i++;
    return i;
  }

  #freePathInstance(): number {
    const used = new Set([...this.#subsystems.values()].flatMap((s) => s.paths.map((p) => p.instance)));
    let i = 0;
    while (used.has(i)) i++;
    return i;
  }
}

const ANA_RANK: Record<AnaState, number> = {
  optimized: 0,
  non_optimized: 1,
  inaccessible: 9,
  persistent_loss: 9,
  change: 9,
};

/** The path I/O goes to: the first live one in the best ANA state; none when no live path is accessible. */
export function pickPath<P extends { state: PathState; ctrl: FabricController | undefined }>(
  paths: readonly P[],
): P | undefined {
  let best: P | undefined;
  let rank = 9;
  for (const p of paths) {
    if (p.state !== "live" || !p.ctrl || p.ctrl.closed) continue;
    const r = ANA_RANK[p.ctrl.anaState];
    if (r < rank) {
      best = p;
      rank = r;
    }
  }
  return best;
}
