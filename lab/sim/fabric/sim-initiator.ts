// The lab's NvmeInitiator: connects to an emulated target through the SimFabric with the host and
// subsystem NQNs (the target's ACL decides, as on a real fabric) and shows each namespace as a loop
// device over the namespace's backing file extent, so staging runs real blkid, mkfs and mount.
// What the fabric carries here is admission, identity and liveness; the loop device reads and
// writes the backing file directly, which is coherent with the target because both go through
// the same page cache of the same file. Backings are AIO files and lvols kept in a file of their
// own (the whole file), and thick lvols in a run of clusters on the drive file (with --offset and
// --sizelimit); a namespace the target grew is followed on rescan by re-reading the file's size or
// raising the size limit.
import { statSync } from "node:fs";
import {
  attachArgv,
  detachArgv,
  LOSETUP_LIST_ARGV,
  type LoopDevice,
  parseAttached,
  parseLosetupList,
  setCapacityArgv,
} from "../../../csi/host/losetup.ts";
import {
  type ConnectedSubsystem,
  type ConnectParams,
  type NvmeInitiator,
  namespaceIdDigits,
} from "../../../csi/host/nvme-initiator.ts";
import { type Clock, realClock } from "../../../lib/clock.ts";
import { KeyedMutex } from "../../../lib/concurrency/keyed-mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import { type Exec, runChecked } from "../../../lib/exec.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import { connectController, type FabricController, type SimFabric } from "../spdk/fabric.ts";
import type { NamespaceInfo } from "../spdk/fabric-protocol.ts";
import { ConnectionStore, type SimConnection, type SimNamespace } from "./connection-store.ts";
import { kernelLoopControl, type LoopControl } from "./loop-control.ts";
import type { NamespaceBacking, NamespaceBackingResolver } from "./namespace-backing.ts";

export interface SimInitiatorOptions {
  fabric: SimFabric;
  /** Where connections persist; a new initiator on the same directory finds them again. */
  stateDir: string;
  /** Runs losetup. */
  exec: Exec;
  backing: NamespaceBackingResolver;
  clock?: Clock;
  logger?: Logger;
  /** Deadline of each losetup. Default 30 s. */
  commandTimeoutMs?: number;
  /** Changes the extent of an attached loop device; default the kernel's (LOOP_SET_STATUS64). */
  loopControl?: LoopControl;
}

// How often an attach is retried when the namespace's extent moved while it was being attached.
const ATTACH_ATTEMPTS = 3;

// The kernel's defaults, used when the connect did not set them.
const DEFAULT_RECONNECT_DELAY_S = 10;
const DEFAULT_CTRL_LOSS_TMO_S = 600;

interface Live {
  ctrl: FabricController | undefined;
  /** Set when the fabric connection dropped without our disconnect. */
  lostAt: number | undefined;
  lastAttempt: number | undefined;
}

/**
 * An NvmeInitiator on the SimFabric and loop devices. Calls for one NQN are serialised inside;
 * calls for different NQNs run concurrently. A connection whose fabric link dropped (target
 * crash, host removed from the ACL) reports "connecting" and is re-established at most every
 * reconnect delay when listed, like the kernel's reconnect work; its loop devices stay until
 * ctrl-loss-tmo has passed, after which the controller and its devices are gone (a negative
 * ctrl-loss-tmo reconnects forever). Time is the injected Clock's.
 */
export class SimNvmeInitiator implements NvmeInitiator {
  readonly #fabric: SimFabric;
  readonly #store: ConnectionStore;
  readonly #exec: Exec;
  readonly #backing: NamespaceBackingResolver;
  readonly #loopControl: LoopControl;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #timeoutMs: number;
  readonly #hostId: string;
  readonly #live = new Map<string, Live>();
  readonly #lock = new KeyedMutex();

  constructor(opts: SimInitiatorOptions) {
    this.#fabric = opts.fabric;
    this.#store = new ConnectionStore(opts.stateDir);
    this.#exec = opts.exec;
    this.#backing = opts.backing;
    this.#loopControl = opts.loopControl ?? kernelLoopControl;
    this.#clock = opts.clock ?? realClock;
    this.#log = (opts.logger ?? silentLogger).with({ component: "sim-initiator" });
    this.#timeoutMs = opts.commandTimeoutMs ?? 30_000;
    this.#hostId = this.#store.hostId();
  }

  /** The host ID presented on connect (persisted like /etc/nvme/hostid). */
  get hostId(): string {
    return this.#hostId;
  }

  connect(p: ConnectParams): Promise<void> {
    return this.#lock.run(p.nqn, async () => {
      const existing = this.#store.get(p.nqn);
      const live = this.#live.get(p.nqn);
      if (
        existing &&
        live?.ctrl &&
        !live.ctrl.closed &&
        existing.traddr === p.address &&
        existing.trsvcid === String(p.port)
      ) {
        return;
      }
      const ctrl = await this.#dial(p.nqn, p.hostNqn, p.transport, p.address, String(p.port));
      const attachedNow: string[] = [];
      try {
        const loops = await this.#loops();
        const namespaces: SimNamespace[] = [];
        for (const ns of ctrl.namespaces) {
          const { record, created } = await this.#attach(p.nqn, ns, loops, existing);
          namespaces.push(record);
          if (created) attachedNow.push(record.device);
        }
        this.#store.put({
          nqn: p.nqn,
          hostNqn: p.hostNqn,
          transport: p.transport,
          traddr: p.address,
          trsvcid: String(p.port),
          ctrlLossTmo: p.ctrlLossTmo,
          reconnectDelay: p.reconnectDelay,
          fastIoFailTmo: p.fastIoFailTmo,
          instance: existing?.instance ?? this.#store.freeInstance(),
          namespaces,
        });
      } catch (err) {
        ctrl.close();
        // Loop devices this attempt attached go again; ones an earlier connect recorded stay.
        for (const device of attachedNow) await this.#detachQuietly(device);
        throw err;
      }
      this.#adopt(p.nqn, ctrl);
      this.#log.info("connected", { nqn: p.nqn, host: p.hostNqn, namespaces: ctrl.namespaces.length });
    });
  }

  disconnect(nqn: string): Promise<void> {
    return this.#lock.run(nqn, async () => {
      const live = this.#live.get(nqn);
      this.#live.delete(nqn);
      live?.ctrl?.close();
      const rec = this.#store.get(nqn);
      if (rec === undefined) return;
      const attached = new Set((await this.#loops()).map((l) => l.name));
      for (const ns of rec.namespaces) {
        if (attached.has(ns.device))
          await runChecked(this.#exec, detachArgv(ns.device), { timeoutMs: this.#timeoutMs });
      }
      this.#store.delete(nqn);
      this.#log.info("disconnected", { nqn });
    });
  }

  async list(): Promise<ConnectedSubsystem[]> {
    const out: ConnectedSubsystem[] = [];
    for (const rec of this.#store.list()) {
      const state = await this.#lock.run(rec.nqn, () => this.#revive(rec));
      if (state === undefined) continue;
      out.push({
        nqn: rec.nqn,
        hostNqn: rec.hostNqn,
        name: `nvme-subsys${rec.instance}`,
        paths: [
          {
            name: `nvme${rec.instance}`,
            transport: rec.transport,
            traddr: rec.traddr,
            trsvcid: rec.trsvcid,
            state,
          },
        ],
      });
    }
    return out;
  }

  async findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined> {
    const want = namespaceId === undefined ? undefined : namespaceIdDigits(namespaceId);
    if (namespaceId !== undefined && want === undefined) {
      throw new StorageError("invalid", `namespace id ${JSON.stringify(namespaceId)} is not a UUID or NGUID`);
    }
    const rec = this.#store.get(nqn);
    if (rec === undefined) return undefined;
    if (want === undefined) {
      if (rec.namespaces.length > 1) {
        throw new StorageError(
          "precondition",
          `subsystem ${nqn} has ${rec.namespaces.length} namespaces and no namespace UUID was given`,
        );
      }
      return rec.namespaces[0]?.device;
    }
    return rec.namespaces.find(
      (ns) => namespaceIdDigits(ns.uuid) === want || namespaceIdDigits(ns.nguid) === want,
    )?.device;
  }

  rescan(nqn: string): Promise<void> {
    return this.#lock.run(nqn, async () => {
      const rec = this.#store.get(nqn);
      const ctrl = this.#live.get(nqn)?.ctrl;
      if (rec === undefined || ctrl === undefined || ctrl.closed) {
        throw new StorageError("not-found", `subsystem ${nqn} has no live controller to rescan`);
      }
      const loops = await this.#loops();
      // A namespace missing from the current list keeps its loop device: the target may be between
      // removing and re-adding it, and dropping the record would orphan the device.
      const namespaces: SimNamespace[] = [...rec.namespaces];
      for (const ns of ctrl.namespaces) {
        const at = namespaces.findIndex((k) => k.nsid === ns.nsid);
        const known = namespaces[at];
        if (known === undefined) namespaces.push((await this.#attach(nqn, ns, loops, rec)).record);
        else if (known.sizeBytes !== ns.numBlocks * ns.blockSize)
          namespaces[at] = await this.#resize(nqn, known, ns);
      }
      this.#store.put({ ...rec, namespaces });
    });
  }

  /**
   * Drops this process's fabric links, as the process exiting would. Persisted connections and
   * loop devices stay: a new initiator on the same state directory finds and re-dials them.
   */
  close(): void {
    const links = [...this.#live.values()];
    this.#live.clear();
    for (const l of links) l.ctrl?.close();
  }

  /** Opens a fabric connection; a refusal is what a real `nvme connect` reports: an error. */
  async #dial(
    nqn: string,
    hostNqn: string,
    transport: string,
    traddr: string,
    trsvcid: string,
  ): Promise<FabricController> {
    try {
      return await connectController(this.#fabric, {
        trtype: transport.toUpperCase(),
        traddr,
        trsvcid,
        subnqn: nqn,
        hostnqn: hostNqn,
        hostid: this.#hostId,
      });
    } catch (err) {
      throw new StorageError(
        "unavailable",
        `connect to ${nqn} at ${transport}:${traddr}:${trsvcid} failed: ${(err as Error).message}`,
        {
          cause: err,
          details: { nqn },
        },
      );
    }
  }

  #adopt(nqn: string, ctrl: FabricController): void {
    const live: Live = { ctrl, lostAt: undefined, lastAttempt: undefined };
    this.#live.set(nqn, live);
    ctrl.onClose(() => {
      // Our own disconnect removed the entry first; anything else is a lost link.
      if (this.#live.get(nqn) === live) live.lostAt = this.#clock.now();
    });
  }

  /**
   * The path state of `rec`, re-dialling a lost (or, after a restart, not yet opened) link when
   * due. Once a link stayed lost for ctrl-loss-tmo the controller is removed, as the kernel does:
   * its loop devices are detached (deferred by the kernel while mounted) and it is no longer listed.
   */
  async #revive(rec: SimConnection): Promise<string | undefined> {
    if (this.#store.get(rec.nqn) === undefined) return undefined;
    const live = this.#live.get(rec.nqn);
    if (live?.ctrl && !live.ctrl.closed) return "live";
    const now = this.#clock.now();
    const lossMs = (rec.ctrlLossTmo ?? DEFAULT_CTRL_LOSS_TMO_S) * 1000;
    if (live?.lostAt !== undefined && lossMs >= 0 && now - live.lostAt >= lossMs) {
      this.#live.delete(rec.nqn);
      const attached = new Set((await this.#loops()).map((l) => l.name));
      for (const ns of rec.namespaces) {
        if (attached.has(ns.device))
          await runChecked(this.#exec, detachArgv(ns.device), { timeoutMs: this.#timeoutMs });
      }
      this.#store.delete(rec.nqn);
      this.#log.info("controller removed after ctrl-loss-tmo", { nqn: rec.nqn });
      return undefined;
    }
    const delayMs = (rec.reconnectDelay ?? DEFAULT_RECONNECT_DELAY_S) * 1000;
    // After a restart there is no in-process link yet: dial at once, as the kernel never lost it.
    if (live?.lastAttempt !== undefined && now - live.lastAttempt < delayMs) return "connecting";
    try {
      const ctrl = await this.#dial(rec.nqn, rec.hostNqn, rec.transport, rec.traddr, rec.trsvcid);
      this.#adopt(rec.nqn, ctrl);
      return "live";
    } catch (err) {
      this.#live.set(rec.nqn, { ctrl: undefined, lostAt: live?.lostAt ?? now, lastAttempt: now });
      this.#log.info("reconnect failed", { nqn: rec.nqn, error: (err as Error).message });
      return "connecting";
    }
  }

  async #loops(): Promise<LoopDevice[]> {
    return parseLosetupList(await runChecked(this.#exec, LOSETUP_LIST_ARGV, { timeoutMs: this.#timeoutMs }));
  }

  /**
   * A loop device over `ns`'s backing extent: the one already recorded or attached for exactly
   * that extent (a connect repeated after a crash), else a new one (`created`). A new device is
   * checked against a second lookup: the emulator refuses to move an extent a loop device maps,
   * but one that moved between the lookup and the attach is detached and attached again.
   */
  async #attach(
    nqn: string,
    ns: NamespaceInfo,
    loops: readonly LoopDevice[],
    prior: SimConnection | undefined,
  ): Promise<{ record: SimNamespace; created: boolean }> {
    const size = ns.numBlocks * ns.blockSize;
    for (let attempt = 1; ; attempt++) {
      const backing = await this.#backingOfSize(nqn, ns, size);
      const sizeLimit = wholeFile(backing) ? 0 : backing.sizeBytes;
      const record = (device: string): SimNamespace => ({
        nsid: ns.nsid,
        uuid: ns.uuid,
        nguid: ns.nguid,
        sizeBytes: size,
        device,
        backing,
        sizeLimit,
      });
      const matches = (l: LoopDevice) =>
        l.backFile === backing.path &&
        l.offset === backing.offset &&
        l.sizeLimit === sizeLimit &&
        !l.readonly;
      const recorded = prior?.namespaces.find((k) => k.nsid === ns.nsid)?.device;
      const reuse = loops.find((l) => l.name === recorded && matches(l)) ?? loops.find(matches);
      if (reuse !== undefined) return { record: record(reuse.name), created: false };
      const device = parseAttached(
        await runChecked(this.#exec, attachArgv(backing.path, { offset: backing.offset, sizeLimit }), {
          timeoutMs: this.#timeoutMs,
        }),
      );
      let now: NamespaceBacking;
      try {
        now = await this.#backing(nqn, ns);
      } catch (err) {
        await this.#detachQuietly(device);
        throw err;
      }
      if (sameExtent(now, backing)) {
        // A namespace the kernel adds is a new disk, writable whatever an earlier user set with
        // BLKROSET; a reused loop device keeps that flag across detach, so clear it.
        await runChecked(this.#exec, ["blockdev", "--setrw", device], { timeoutMs: this.#timeoutMs });
        return { record: record(device), created: true };
      }
      await this.#detachQuietly(device);
      if (attempt >= ATTACH_ATTEMPTS) {
        throw new StorageError(
          "unavailable",
          `namespace ${ns.nsid} of ${nqn} moved on the target while it was being attached, ${attempt} times`,
        );
      }
    }
  }

  /** The backing of `ns`, which must be as large as the target says the namespace is. */
  async #backingOfSize(nqn: string, ns: NamespaceInfo, size: number): Promise<NamespaceBacking> {
    const backing = await this.#backing(nqn, ns);
    if (backing.sizeBytes !== size) {
      throw new StorageError(
        "internal",
        `backing of ${nqn} ns ${ns.nsid} is ${backing.sizeBytes} bytes, the target reports ${size}`,
      );
    }
    return backing;
  }

  /**
   * Follows a namespace the target resized, as the kernel revalidates its capacity: a loop device
   * over a whole file re-reads the file's size (losetup --set-capacity); one over an extent gets
   * the new size limit (LoopControl), which works while it is mounted. An extent that moved is
   * "precondition": the target refuses to move a mapped extent, so the device no longer shows the
   * namespace's bytes and must be connected afresh.
   */
  async #resize(nqn: string, known: SimNamespace, ns: NamespaceInfo): Promise<SimNamespace> {
    const size = ns.numBlocks * ns.blockSize;
    const backing = await this.#backingOfSize(nqn, ns, size);
    if (backing.path !== known.backing.path || backing.offset !== known.backing.offset) {
      throw new StorageError(
        "precondition",
        `namespace ${ns.nsid} of ${nqn} moved to ${backing.path} at ${backing.offset}, but ${known.device} maps ${known.backing.path} at ${known.backing.offset}; disconnect and connect again`,
      );
    }
    if (known.sizeLimit === 0 && wholeFile(backing)) {
      await runChecked(this.#exec, setCapacityArgv(known.device), { timeoutMs: this.#timeoutMs });
      return { ...known, sizeBytes: size, backing };
    }
    await this.#loopControl.setExtent(known.device, backing.offset, size);
    return { ...known, sizeBytes: size, backing, sizeLimit: size };
  }

  /** Detaches a loop device this process just attached, logging (not throwing) a failure. */
  async #detachQuietly(device: string): Promise<void> {
    try {
      await runChecked(this.#exec, detachArgv(device), { timeoutMs: this.#timeoutMs });
    } catch (err) {
      this.#log.warn("detaching a loop device failed", { device, error: (err as Error).message });
    }
  }
}

function sameExtent(a: NamespaceBacking, b: NamespaceBacking): boolean {
  return a.path === b.path && a.offset === b.offset && a.sizeBytes === b.sizeBytes;
}

/** True when the extent is the whole file as it is now: the loop device then needs no limit. */
function wholeFile(b: NamespaceBacking): boolean {
  try {
    return b.offset === 0 && statSync(b.path).size === b.sizeBytes;
  } catch {
    return false;
  }
}
