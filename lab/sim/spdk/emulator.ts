// The SPDK nvmf_tgt emulator: one simulated target process on a unix RPC socket, faithful to
// v25.05.1 for the methods DISTORT uses, with simulated drives backed by sparse files, lvol
// metadata that survives crash() like metadata on a real drive, and a SimFabric data path.

import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { type Clock, realClock } from "../../../lib/clock.ts";
import { StorageError } from "../../../lib/errors.ts";
import { type Exec, hostExec } from "../../../lib/exec.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import { App, type AppConfig, type SimSpdkVersion } from "./app.ts";
import { checkRange, type FileExtent, zeroRange } from "./block-io.ts";
import { parseCoreMask } from "./core-mask.ts";
import type { SimFabric } from "./fabric.ts";
import { hostAddressCheck } from "./host-addresses.ts";
import type { MethodSpec } from "./method-table.ts";
import { bdevMethods } from "./methods/bdev.ts";
import { frameworkMethods } from "./methods/framework.ts";
import { fsdevMethods } from "./methods/fsdev.ts";
import { keyringMethods } from "./methods/keyring.ts";
import { lvolMethods } from "./methods/lvol.ts";
import { nbdMethods } from "./methods/nbd.ts";
import { nvmeMethods } from "./methods/nvme.ts";
import { nvmeSendCmdMethods } from "./methods/nvme-send-cmd.ts";
import { nvmfMethods } from "./methods/nvmf.ts";
import { raidMethods } from "./methods/raid.ts";
import { NbdExports } from "./nbd.ts";
import type { ListenAddress, Trtype } from "./nvmf-target.ts";
import { RPC_POLL_MS, RpcServer } from "./rpc-server.ts";
import { type PreparedDrive, prepareDrives, type SimDrive } from "./sim-drive.ts";

export type { SimFabric } from "./fabric.ts";
export type { SimDrive } from "./sim-drive.ts";

/** How to start an emulated nvmf_tgt. */
export interface SpdkEmulatorOptions {
  /** RPC socket path (nvmf_tgt -r). A stale socket is replaced; a live one fails the start. */
  readonly socketPath: string;
  /** Reactor core mask (nvmf_tgt -m), hex or "[0,2-3]"; default "0x1". */
  readonly coreMask?: string;
  /** nvmf_tgt --wait-for-rpc: start in STARTUP state until framework_start_init. */
  readonly waitForRpc?: boolean;
  /**
   * Where drive backing files (and thus lvol metadata on them) live, and the files of lvols whose
   * bytes are not kept in their drive's clusters (`lvols/`); created if missing.
   */
  readonly dataDir: string;
  /** Drives the target can attach over PCIe. */
  readonly drives?: readonly SimDrive[];
  /** Default host NQN of the initiator side; default "nqn.2014-08.org.nvmexpress:uuid:<host id>". */
  readonly hostNqn?: string;
  /** The fabric its listeners join and its fabric attaches use; without one nothing connects. */
  readonly fabric?: SimFabric;
  readonly logger?: Logger;
  /** Transports compiled in; default ["TCP", "RDMA"] (the reference capture had TCP only). */
  readonly transports?: readonly Trtype[];
  /**
   * Extra bdev_nvme_attach_controller trtype spellings and the transport each runs over, e.g.
   * { NVDA_TCP: "TCP" } for a SNAP-flavoured initiator; the trid keeps the given spelling.
   */
  readonly trtypeAliases?: Readonly<Record<string, Trtype>>;
  readonly clock?: Clock;
  /** How long asynchronous methods take to complete, in ms; default 1. */
  readonly asyncDelayMs?: number;
  /**
   * The RPC server's poll period in ms; default RPC_POLL_MS (4, SPDK's RPC_SELECT_INTERVAL), so a
   * call one at a time costs two polls as on a real target. 0 answers on arrival.
   */
  readonly rpcPollMs?: number;
  /** How long framework_start_init takes, in ms; default 10. */
  readonly initDelayMs?: number;
  /**
   * The IP addresses of the host the target runs on; a listener elsewhere is refused (-32602), as
   * bind() refuses an address the host does not have. The lab gives each storage node its portal.
   * Default: every address is the host's (see hostAddressCheck).
   */
  readonly hostAddresses?: readonly string[];
  /** The SPDK release to pose as (AppConfig.spdkVersion); default the recorded v25.05.1. */
  readonly spdkVersion?: SimSpdkVersion;
  /**
   * Enables nbd_start_disk / nbd_stop_disk / nbd_get_disks (SPDK's NBD export, as SNAP has it):
   * a directory this emulator mounts a FUSE block-files file system on (needs root and
   * /dev/fuse), one file per exported bdev, each attached to a loop device that stands in for
   * /dev/nbdN. Each process incarnation mounts it at start (clearing what a killed predecessor
   * left: its loop devices detached, its dead mount detached) and tears every export down and
   * unmounts when it stops, crashes or is closed. Without it the nbd methods are absent
   * ("Method not found") and nothing is mounted.
   */
  readonly nbdMountpoint?: string;
  /** Runs losetup and blockdev for the NBD stand-in; default the host's. */
  readonly nbdExec?: Exec;
}

/** Where the emulated process is in its life. */
export type EmulatorStatus = "up" | "down" | "closed";

/** A read-only picture of the emulator for test assertions (plain, frozen data). */
export interface EmulatorSnapshot {
  readonly status: EmulatorStatus;
  /** Framework state, null while down. */
  readonly framework: "startup" | "runtime" | null;
  readonly transports: readonly { readonly trtype: string }[];
  readonly subsystems: readonly {
    readonly nqn: string;
    readonly subtype: "NVMe" | "Discovery";
    readonly allowAnyHost: boolean;
    readonly hosts: readonly string[];
    readonly listeners: readonly ListenAddress[];
    readonly namespaces: readonly {
      readonly nsid: number;
      readonly bdevName: string;
      readonly uuid: string;
    }[];
    readonly controllers: readonly { readonly cntlid: number; readonly hostnqn: string }[];
  }[];
  readonly lvstores: readonly {
    readonly uuid: string;
    readonly name: string;
    readonly baseBdev: string;
    readonly clusterSize: number;
    readonly totalDataClusters: number;
    readonly freeClusters: number;
  }[];
  readonly lvols: readonly {
    readonly uuid: string;
    readonly name: string;
    readonly lvsName: string;
    readonly alias: string;
    readonly thin: boolean;
    readonly snapshot: boolean;
    readonly parent: string | null;
    readonly sizeBytes: number;
    readonly allocatedClusters: number;
  }[];
  readonly bdevs: readonly {
    readonly name: string;
    readonly aliases: readonly string[];
    readonly module: string;
    readonly blockSize: number;
    readonly numBlocks: number;
    readonly uuid: string;
    readonly claimed: boolean;
  }[];
  readonly nvmeControllers: readonly {
    readonly name: string;
    readonly trtype: string;
    readonly traddr: string;
    readonly trsvcid: string | undefined;
    readonly subnqn: string | undefined;
    readonly state: string;
    readonly hostnqn: string;
    readonly bdevs: readonly string[];
  }[];
  readonly keys: readonly { readonly name: string; readonly path: string }[];
  readonly fsdevs: readonly { readonly name: string; readonly rootPath: string }[];
}

/** Byte access to one bdev of the running emulator (tests and lab plumbing). */
export interface BdevHandle {
  readonly name: string;
  readonly blockSize: number;
  readonly numBlocks: number;
  read(offset: number, length: number): Promise<Buffer>;
  write(offset: number, data: Uint8Array): Promise<void>;
  /** What the target does with an NVMe Deallocate of the range: it reads as zeros afterwards. */
  unmap(offset: number, length: number): Promise<void>;
  /**
   * Where the bdev's bytes sit in the emulator's own files (an AIO file, a thick lvol's run of
   * drive clusters, a thin lvol's or clone's file), for lab-side tests that check bytes at rest;
   * undefined for snapshots and RAM. No RPC reply carries it, so nothing outside the lab can
   * come to rely on it.
   */
  fileExtent(): FileExtent | undefined;
}

/** A running (or crashed) emulator. */
export interface SpdkEmulator {
  readonly socketPath: string;
  /** The initiator side's default host NQN and host ID. */
  readonly hostNqn: string;
  readonly hostId: string;
  status(): EmulatorStatus;
  /** Snapshot for assertions; never a live reference. */
  state(): EmulatorSnapshot;
  /**
   * Kills the process: every connection cut without replies, runtime configuration lost
   * (transports, subsystems, listeners, hosts, controllers and their bdevs, AIO and malloc
   * bdevs, keys, fsdevs), the RPC socket left behind stale. Lvol metadata persists on the
   * drives. The emulator stays "down" until restart(). Rejects unless "up".
   */
  crash(): Promise<void>;
  /** Starts a fresh process on the same socket, drives and fabric. Rejects unless "down". */
  restart(): Promise<void>;
  /** Graceful shutdown (socket removed); idempotent, allowed in any state. */
  close(): Promise<void>;
  /** Registers a callback for spdk_kill_instance: the emulator has stopped ("down") on `signal`. */
  onExit(fn: (signal: string) => void): void;
  /** The bdev named (or aliased) `name`; StorageError "not-found" when absent or down. */
  bdev(name: string): BdevHandle;
}

/**
 * Starts an emulated nvmf_tgt and resolves once its RPC socket accepts connections. Rejects with
 * StorageError "invalid" for a bad core mask or drive list and "precondition" when another live
 * process serves the socket.
 */
export async function startSpdkEmulator(opts: SpdkEmulatorOptions): Promise<SpdkEmulator> {
  let cores: number[];
  let drives: PreparedDrive[];
  try {
    cores = parseCoreMask(opts.coreMask ?? "0x1");
    mkdirSync(opts.dataDir, { recursive: true });
    drives = prepareDrives(opts.dataDir, opts.drives ?? []);
  } catch (err) {
    throw new StorageError("invalid", (err as Error).message, { cause: err });
  }
  // The host ID goes with a uuid-form host NQN, as nvme-cli and SPDK hosts usually pair them.
  const uuidNqn = /^nqn\.2014-08\.org\.nvmexpress:uuid:([0-9a-fA-F-]{36})$/.exec(opts.hostNqn ?? "");
  const hostId = uuidNqn?.[1]?.toLowerCase() ?? randomUUID();
  const emu = new Emulator(opts, {
    drives,
    fabric: opts.fabric,
    cores,
    waitForRpc: opts.waitForRpc === true,
    transports: opts.transports ?? ["TCP", "RDMA"],
    hostNqn: opts.hostNqn ?? `nqn.2014-08.org.nvmexpress:uuid:${hostId}`,
    hostId,
    trtypeAliases: opts.trtypeAliases ?? {},
    clock: opts.clock ?? realClock,
    logger: opts.logger ?? silentLogger,
    initDelayMs: opts.initDelayMs ?? 10,
    lvolDir: join(opts.dataDir, "lvols"),
    hasAddress: hostAddressCheck(opts.hostAddresses),
    ...(opts.spdkVersion ? { spdkVersion: opts.spdkVersion } : {}),
  });
  await emu.boot();
  return emu;
}

class Emulator implements SpdkEmulator {
  #status: EmulatorStatus = "down";
  #app: App | undefined;
  #rpc: RpcServer | undefined;
  #nbd: NbdExports | undefined;
  readonly #exitListeners: ((signal: string) => void)[] = [];

  constructor(
    private readonly opts: SpdkEmulatorOptions,
    private readonly config: AppConfig,
  ) {}

  get socketPath(): string {
    return this.opts.socketPath;
  }

  get hostNqn(): string {
    return this.config.hostNqn;
  }

  get hostId(): string {
    return this.config.hostId;
  }

  status(): EmulatorStatus {
    return this.#status;
  }

  /** Builds a new App and RPC server (start and restart). */
  async boot(): Promise<void> {
    const methods = new Map<string, MethodSpec>();
    const app = new App(this.config, {
      pauseRpc: () => this.#rpc?.pause(),
      resumeRpc: () => this.#rpc?.resume(),
      kill: (signal) => void this.#killed(app, signal),
    });
    let nbd: NbdExports | undefined;
    if (this.opts.nbdMountpoint !== undefined) {
      try {
        nbd = await NbdExports.open({
          mountpoint: this.opts.nbdMountpoint,
          registry: app.registry,
          exec: this.opts.nbdExec ?? hostExec,
          logger: this.config.logger,
        });
      } catch (err) {
        throw new StorageError(
          "unavailable",
          `cannot serve NBD disks on ${this.opts.nbdMountpoint}: ${String(err)}`,
          {
            cause: err,
          },
        );
      }
    }
    for (const m of [
      ...frameworkMethods(app, () => methods),
      ...bdevMethods(app),
      ...lvolMethods(app),
      ...raidMethods(app),
      ...nvmeMethods(app),
      ...nvmeSendCmdMethods(app),
      ...nvmfMethods(app),
      ...keyringMethods(app),
      ...fsdevMethods(app),
      ...(nbd ? nbdMethods(app, nbd) : []),
    ]) {
      methods.set(m.name, m);
    }
    const rpc = new RpcServer({
      socketPath: this.opts.socketPath,
      logger: this.config.logger,
      methods,
      state: () => app.state,
      asyncDelayMs: this.opts.asyncDelayMs ?? 1,
      pollMs: this.opts.rpcPollMs ?? RPC_POLL_MS,
    });
    try {
      await rpc.start();
    } catch (err) {
      await nbd?.close();
      const busy = (err as { errno?: number }).errno === 16;
      throw new StorageError(
        busy ? "precondition" : "unavailable",
        `cannot serve ${this.opts.socketPath}: ${String(err)}`,
        {
          cause: err,
        },
      );
    }
    this.#app = app;
    this.#rpc = rpc;
    this.#nbd = nbd;
    this.#status = "up";
    this.config.logger.info("nvmf_tgt emulator up", {
      socket: this.opts.socketPath,
      cores: this.config.cores,
      waitForRpc: this.config.waitForRpc,
    });
  }

  async crash(): Promise<void> {
    if (this.#status !== "up") throw new StorageError("precondition", `emulator is ${this.#status}`);
    await this.#stop(true);
    this.config.logger.info("nvmf_tgt emulator crashed", { socket: this.opts.socketPath });
  }

  async restart(): Promise<void> {
    if (this.#status !== "down") throw new StorageError("precondition", `emulator is ${this.#status}`);
    await this.boot();
  }

  async close(): Promise<void> {
    if (this.#status === "up") await this.#stop(false);
    else if (this.#status === "down" && existsSync(this.opts.socketPath)) {
      // A crash left the socket file behind; a clean close removes it.
      try {
        unlinkSync(this.opts.socketPath);
      } catch {
        // gone already
      }
    }
    this.#status = "closed";
  }

  onExit(fn: (signal: string) => void): void {
    this.#exitListeners.push(fn);
  }

  bdev(name: string): BdevHandle {
    const app = this.#app;
    const b = app?.registry.get(name);
    if (!app || !b) throw new StorageError("not-found", `no bdev ${name}`);
    return {
      name: b.name,
      blockSize: b.blockSize,
      numBlocks: b.numBlocks,
      read: (offset, length) => {
        checkRange(offset, length, b.io.sizeBytes);
        return b.io.read(offset, length);
      },
      write: (offset, data) => {
        checkRange(offset, data.length, b.io.sizeBytes);
        return b.io.write(offset, data);
      },
      unmap: (offset, length) => {
        checkRange(offset, length, b.io.sizeBytes);
        return zeroRange(b.io, offset, length);
      },
      fileExtent: () => b.io.fileExtent?.(),
    };
  }

  state(): EmulatorSnapshot {
    const app = this.#app;
    const empty: EmulatorSnapshot = {
      status: this.#status,
      framework: null,
      transports: [],
      subsystems: [],
      lvstores: [],
      lvols: [],
      bdevs: [],
      nvmeControllers: [],
      keys: [],
      fsdevs: [],
    };
    if (!app || this.#status !== "up") return deepFreeze(empty);
    return deepFreeze({
      status: this.#status,
      framework: app.state,
      transports: [...app.target.transports.keys()].map((trtype) => ({ trtype })),
      subsystems: app.target.subsystems().map((s) => ({
        nqn: s.nqn,
        subtype: s.subtype,
        allowAnyHost: s.allowAnyHost,
        hosts: s.hosts.map((h) => h.nqn),
        listeners: s.listeners.map((l) => ({ ...l })),
        namespaces: s.sortedNamespaces().map((n) => ({ nsid: n.nsid, bdevName: n.bdev.name, uuid: n.uuid })),
        controllers: s.controllers.map((c) => ({ cntlid: c.cntlid, hostnqn: c.hostnqn })),
      })),
      lvstores: app.lvols.list().map((s) => ({
        uuid: s.bs.uuid,
        name: s.bs.name,
        baseBdev: s.base.name,
        clusterSize: s.bs.clusterSize,
        totalDataClusters: s.bs.layout.totalDataClusters,
        freeClusters: s.bs.freeClusters,
      })),
      lvols: app.lvols.list().flatMap((s) =>
        s.bs.lvols.map((l) => ({
          uuid: l.uuid,
          name: l.name,
          lvsName: s.bs.name,
          alias: `${s.bs.name}/${l.name}`,
          thin: l.thin,
          snapshot: l.snapshot,
          parent: l.parent?.uuid ?? null,
          sizeBytes: l.numClusters * s.bs.clusterSize,
          allocatedClusters: l.allocatedClusters,
        })),
      ),
      bdevs: app.registry.list().map((b) => ({
        name: b.name,
        aliases: [...b.aliases],
        module: b.module,
        blockSize: b.blockSize,
        numBlocks: b.numBlocks,
        uuid: b.uuid,
        claimed: b.claim !== null,
      })),
      nvmeControllers: app.nvme.list().map((c) => ({
        name: c.name,
        trtype: c.paths[0]?.trid.trtype ?? "",
        traddr: c.paths[0]?.trid.traddr ?? "",
        trsvcid: c.paths[0]?.trid.trsvcid,
        subnqn: c.paths[0]?.trid.subnqn,
        state: c.paths[0]?.state ?? "deleting",
        hostnqn: c.hostnqn,
        bdevs: [...c.bdevs.values()].map((b) => b.name),
      })),
      keys: app.keyring.list().map((k) => ({ name: k.name, path: k.path })),
      fsdevs: app.fsdevs.list().map((f) => ({ name: f.name, rootPath: f.rootPath })),
    });
  }

  /** Tears the running App down; `crash` skips every goodbye. */
  async #stop(crash: boolean): Promise<void> {
    const app = this.#app;
    const rpc = this.#rpc;
    const nbd = this.#nbd;
    this.#app = undefined;
    this.#rpc = undefined;
    this.#nbd = undefined;
    this.#status = "down";
    await rpc?.stop(crash);
    // Even a crash detaches: a dead SPDK's NBD disks lose their socket and fail, and a loop device
    // over a file no process serves would outlive the emulator (the crash is in-process).
    await nbd?.close();
    if (!app) return;
    app.nvme.crash();
    if (crash) await app.target.crash();
    else await app.target.shutdown();
    for (const b of app.registry.list()) b.init.onRemoved?.();
    app.lvols.closeAll();
  }

  async #killed(app: App, signal: string): Promise<void> {
    if (this.#app !== app || this.#status !== "up") return;
    if (signal === "SIGUSR1") return;
    if (signal === "SIGKILL") await this.#stop(true);
    else await this.#stop(false);
    this.config.logger.info("nvmf_tgt emulator stopped by spdk_kill_instance", { signal });
    for (const fn of this.#exitListeners) fn(signal);
  }
}

function deepFreeze<T>(v: T): T {
  if (v && typeof v === "object") {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
}
