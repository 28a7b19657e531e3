// One incarnation of the emulated nvmf_tgt process: the framework state and every runtime
// module (bdevs, lvol stores, NVMe controllers, NVMe-oF target, keyring, fsdevs, iobuf options).
// A crash or restart throws the whole App away and builds a new one.

import type { Clock } from "../../../lib/clock.ts";
import { Mutex } from "../../../lib/concurrency/mutex.ts";
import type { Logger } from "../../../lib/log.ts";
import { BdevRegistry } from "./bdev.ts";
import type { SimFabric } from "./fabric.ts";
import { Fsdevs } from "./fsdev.ts";
import type { HasAddress } from "./host-addresses.ts";
import { Keyring } from "./keyring.ts";
import { LvolStores } from "./lvol-store.ts";
import type { RpcState } from "./method-table.ts";
import { NvmeControllers } from "./nvme-controllers.ts";
import { type Host, NvmfTarget, type Trtype } from "./nvmf-target.ts";
import { Raids } from "./raid.ts";
import type { PreparedDrive } from "./sim-drive.ts";

/** What an App is built from; fixed for the emulator's lifetime. */
export interface AppConfig {
  readonly drives: readonly PreparedDrive[];
  readonly fabric: SimFabric | undefined;
  /** Reactor cores (from the core mask). */
  readonly cores: readonly number[];
  readonly waitForRpc: boolean;
  /** Transports this nvmf_tgt build has. */
  readonly transports: readonly Trtype[];
  /** Initiator identity: default host NQN and host ID. */
  readonly hostNqn: string;
  readonly hostId: string;
  /** bdev_nvme_attach_controller trtype spellings that mean a built-in transport (e.g. SNAP's NVDA_TCP). */
  readonly trtypeAliases: Readonly<Record<string, Trtype>>;
  readonly clock: Clock;
  readonly logger: Logger;
  /** Simulated duration of framework_start_init. */
  readonly initDelayMs: number;
  /** Where lvols keep bytes outside their store's base (see LvolStoresOptions.lvolDir). */
  readonly lvolDir: string | undefined;
  /** Whether the host has an IP address a listener may bind (see hostAddressCheck). */
  readonly hasAddress: HasAddress;
  /**
   * The SPDK release spdk_get_version reports and whose TLS-PSK behaviour the app follows:
   * "25.05.1" (the recorded one, default: its NULL HKDF salt fails every PSK derivation on
   * OpenSSL 3.0.17+) or "26.01" (salt fixed, commit 197ff0c9a5).
   */
  readonly spdkVersion?: SimSpdkVersion;
}

/** The SPDK releases the emulator can pose as. */
export type SimSpdkVersion = "25.05.1" | "26.01";

/** Process-level actions methods may ask for. */
export interface AppHooks {
  pauseRpc(): void;
  resumeRpc(): void;
  /** spdk_kill_instance: the process receives `signal`. */
  kill(signal: string): void;
}

/** iobuf pool options (iobuf_set_options, STARTUP only). */
export interface IobufOptions {
  small_pool_count: number;
  large_pool_count: number;
  small_bufsize: number;
  large_bufsize: number;
}

/** The runtime state of one emulated process. */
export class App {
  readonly registry: BdevRegistry;
  readonly lvols: LvolStores;
  readonly raids: Raids;
  readonly nvme: NvmeControllers;
  readonly target: NvmfTarget;
  readonly keyring = new Keyring();
  readonly fsdevs = new Fsdevs();
  /** Serialises bdev_nvme attach/detach, whose steps await the fabric. */
  readonly nvmeLock = new Mutex();
  /** Serialises listener changes, which bind sockets. */
  readonly listenerLock = new Mutex();
  readonly startedAt: number;
  iobuf: IobufOptions = {
    small_pool_count: 8192,
    large_pool_count: 1024,
    small_bufsize: 8192,
    large_bufsize: 135168,
  };
  /** Counter behind auto-named malloc bdevs (Malloc0, Malloc1...). */
  mallocCount = 0;
  #state: RpcState;
  #initStarted = false;
  readonly #runtimeWaiters: (() => void)[] = [];

  constructor(
    readonly config: AppConfig,
    readonly hooks: AppHooks,
  ) {
    const log = config.logger;
    this.startedAt = config.clock.now();
    this.registry = new BdevRegistry((bdev, err) =>
      log.warn("examine failed", { bdev: bdev.name, err: String(err) }),
    );
    this.lvols = new LvolStores(this.registry, log, { lvolDir: config.lvolDir });
    this.raids = new Raids(this.registry, config.clock, log);
    this.nvme = new NvmeControllers(
      this.registry,
      config.drives,
      config.fabric,
      config.hostNqn,
      config.hostId,
      config.clock,
      log,
    );
    // The keys a host entry holds, read from their files when used (a deleted file fails the host).
    const held = (host: Host, name: string | undefined) => {
      const key = this.keyring.heldBy(host).find((k) => k.name === name);
      try {
        return key ? this.keyring.read(key) : undefined;
      } catch {
        return undefined;
      }
    };
    this.target = new NvmfTarget(
      this.registry,
      config.fabric,
      config.cores.length,
      log,
      (host) => ({ hostSecret: held(host, host.dhchapKey), ctrlSecret: held(host, host.dhchapCtrlrKey) }),
      (host) => held(host, host.psk),
    );
    this.#state = config.waitForRpc ? "startup" : "runtime";
  }

  /** True when this release derives TLS PSKs (the HKDF salt fix); false for v25.05.1. */
  get tlsPskWorks(): boolean {
    return this.config.spdkVersion === "26.01";
  }

  get state(): RpcState {
    return this.#state;
  }

  /**
   * framework_start_init: pauses the RPC server, initialises, switches to RUNTIME and resumes.
   * A second call while the first runs is a no-op (once RUNTIME, the state check refuses it).
   */
  async startInit(): Promise<void> {
    if (this.#initStarted) return;
    this.#initStarted = true;
    this.hooks.pauseRpc();
    await new Promise((r) => setTimeout(r, this.config.initDelayMs));
    this.#state = "runtime";
    for (const w of this.#runtimeWaiters.splice(0)) w();
    this.hooks.resumeRpc();
  }

  /** Resolves once the framework runs (at once when it already does). */
  whenRuntime(): Promise<void> {
    if (this.#state === "runtime") return Promise.resolve();
    return new Promise((resolve) => this.#runtimeWaiters.push(resolve));
  }
}
