// Lvol stores on the bdev layer: metadata at the front of the base bdev (surviving what the base
// survives: a drive or AIO file, not malloc), lvol clusters mapped onto the base's bytes, and an
// lvstore found while examining a newly registered bdev loaded again, as SPDK does on attach.
// Thick lvols are one run of clusters (blobstore.ts), zeroed on allocation, so a thick lvol on a
// file-backed base is one file extent, printed as driver_specific.sim_extent for the lab initiator.
import type { Logger } from "../../../lib/log.ts";
import { Bdev, type BdevRegistry, IO_TYPES, SYSTEM_AND_ACCEL_DOMAINS, simExtentJson } from "./bdev.ts";
import { Blobstore, type Lvol, parseMetadata, type ResizePlan } from "./blobstore.ts";
import { type BlockIo, checkRange, type FileExtent, zeroRange } from "./block-io.ts";
import type { JsonValue } from "./json-stream.ts";
import { Mutex } from "./mutex.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

const MAGIC = Buffer.from("DSTLVS01", "latin1");
const HEADER = 16; // magic, u32 length, u32 crc32

/** A loaded lvstore: the blobstore, its base bdev and the bdevs of its lvols. */
export interface LoadedStore {
  readonly bs: Blobstore;
  readonly base: Bdev;
  readonly bdevs: Map<Lvol, Bdev>;
  /** Serialises metadata changes and cluster allocation with I/O. */
  readonly lock: Mutex;
}

/**
 * Whether something outside the emulator (a loop device of the lab initiator) maps bytes of
 * `extent` directly. Such an lvol is pinned: its bytes must not move or be given away.
 */
export type ExtentInUse = (extent: FileExtent) => boolean;

/**
 * The lvol module of one app. Its methods throw ErrnoError; the RPC handlers choose the reply
 * codes. Registers itself as examiner and removal hook of `registry`.
 */
export class LvolStores {
  readonly #stores: LoadedStore[] = [];

  constructor(
    private readonly registry: BdevRegistry,
    private readonly log: Logger,
    private readonly extentInUse: ExtentInUse = () => false,
  ) {
    registry.addExaminer((b) => this.#examine(b));
    registry.addRemovalHook((b) => this.#onRemove(b));
  }

  /** Loaded stores in load order. */
  list(): readonly LoadedStore[] {
    return this.#stores;
  }

  /** The loaded store named `name`. */
  byName(name: string): LoadedStore | undefined {
    return this.#stores.find((s) => s.bs.name === name);
  }

  /** The loaded store with UUID `uuid`. */
  byUuid(uuid: string): LoadedStore | undefined {
    return this.#stores.find((s) => s.bs.uuid === uuid);
  }

  /** The store and lvol behind an lvol bdev name or alias, if it is one. */
  lvolByBdev(nameOrAlias: string): { store: LoadedStore; lvol: Lvol; bdev: Bdev } | undefined {
    const bdev = this.registry.get(nameOrAlias);
    if (bdev?.module !== "lvol") return undefined;
    for (const store of this.#stores) {
      for (const [lvol, b] of store.bdevs) if (b === bdev) return { store, lvol, bdev };
    }
    return undefined;
  }

  /**
   * bdev_lvol_create_lvstore's synchronous checks: the base must exist (ENODEV) and be unclaimed
   * (EPERM), the name must be free (EEXIST) and valid (EINVAL).
   */
  checkCreate(baseName: string, name: string): Bdev {
    const base = this.registry.get(baseName);
    if (!base) throw new ErrnoError(Errno.ENODEV, baseName);
    if (base.claim) throw new ErrnoError(Errno.EPERM, `${baseName} is claimed`);
    if (this.byName(name)) throw new ErrnoError(Errno.EEXIST, name);
    if (name.length === 0 || Buffer.byteLength(name) > 63) throw new ErrnoError(Errno.EINVAL, name);
    return base;
  }

  /** Creates an lvstore on `baseName` (rechecking what checkCreate checked) and persists it. */
  async create(baseName: string, name: string, clusterSize?: number): Promise<LoadedStore> {
    const base = this.checkCreate(baseName, name);
    const bs = Blobstore.create(name, base.io.sizeBytes, base.blockSize, clusterSize);
    this.registry.claim(base, "read_many_write_one", `lvs:${bs.uuid}`);
    const store: LoadedStore = { bs, base, bdevs: new Map(), lock: new Mutex() };
    // Listed before the metadata write so that a concurrent create of the same name sees it.
    this.#stores.push(store);
    try {
      await this.#persist(store);
    } catch (err) {
      this.#stores.splice(this.#stores.indexOf(store), 1);
      this.registry.release(base, `lvs:${bs.uuid}`);
      throw err;
    }
    return store;
  }

  /** Deletes a store: its lvol bdevs are hot-removed, the on-disk header is wiped. */
  async destroy(store: LoadedStore): Promise<void> {
    await this.#unload(store);
    await store.lock.run(() => store.base.io.write(0, Buffer.alloc(HEADER)));
  }

  /**
   * Creates an lvol and registers its bdev; EEXIST/EINVAL/ENOSPC from the blobstore. A thick
   * lvol's clusters are zeroed (deallocated) before the metadata that gives them to it is written.
   */
  async createLvol(store: LoadedStore, name: string, sizeBytes: number, thin: boolean): Promise<Lvol> {
    const lvol = await store.lock.run(async () => {
      const made = store.bs.createLvol(name, sizeBytes, thin);
      try {
        if (!thin) await zeroClusters(store, made.map);
        await writeMetadata(store);
      } catch (err) {
        store.bs.delete(made);
        throw err;
      }
      return made;
    });
    // Outside the lock: registering examines the new bdev, which reads through the same lock.
    await this.#registerLvol(store, lvol);
    return lvol;
  }

  /**
   * Resizes an lvol and tells the bdev's consumers. A thick lvol grows in place or moves to a new
   * run (its bytes copied before the new mapping is persisted, so a failure or crash leaves the old
   * place intact); one whose extent is mapped outside the emulator (extentInUse) may only grow in
   * place: EBUSY otherwise, logged with the reason. EPERM for a snapshot, ENOSPC for a thick grow
   * beyond the free clusters. Clusters given up are deallocated once the metadata is written.
   */
  async resize(store: LoadedStore, lvol: Lvol, sizeBytes: number): Promise<void> {
    await store.lock.run(async () => {
      const extent = lvolExtent(store, lvol);
      const pinned = extent !== undefined && this.extentInUse(extent);
      const undo = store.bs.checkpoint(lvol);
      let plan: ResizePlan;
      try {
        plan = store.bs.resize(lvol, sizeBytes, { pinned });
      } catch (err) {
        if (err instanceof ErrnoError && err.errno === Errno.EBUSY) {
          this.log.warn("lvol resize refused: a loop device maps its extent (lab limitation)", {
            lvol: `${store.bs.name}/${lvol.name}`,
            reason: err.message,
          });
        }
        throw err;
      }
      try {
        await zeroClusters(store, plan.zero);
        for (const [from, to] of plan.copy) await copyCluster(store, from, to);
        await writeMetadata(store);
      } catch (err) {
        undo();
        throw err;
      }
      await this.#deallocate(store, plan.released);
    });
    const bdev = store.bdevs.get(lvol);
    if (bdev) await this.registry.notifyResize(bdev);
  }

  /** Snapshots an lvol and registers the snapshot's bdev; EEXIST/EINVAL from the blobstore. */
  async snapshot(store: LoadedStore, lvol: Lvol, name: string): Promise<Lvol> {
    const snap = await store.lock.run(async () => {
      const s = store.bs.snapshot(lvol, name);
      await this.#persistLocked(store);
      return s;
    });
    await this.#registerLvol(store, snap);
    return snap;
  }

  /** Clones a snapshot and registers the clone's bdev; EINVAL for a non-snapshot, EEXIST for the name. */
  async clone(store: LoadedStore, snap: Lvol, name: string): Promise<Lvol> {
    const c = await store.lock.run(async () => {
      const made = store.bs.clone(snap, name);
      await this.#persistLocked(store, () => store.bs.delete(made));
      return made;
    });
    await this.#registerLvol(store, c);
    return c;
  }

  /** EPERM when `lvol` is a snapshot with more than one clone. */
  checkDeletable(store: LoadedStore, lvol: Lvol): void {
    if (store.bs.clonesOf(lvol).length > 1) throw new ErrnoError(Errno.EPERM, lvol.name);
  }

  /** Deletes an lvol: its bdev is hot-removed first, then the blob goes. */
  async deleteLvol(store: LoadedStore, lvol: Lvol): Promise<void> {
    this.checkDeletable(store, lvol);
    const bdev = store.bdevs.get(lvol);
    if (bdev) await this.registry.unregister(bdev);
    await store.lock.run(async () => {
      const released = store.bs.delete(lvol);
      await this.#persistLocked(store);
      // The default clear_method "unmap": the freed clusters read as zeros (and the file shrinks).
      await this.#deallocate(store, released);
    });
  }

  /** The driver_specific.lvol of a lvol bdev, as bdev_get_bdevs prints it. */
  describe(store: LoadedStore, lvol: Lvol): { [key: string]: JsonValue } {
    const out: { [key: string]: JsonValue } = {
      lvol_store_uuid: store.bs.uuid,
      base_bdev: store.base.name,
      thin_provision: lvol.thin,
      num_allocated_clusters: lvol.allocatedClusters,
      snapshot: lvol.snapshot,
      clone: lvol.parent !== null,
    };
    if (lvol.parent) out.base_snapshot = lvol.parent.name;
    if (lvol.snapshot) out.clones = store.bs.clonesOf(lvol).map((c) => c.name);
    out.esnap_clone = false;
    return { lvol: out, ...simExtentJson(lvolExtent(store, lvol)) };
  }

  /** Deallocates freed clusters; a failure only costs space, so it is logged, not thrown. */
  async #deallocate(store: LoadedStore, pcs: readonly number[]): Promise<void> {
    try {
      await zeroClusters(store, pcs);
    } catch (err) {
      this.log.warn("deallocating freed clusters failed", { lvs: store.bs.name, err: String(err) });
    }
  }

  async #registerLvol(store: LoadedStore, lvol: Lvol): Promise<void> {
    const io = new LvolIo(store, lvol);
    const bdev = new Bdev({
      name: lvol.uuid,
      uuid: lvol.uuid,
      extraAliases: [`${store.bs.name}/${lvol.name}`],
      module: "lvol",
      productName: "Logical Volume",
      blockSize: store.bs.blockSize,
      io,
      ioTypes: lvol.snapshot ? IO_TYPES.snapshot : IO_TYPES.lvol,
      memoryDomains: SYSTEM_AND_ACCEL_DOMAINS,
      driverSpecific: () => this.describe(store, lvol),
      onRemoved: () => store.bdevs.delete(lvol),
    });
    store.bdevs.set(lvol, bdev);
    try {
      await this.registry.register(bdev);
    } catch (err) {
      store.bdevs.delete(lvol);
      this.log.warn("lvol bdev not registered", { lvol: lvol.name, err: String(err) });
    }
  }

  async #persist(store: LoadedStore): Promise<void> {
    await store.lock.run(() => this.#persistLocked(store));
  }

  /** Writes the metadata; on failure runs `undo` (to keep memory and disk in step) and rethrows. */
  async #persistLocked(store: LoadedStore, undo?: () => void): Promise<void> {
    try {
      await writeMetadata(store);
    } catch (err) {
      undo?.();
      throw err;
    }
  }

  /** Loads an lvstore found on `bdev`, if any. A damaged or conflicting one is skipped with a warning. */
  async #examine(bdev: Bdev): Promise<void> {
    if (bdev.io.sizeBytes < HEADER) return;
    const head = await bdev.io.read(0, HEADER);
    if (!head.subarray(0, 8).equals(MAGIC)) return;
    const len = head.readUInt32LE(8);
    if (len === 0 || HEADER + len > bdev.io.sizeBytes) return;
    const json = await bdev.io.read(HEADER, len);
    if (Bun.hash.crc32(json) !== head.readUInt32LE(12)) {
      this.log.warn("lvstore metadata checksum mismatch; not loaded", { bdev: bdev.name });
      return;
    }
    const bs = Blobstore.fromMetadata(parseMetadata(JSON.parse(json.toString("utf8"))));
    if (this.byName(bs.name) || this.byUuid(bs.uuid)) {
      this.log.warn("lvstore with the same name or uuid already loaded; not loaded", {
        bdev: bdev.name,
        lvs: bs.name,
      });
      return;
    }
    if (bdev.claim) return;
    this.registry.claim(bdev, "read_many_write_one", `lvs:${bs.uuid}`);
    const store: LoadedStore = { bs, base: bdev, bdevs: new Map(), lock: new Mutex() };
    this.#stores.push(store);
    this.log.info("lvstore loaded", { bdev: bdev.name, lvs: bs.name, lvols: bs.lvols.length });
    for (const lvol of bs.lvols) await this.#registerLvol(store, lvol);
  }

  /** Unloads (without destroying) every store whose base goes away. */
  async #onRemove(bdev: Bdev): Promise<void> {
    for (const store of [...this.#stores]) if (store.base === bdev) await this.#unload(store);
  }

  async #unload(store: LoadedStore): Promise<void> {
    for (const b of [...store.bdevs.values()]) await this.registry.unregister(b);
    const at = this.#stores.indexOf(store);
    if (at >= 0) this.#stores.splice(at, 1);
    this.registry.release(store.base, `lvs:${store.bs.uuid}`);
  }
}

/** The data path of one lvol: logical clusters mapped onto the base bdev, copy-on-write from parents. */
class LvolIo implements BlockIo {
  constructor(
    private readonly store: LoadedStore,
    private readonly lvol: Lvol,
  ) {}

  get sizeBytes(): number {
    return this.lvol.numClusters * this.store.bs.clusterSize;
  }

  fileExtent(): FileExtent | undefined {
    return lvolExtent(this.store, this.lvol);
  }

  read(offset: number, length: number): Promise<Buffer> {
    return this.store.lock.run(async () => {
      checkRange(offset, length, this.sizeBytes);
      const out = Buffer.alloc(length);
      await this.#segments(offset, length, async (i, at, pos, n) => {
        (await readLogical(this.store, this.lvol, i, at, n)).copy(out, pos);
      });
      return out;
    });
  }

  write(offset: number, data: Uint8Array): Promise<void> {
    return this.store.lock.run(async () => {
      // A snapshot's bdev does not support writes; the bdev layer fails them.
      if (this.lvol.snapshot) throw new ErrnoError(Errno.EIO, "snapshot is read-only");
      checkRange(offset, data.length, this.sizeBytes);
      const src = Buffer.from(data.buffer, data.byteOffset, data.length);
      const { bs, base } = this.store;
      const cs = bs.clusterSize;
      let mdChanged = false;
      await this.#segments(offset, data.length, async (i, at, pos, n) => {
        const part = src.subarray(pos, pos + n);
        let pc = this.lvol.map[i] as number;
        if (pc >= 0 && this.lvol.written.has(i)) {
          await base.io.write(pc * cs + at, part);
          return;
        }
        // First write to this cluster: materialise all of it (zeros, or the parent's bytes).
        let full: Buffer;
        if (at === 0 && n === cs) full = Buffer.from(part);
        else {
          full =
            pc >= 0 || !this.lvol.parent
              ? Buffer.alloc(cs)
              : await readLogical(this.store, this.lvol.parent, i, 0, cs);
          part.copy(full, at);
        }
        if (pc < 0) {
          pc = bs.allocate();
          this.lvol.map[i] = pc;
        }
        await base.io.write(pc * cs, full);
        this.lvol.written.add(i);
        mdChanged = true;
      });
      // Like a thin blob's cluster allocation, the new mapping is persisted before completing.
      if (mdChanged) await writeMetadata(this.store);
    });
  }

  async #segments(
    offset: number,
    length: number,
    fn: (cluster: number, at: number, pos: number, n: number) => Promise<void>,
  ): Promise<void> {
    const cs = this.store.bs.clusterSize;
    let pos = 0;
    while (pos < length) {
      const abs = offset + pos;
      const i = Math.floor(abs / cs);
      const at = abs - i * cs;
      const n = Math.min(cs - at, length - pos);
      await fn(i, at, pos, n);
      pos += n;
    }
  }
}

/**
 * The file extent holding every byte of `lvol`: its run of clusters (Blobstore.runOf) on a base
 * whose bytes are one file extent. Undefined for thin lvols, snapshots, clones, scattered thick
 * lvols and bases in RAM.
 */
function lvolExtent(store: LoadedStore, lvol: Lvol): FileExtent | undefined {
  const run = store.bs.runOf(lvol);
  const base = run && store.base.io.fileExtent?.();
  if (run === undefined || base === undefined) return undefined;
  const cs = store.bs.clusterSize;
  return { path: base.path, offset: base.offset + run.start * cs, length: run.count * cs };
}

/** Zeros the given physical clusters on the base, one call per run of consecutive clusters. */
async function zeroClusters(store: LoadedStore, pcs: readonly number[]): Promise<void> {
  const cs = store.bs.clusterSize;
  const sorted = [...pcs].sort((a, b) => a - b);
  for (let i = 0; i < sorted.length; ) {
    const start = sorted[i] as number;
    let n = 1;
    while (sorted[i + n] === start + n) n++;
    await zeroRange(store.base.io, start * cs, n * cs);
    i += n;
  }
}

const COPY_CHUNK = 4 * 1024 * 1024;

/** Copies one physical cluster's bytes to another; all-zero pieces are deallocated, not written. */
async function copyCluster(store: LoadedStore, from: number, to: number): Promise<void> {
  const cs = store.bs.clusterSize;
  const io = store.base.io;
  for (let at = 0; at < cs; at += COPY_CHUNK) {
    const n = Math.min(COPY_CHUNK, cs - at);
    const bytes = await io.read(from * cs + at, n);
    if (isZero(bytes)) await zeroRange(io, to * cs + at, n);
    else await io.write(to * cs + at, bytes);
  }
}

let zeros = Buffer.alloc(0);
function isZero(b: Buffer): boolean {
  if (zeros.length < b.length) zeros = Buffer.alloc(b.length);
  return b.equals(zeros.subarray(0, b.length));
}

/** Writes the store's metadata record to the front of its base bdev; ENOSPC when it outgrew the region. */
async function writeMetadata(store: LoadedStore): Promise<void> {
  const json = Buffer.from(JSON.stringify(store.bs.toMetadata()));
  const buf = Buffer.alloc(HEADER + json.length);
  MAGIC.copy(buf, 0);
  buf.writeUInt32LE(json.length, 8);
  buf.writeUInt32LE(Bun.hash.crc32(json), 12);
  json.copy(buf, HEADER);
  if (buf.length > store.bs.metadataBytes) throw new ErrnoError(Errno.ENOSPC, "metadata region full");
  await store.base.io.write(0, buf);
}

/** Bytes [at, at+n) of logical cluster i of `lvol`, falling through to its parents. */
async function readLogical(
  store: LoadedStore,
  lvol: Lvol,
  i: number,
  at: number,
  n: number,
): Promise<Buffer> {
  for (let l: Lvol | null = lvol; l; l = l.parent) {
    if (i >= l.numClusters) break;
    const pc = l.map[i] as number;
    if (pc >= 0) {
      return l.written.has(i) ? store.base.io.read(pc * store.bs.clusterSize + at, n) : Buffer.alloc(n);
    }
  }
  return Buffer.alloc(n);
}
