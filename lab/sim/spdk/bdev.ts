// The emulated bdev layer: bdevs with names, aliases, claims and a data path, registered in one
// name space per app (a name or alias is unique across both), examined on registration and
// hot-removed with their consumers, and rendered the way bdev_get_bdevs prints them.
import type { BlockIo } from "./block-io.ts";
import { IoStat } from "./io-stat.ts";
import type { JsonValue } from "./json-stream.ts";
import type { QosThrottle } from "./qos.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** The module that owns a bdev. */
export type BdevModule = "malloc" | "aio" | "lvol" | "nvme" | "raid" | "null";

/** SPDK claim types as bdev_get_bdevs prints them. */
export type ClaimType = "exclusive_write" | "read_many_write_one";

/** supported_io_types, in SPDK's print order. */
export interface IoTypes {
  read: boolean;
  write: boolean;
  unmap: boolean;
  flush: boolean;
  reset: boolean;
  nvme_admin: boolean;
  nvme_io: boolean;
  nvme_io_md: boolean;
  write_zeroes: boolean;
  zcopy: boolean;
  get_zone_info: boolean;
  zone_management: boolean;
  zone_append: boolean;
  compare: boolean;
  compare_and_write: boolean;
  abort: boolean;
  seek_hole: boolean;
  seek_data: boolean;
  copy: boolean;
  nvme_iov_md: boolean;
}

const NONE: IoTypes = {
  read: false,
  write: false,
  unmap: false,
  flush: false,
  reset: false,
  nvme_admin: false,
  nvme_io: false,
  nvme_io_md: false,
  write_zeroes: false,
  zcopy: false,
  get_zone_info: false,
  zone_management: false,
  zone_append: false,
  compare: false,
  compare_and_write: false,
  abort: false,
  seek_hole: false,
  seek_data: false,
  copy: false,
  nvme_iov_md: false,
};

/** The supported_io_types v25.05.1 reports per kind of bdev. */
export const IO_TYPES = {
  malloc: {
    ...NONE,
    read: true,
    write: true,
    unmap: true,
    flush: true,
    reset: true,
    write_zeroes: true,
    zcopy: true,
    abort: true,
    copy: true,
  },
  aio: { ...NONE, read: true, write: true, flush: true, reset: true, write_zeroes: true },
  null: { ...NONE, read: true, write: true, write_zeroes: true, reset: true, abort: true },
  lvol: {
    ...NONE,
    read: true,
    write: true,
    unmap: true,
    reset: true,
    write_zeroes: true,
    seek_hole: true,
    seek_data: true,
  },
  snapshot: { ...NONE, read: true, reset: true, seek_hole: true, seek_data: true },
  nvmeFabric: {
    ...NONE,
    read: true,
    write: true,
    flush: true,
    reset: true,
    nvme_admin: true,
    nvme_io: true,
    write_zeroes: true,
    compare: true,
    compare_and_write: true,
    abort: true,
    copy: true,
  },
  // A local drive: deallocate (unmap) instead of copy, no fused compare-and-write.
  nvmePcie: {
    ...NONE,
    read: true,
    write: true,
    unmap: true,
    flush: true,
    reset: true,
    nvme_admin: true,
    nvme_io: true,
    write_zeroes: true,
    compare: true,
    abort: true,
  },
} as const satisfies Record<string, IoTypes>;

/** memory_domains of malloc and lvol bdevs (AIO and PCIe NVMe bdevs report none). */
export const SYSTEM_AND_ACCEL_DOMAINS: JsonValue = [
  { dma_device_id: "system", dma_device_type: 1 },
  { dma_device_id: "SPDK_ACCEL_DMA_DEVICE", dma_device_type: 2 },
];
/** memory_domains of a bdev reached over NVMe-oF. */
export const SYSTEM_DOMAIN: JsonValue = [{ dma_device_id: "system", dma_device_type: 1 }];

/** Everything needed to construct a bdev. */
export interface BdevInit {
  readonly name: string;
  readonly uuid: string;
  /** Aliases besides the UUID (which is added unless it equals the name), e.g. "lvs/lvol". */
  readonly extraAliases?: readonly string[];
  readonly module: BdevModule;
  readonly productName: string;
  readonly blockSize: number;
  readonly io: BlockIo;
  readonly ioTypes: IoTypes;
  readonly memoryDomains?: JsonValue;
  /** memory_domains worked out at each call (a raid's follow its configured members); wins over memoryDomains. */
  readonly memoryDomainsOf?: () => JsonValue | undefined;
  readonly numaId?: number;
  /** The driver_specific object, computed when printed. */
  readonly driverSpecific: () => { [key: string]: JsonValue };
  /** Called once after the bdev left the registry (close files, drop connections). */
  readonly onRemoved?: () => void;
}

/** A bdev's QoS limits as bdev_get_bdevs prints them (assigned_rate_limits); 0 is unlimited. */
export interface RateLimits {
  rw_ios_per_sec: number;
  rw_mbytes_per_sec: number;
  r_mbytes_per_sec: number;
  w_mbytes_per_sec: number;
}

/** A registered (or about to be registered) bdev. */
export class Bdev {
  readonly name: string;
  readonly uuid: string;
  readonly aliases: readonly string[];
  readonly module: BdevModule;
  readonly init: BdevInit;
  claim: { type: ClaimType; owner: string } | null = null;
  /** Set by bdev_set_qos_limit; like SPDK's, lost when the bdev is unregistered or the app dies. */
  rateLimits: RateLimits = {
    rw_ios_per_sec: 0,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 0,
    w_mbytes_per_sec: 0,
  };
  /** Enforces rateLimits on fabric I/O once a limit was set; undefined while none ever was. */
  qos: QosThrottle | undefined;
  /** What bdev_get_iostat reports: I/O completed through the fabric since registration. */
  readonly stat = new IoStat();

  constructor(init: BdevInit) {
    this.init = init;
    this.name = init.name;
    this.uuid = init.uuid;
    this.module = init.module;
    this.aliases = [...(init.uuid === init.name ? [] : [init.uuid]), ...(init.extraAliases ?? [])];
  }

  get io(): BlockIo {
    return this.init.io;
  }

  get blockSize(): number {
    return this.init.blockSize;
  }

  get numBlocks(): number {
    return Math.floor(this.init.io.sizeBytes / this.init.blockSize);
  }

  /** The memory_domains printed (undefined: none, as AIO and PCIe NVMe bdevs report). */
  get memoryDomains(): JsonValue | undefined {
    return this.init.memoryDomainsOf ? this.init.memoryDomainsOf() : this.init.memoryDomains;
  }

  /** One bdev_get_bdevs entry, keys in SPDK's order. */
  toJson(): { [key: string]: JsonValue } {
    const out: { [key: string]: JsonValue } = {
      name: this.name,
      aliases: [...this.aliases],
      product_name: this.init.productName,
      block_size: this.blockSize,
      num_blocks: this.numBlocks,
      uuid: this.uuid,
    };
    if (this.init.numaId !== undefined) out.numa_id = this.init.numaId;
    out.assigned_rate_limits = { ...this.rateLimits };
    out.claimed = this.claim !== null;
    if (this.claim) out.claim_type = this.claim.type;
    out.zoned = false;
    out.supported_io_types = { ...this.init.ioTypes };
    const domains = this.memoryDomains;
    if (domains !== undefined) out.memory_domains = domains;
    out.driver_specific = this.init.driverSpecific();
    return out;
  }
}

/** Runs when a bdev is registered (e.g. lvstore examine). Errors are logged, not propagated. */
export type Examiner = (bdev: Bdev) => Promise<void>;
/** Runs before a bdev leaves the registry, so its consumers let go of it first. */
export type RemovalHook = (bdev: Bdev) => Promise<void>;
/** Runs after a bdev changed size (lvol resize, remote namespace resize). */
export type ResizeHook = (bdev: Bdev) => Promise<void>;

/**
 * One app's bdevs. Not shared between emulator instances; a crash drops the whole registry.
 * Names and aliases share one name space, as in SPDK (a second bdev whose UUID alias equals an
 * existing name fails to register, which is why a target attached to its own subsystem gets no
 * namespace bdevs).
 */
export class BdevRegistry {
  readonly #ordered: Bdev[] = [];
  readonly #byName = new Map<string, Bdev>();
  readonly #examiners: Examiner[] = [];
  readonly #removalHooks: RemovalHook[] = [];
  readonly #resizeHooks: ResizeHook[] = [];

  constructor(private readonly onExamineError: (bdev: Bdev, err: unknown) => void) {}

  addExaminer(fn: Examiner): void {
    this.#examiners.push(fn);
  }

  addRemovalHook(fn: RemovalHook): void {
    this.#removalHooks.push(fn);
  }

  addResizeHook(fn: ResizeHook): void {
    this.#resizeHooks.push(fn);
  }

  /** Tells consumers that `bdev` changed size. */
  async notifyResize(bdev: Bdev): Promise<void> {
    for (const hook of this.#resizeHooks) await hook(bdev);
  }

  /** Looks a bdev up by name or alias. */
  get(nameOrAlias: string): Bdev | undefined {
    return this.#byName.get(nameOrAlias);
  }

  /** All bdevs in registration order. */
  list(): readonly Bdev[] {
    return this.#ordered;
  }

  /** True when `name` is taken as a name or alias. */
  taken(name: string): boolean {
    return this.#byName.has(name);
  }

  /**
   * Registers `bdev` and runs the examiners on it (resolving once they are done, as SPDK replies
   * to creating RPCs after bdev_wait_for_examine). Throws ErrnoError EEXIST, registering nothing,
   * when its name or an alias is already taken.
   */
  async register(bdev: Bdev): Promise<void> {
    for (const n of [bdev.name, ...bdev.aliases]) {
      if (this.#byName.has(n)) throw new ErrnoError(Errno.EEXIST, `bdev name ${n} is taken`);
    }
    this.#ordered.push(bdev);
    for (const n of [bdev.name, ...bdev.aliases]) this.#byName.set(n, bdev);
    for (const ex of this.#examiners) {
      if (!this.#ordered.includes(bdev)) return;
      try {
        await ex(bdev);
      } catch (err) {
        this.onExamineError(bdev, err);
      }
    }
  }

  /** Adds an alias to a registered bdev; EEXIST when taken. */
  addAlias(bdev: Bdev, alias: string): void {
    if (this.#byName.has(alias)) throw new ErrnoError(Errno.EEXIST, `bdev name ${alias} is taken`);
    this.#byName.set(alias, bdev);
  }

  /**
   * Hot-removes `bdev`: consumers (removal hooks) release it first, then it leaves the registry
   * and its onRemoved runs. Idempotent for a bdev already gone.
   */
  async unregister(bdev: Bdev): Promise<void> {
    if (!this.#ordered.includes(bdev)) return;
    for (const hook of this.#removalHooks) await hook(bdev);
    const at = this.#ordered.indexOf(bdev);
    if (at < 0) return;
    this.#ordered.splice(at, 1);
    for (const [n, b] of this.#byName) if (b === bdev) this.#byName.delete(n);
    bdev.init.onRemoved?.();
  }

  /** Claims `bdev` for `owner`; ErrnoError EPERM when someone already holds a claim. */
  claim(bdev: Bdev, type: ClaimType, owner: string): void {
    if (bdev.claim) throw new ErrnoError(Errno.EPERM, `${bdev.name} is claimed by ${bdev.claim.owner}`);
    bdev.claim = { type, owner };
  }

  /** Releases `owner`'s claim, if it holds one. */
  release(bdev: Bdev, owner: string): void {
    if (bdev.claim?.owner === owner) bdev.claim = null;
  }
}
