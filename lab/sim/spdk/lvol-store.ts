// Lvol stores on the bdev layer: metadata at the front of the base bdev (surviving what the base
// survives: a drive or AIO file, not malloc), each lvol's bytes in its home (a run of base clusters,
// or a sparse file of its own under the emulator's data directory; RAM on a RAM base), and an
// lvstore found while examining a newly registered bdev loaded again, as SPDK does on attach.
// bdev_get_bdevs prints exactly SPDK's driver_specific.lvol; where an lvol's bytes sit in the
// emulator's files is for lab-side test helpers only (BdevHandle.fileExtent), never in a reply.
import {
  closeSync,
  existsSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  rmSync,
  statSync,
  truncateSync,
  unlinkSync,
} from "node:fs";
import { join } from "node:path";
import { Mutex } from "../../../lib/concurrency/mutex.ts";
import type { Logger } from "../../../lib/log.ts";
import { Bdev, type BdevRegistry, IO_TYPES } from "./bdev.ts";
import {
  Blobstore,
  type ClusterRun,
  type Home,
  type HomeResize,
  type Lvol,
  type LvstoreMetadata,
  legacyByteSource,
  parseMetadata,
} from "./blobstore.ts";
import {
  type BlockIo,
  checkRange,
  copyRange,
  type FileExtent,
  FileExtentIo,
  MemoryIo,
  WindowIo,
  zeroRange,
} from "./block-io.ts";
import type { JsonValue } from "./json-stream.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

const MAGIC = Buffer.from("DSTLVS01", "latin1");
const HEADER = 16; // magic, u32 length, u32 crc32

/** The bytes of one lvol: a window onto the base (a run home), or its own sparse file or RAM. */
type Media = WindowIo | FileExtentIo | MemoryIo;

/** A loaded lvstore: the blobstore, its base bdev, the bdevs of its lvols and their bytes. */
export interface LoadedStore {
  readonly bs: Blobstore;
  readonly base: Bdev;
  readonly bdevs: Map<Lvol, Bdev>;
  /** Serialises metadata changes and cluster allocation with I/O. */
  readonly lock: Mutex;
  /** Where each lvol's bytes are, opened for I/O; follows the lvol's home. */
  readonly media: Map<Lvol, Media>;
  /** The directory of the store's own-container files; undefined when they are kept in RAM. */
  readonly ownDir: string | undefined;
}

/**
 * One shallow copy started by beginShallowCopy: the cluster count it reports as total, and the
 * copy itself, which `run` performs cluster by cluster.
 */
export interface ShallowCopy {
  /** spdk_blob_get_num_allocated_clusters of the source when the copy started. */
  readonly totalClusters: number;
  /**
   * Copies the source's own clusters to the destination at the same byte offsets, calling
   * `pause` before each cluster (the copy yields to the event loop there, as SPDK's completes
   * one cluster per I/O round trip) and `progress` after each with the count copied so far.
   * Resolves when done; rejects with ErrnoError: EPERM for a writable source, EINVAL for a too
   * small or block-incompatible destination, EBUSY when another shallow copy of the source runs,
   * EIO when a cluster read or write fails (also when the source or the destination went away
   * meanwhile). The destination's claim is released in every case. Call once.
   */
  run(pause: () => Promise<void>, progress: (copied: number) => void): Promise<void>;
}

/** How the lvol module of an app is set up. */
export interface LvolStoresOptions {
  /**
   * Where lvols that do not live in a run of base clusters keep their bytes: one directory per
   * store (`<lvolDir>/<lvstore uuid>/<lvol uuid>.img`). Without it, or for a store on a malloc
   * bdev (which does not outlive the process), they are kept in RAM and have no file extent.
   */
  readonly lvolDir?: string;
}

/**
 * The lvol module of one app. Its methods throw ErrnoError; the RPC handlers choose the reply
 * codes. Registers itself as examiner and removal hook of `registry`.
 */
export class LvolStores {
  readonly #stores: LoadedStore[] = [];
  readonly #lvolDir: string | undefined;
  /** Sources of running shallow copies (SPDK's blob locked_operation_in_progress). */
  readonly #copying = new Set<Lvol>();

  constructor(
    private readonly registry: BdevRegistry,
    private readonly log: Logger,
    opts: LvolStoresOptions = {},
  ) {
    this.#lvolDir = opts.lvolDir;
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
    const store = this.#newStore(bs, base);
    // Listed before the metadata write so that a concurrent create of the same name sees it.
    this.#stores.push(store);
    try {
      await store.lock.run(() => writeMetadata(store));
    } catch (err) {
      this.#stores.splice(this.#stores.indexOf(store), 1);
      this.registry.release(base, `lvs:${bs.uuid}`);
      throw err;
    }
    return store;
  }

  /** Deletes a store: its lvol bdevs are hot-removed, the on-disk header is wiped, own files go. */
  async destroy(store: LoadedStore): Promise<void> {
    await this.#unload(store);
    await store.lock.run(() => store.base.io.write(0, Buffer.alloc(HEADER)));
    if (store.ownDir !== undefined) rmSync(store.ownDir, { recursive: true, force: true });
  }

  /**
   * Creates an lvol and registers its bdev; EEXIST/EINVAL/ENOSPC from the blobstore. A thick
   * lvol's run is zeroed (deallocated) before the metadata that gives it to the lvol is written; an
   * own container starts as an empty sparse file.
   */
  async createLvol(store: LoadedStore, name: string, sizeBytes: number, thin: boolean): Promise<Lvol> {
    const lvol = await store.lock.run(async () => {
      const undo = store.bs.checkpoint();
      const made = store.bs.createLvol(name, sizeBytes, thin);
      let media: Media | undefined;
      try {
        const home = store.bs.home(made);
        if (home.kind === "run") {
          await zeroRun(store, home);
          media = runIo(store, home);
        } else {
          media = this.#createOwn(store, made);
        }
        await writeMetadata(store);
      } catch (err) {
        undo();
        if (media !== undefined) this.#dropOwn(store, made, media);
        throw err;
      }
      store.media.set(made, media);
      return made;
    });
    // Outside the lock: registering examines the new bdev, which reads through the same lock.
    await this.#registerLvol(store, lvol);
    return lvol;
  }

  /**
   * Resizes an lvol and tells the bdev's consumers. A run grows in place, or moves (to another run
   * or an own file) with its bytes copied before the new home is persisted, so a failure or crash
   * leaves the old place intact; an own file changes length. EPERM for a snapshot, ENOSPC for a thick grow beyond the free clusters. Base clusters given up
   * are deallocated once the metadata is written.
   */
  async resize(store: LoadedStore, lvol: Lvol, sizeBytes: number): Promise<void> {
    await store.lock.run(async () => {
      const old = mediaOf(store, lvol);
      const undo = store.bs.checkpoint();
      const plan: HomeResize = store.bs.resize(lvol, sizeBytes);
      const bytes = lvol.numClusters * store.bs.clusterSize;
      const { before, after } = plan;
      const inPlace = before.kind === "run" && after.kind === "run" && before.start === after.start;
      let next: Media = old;
      try {
        if (inPlace) {
          if (plan.zero) await zeroRun(store, plan.zero);
          next = runIo(store, after);
        } else if (after !== before) {
          next = after.kind === "run" ? runIo(store, after) : this.#createOwn(store, lvol);
          if (plan.zero) await zeroRun(store, plan.zero);
          await copyRange(old, 0, next, 0, Math.min(old.sizeBytes, bytes));
        }
        await writeMetadata(store);
      } catch (err) {
        undo();
        if (next !== old) this.#dropOwn(store, lvol, next);
        throw err;
      }
      // An own file changes length only once the new size is persisted: a crash in between leaves
      // it longer or shorter than that size, and loading truncates it to it (the tail it cuts off
      // or adds reads as zeros either way), whereas cutting first could lose bytes on a failure.
      if (before.kind === "own" && old.sizeBytes !== bytes) next = this.#resizeOwn(lvol, old, bytes);
      store.media.set(lvol, next);
      if (plan.released) await this.#deallocate(store, plan.released);
    });
    const bdev = store.bdevs.get(lvol);
    if (bdev) await this.registry.notifyResize(bdev);
  }

  /**
   * Snapshots an lvol and registers the snapshot's bdev; EEXIST/EINVAL from the blobstore. The
   * snapshot's own container gets a copy of the origin's bytes as they are now, read through the
   * page cache of the origin's file, so it includes every write completed so far. The origin
   * keeps its home.
   */
  async snapshot(store: LoadedStore, lvol: Lvol, name: string): Promise<Lvol> {
    const snap = await store.lock.run(() =>
      this.#copyInto(store, mediaOf(store, lvol), () => store.bs.snapshot(lvol, name)),
    );
    await this.#registerLvol(store, snap);
    return snap;
  }

  /**
   * Clones a snapshot and registers the clone's bdev, its own container starting as a copy of the
   * snapshot's bytes; EINVAL for a non-snapshot, EEXIST for the name.
   */
  async clone(store: LoadedStore, snap: Lvol, name: string): Promise<Lvol> {
    const c = await store.lock.run(() =>
      this.#copyInto(store, mediaOf(store, snap), () => store.bs.clone(snap, name)),
    );
    await this.#registerLvol(store, c);
    return c;
  }

  /** EPERM when `lvol` is a snapshot with more than one clone. */
  checkDeletable(store: LoadedStore, lvol: Lvol): void {
    if (store.bs.clonesOf(lvol).length > 1) throw new ErrnoError(Errno.EPERM, lvol.name);
  }

  /** Deletes an lvol: its bdev is hot-removed first, then the blob goes, then its bytes. */
  async deleteLvol(store: LoadedStore, lvol: Lvol): Promise<void> {
    this.checkDeletable(store, lvol);
    const bdev = store.bdevs.get(lvol);
    if (bdev) await this.registry.unregister(bdev);
    await store.lock.run(async () => {
      const undo = store.bs.checkpoint();
      const home = store.bs.delete(lvol);
      try {
        await writeMetadata(store);
      } catch (err) {
        undo();
        throw err;
      }
      const media = store.media.get(lvol);
      store.media.delete(lvol);
      // The default clear_method "unmap": a freed run reads as zeros (and the file shrinks).
      if (home.kind === "run") await this.#deallocate(store, home);
      else if (media !== undefined) this.#dropOwn(store, lvol, media);
    });
  }

  /**
   * Starts a shallow copy of `lvol` onto the bdev `dstName`, as vbdev_lvol_shallow_copy does:
   * synchronously, the destination must exist (ENODEV) and take the lvol module's
   * read_many_write_one claim (EPERM when already claimed), held until the copy ends. What
   * spdk_bs_blob_shallow_copy checks once it has the blob open (read-only source, destination
   * size and block size, another copy running) fails `run`, not this call, so that the RPC
   * reports it in the check, as SPDK does.
   */
  beginShallowCopy(store: LoadedStore, lvol: Lvol, dstName: string, owner: string): ShallowCopy {
    const dst = this.registry.get(dstName);
    if (!dst) throw new ErrnoError(Errno.ENODEV, dstName);
    this.registry.claim(dst, "read_many_write_one", owner);
    const cs = store.bs.clusterSize;
    // Fixed at the start, like SPDK's total; SPDK's lock on the blob keeps its clusters fixed too.
    const clusters = lvol.ownClusters;
    let started = false;
    const run = async (pause: () => Promise<void>, progress: (copied: number) => void) => {
      if (started) throw new Error("shallow copy run twice");
      started = true;
      try {
        if (!lvol.snapshot) throw new ErrnoError(Errno.EPERM, "shallow copy, blob must be read only");
        if (lvol.numClusters * cs > dst.numBlocks * dst.blockSize) {
          throw new ErrnoError(Errno.EINVAL, "shallow copy, external device must have at least blob size");
        }
        if (store.bs.blockSize % dst.blockSize !== 0) {
          throw new ErrnoError(Errno.EINVAL, "shallow copy, external device block size is not compatible");
        }
        if (this.#copying.has(lvol)) throw new ErrnoError(Errno.EBUSY, "another operation in progress");
        this.#copying.add(lvol);
        try {
          let copied = 0;
          for (const i of clusters) {
            await pause();
            // Real SPDK holds both ends: the copy keeps the source blob open and locked (a
            // bdev_lvol_delete of it removes its bdev but fails the blob delete with EBUSY) and
            // the destination's descriptor open (bdev_unregister_unsafe defers the removal until
            // it closes), so there the copy runs on. The emulator lets both deletes through;
            // the next cluster then fails as a failed read or write of it does in
            // bs_shallow_copy_*_cpl, where bdev_blob_io_complete turns any failed I/O into -EIO:
            // state "error", "Input/output error".
            if (!this.#stores.includes(store) || !store.bs.lvols.includes(lvol)) {
              throw new ErrnoError(Errno.EIO, `shallow copy source ${lvol.name} is gone`);
            }
            if (this.registry.get(dst.name) !== dst) {
              throw new ErrnoError(Errno.EIO, `shallow copy destination ${dst.name} is gone`);
            }
            const data = await store.lock.run(async () => mediaOf(store, lvol).read(i * cs, cs));
            try {
              await dst.io.write(i * cs, data);
            } catch (err) {
              throw new ErrnoError(Errno.EIO, String(err));
            }
            copied++;
            progress(copied);
          }
        } finally {
          this.#copying.delete(lvol);
        }
      } finally {
        this.registry.release(dst, owner);
      }
    };
    return { totalClusters: lvol.allocatedClusters, run };
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
    return { lvol: out };
  }

  /** Closes every open lvol file without unloading anything (the process is going away). */
  closeAll(): void {
    for (const store of this.#stores) closeMedia(store);
  }

  #newStore(bs: Blobstore, base: Bdev): LoadedStore {
    const ownDir =
      this.#lvolDir !== undefined && base.module !== "malloc" ? join(this.#lvolDir, bs.uuid) : undefined;
    return { bs, base, bdevs: new Map(), lock: new Mutex(), media: new Map(), ownDir };
  }

  /**
   * Under the store lock: runs `make` (a snapshot or clone, homed in a new own container), fills
   * that container with a copy of `source` and persists. Anything failing undoes it all.
   */
  async #copyInto(store: LoadedStore, source: Media, make: () => Lvol): Promise<Lvol> {
    const undo = store.bs.checkpoint();
    const made = make();
    let media: Media | undefined;
    try {
      media = this.#createOwn(store, made);
      await copyRange(source, 0, media, 0, Math.min(source.sizeBytes, media.sizeBytes));
      await writeMetadata(store);
    } catch (err) {
      undo();
      if (media !== undefined) this.#dropOwn(store, made, media);
      throw err;
    }
    store.media.set(made, media);
    return made;
  }

  /** A new, empty own container for `lvol`, as long as the lvol (an existing file is emptied). */
  #createOwn(store: LoadedStore, lvol: Lvol): FileExtentIo | MemoryIo {
    const bytes = lvol.numClusters * store.bs.clusterSize;
    if (store.ownDir === undefined) return new MemoryIo(bytes);
    mkdirSync(store.ownDir, { recursive: true });
    const path = ownPath(store.ownDir, lvol);
    const fd = openSync(path, "w");
    try {
      ftruncateSync(fd, bytes);
    } finally {
      closeSync(fd);
    }
    return new FileExtentIo(path, 0, bytes);
  }

  /** The own container of a loaded lvol; a missing file is recreated empty, a wrong length fixed. */
  #openOwn(store: LoadedStore, lvol: Lvol): FileExtentIo | MemoryIo {
    const bytes = lvol.numClusters * store.bs.clusterSize;
    if (store.ownDir === undefined) return new MemoryIo(bytes);
    const path = ownPath(store.ownDir, lvol);
    if (!existsSync(path)) {
      this.log.warn("lvol file missing; the lvol reads as zeros", {
        lvol: `${store.bs.name}/${lvol.name}`,
        path,
      });
      return this.#createOwn(store, lvol);
    }
    if (statSync(path).size !== bytes) truncateSync(path, bytes);
    return new FileExtentIo(path, 0, bytes);
  }

  /** Sets an own container's length; a failure is logged (the file then reads zeros past its end). */
  #resizeOwn(lvol: Lvol, media: Media, bytes: number): Media {
    if (media instanceof MemoryIo) {
      media.resize(bytes);
      return media;
    }
    if (!(media instanceof FileExtentIo)) return media;
    try {
      truncateSync(media.path, bytes);
    } catch (err) {
      this.log.warn("resizing an lvol file failed", { lvol: lvol.name, err: String(err) });
    }
    media.close();
    return new FileExtentIo(media.path, 0, bytes);
  }

  /** Closes and removes an own container; a failure only costs space, so it is logged. */
  #dropOwn(store: LoadedStore, lvol: Lvol, media: Media): void {
    if (!(media instanceof FileExtentIo)) return;
    media.close();
    try {
      unlinkSync(media.path);
    } catch (err) {
      this.log.warn("removing an lvol file failed", {
        lvs: store.bs.name,
        lvol: lvol.name,
        err: String(err),
      });
    }
  }

  /** Deallocates a freed run; a failure only costs space, so it is logged, not thrown. */
  async #deallocate(store: LoadedStore, run: ClusterRun): Promise<void> {
    try {
      await zeroRun(store, run);
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
      // vbdev_lvol_get_memory_domains hands on the base bdev's: none on an AIO file or a drive.
      ...(store.base.memoryDomains === undefined ? {} : { memoryDomains: store.base.memoryDomains }),
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
    const md = parseMetadata(JSON.parse(json.toString("utf8")));
    const { bs, legacy } = Blobstore.fromMetadata(md);
    if (this.byName(bs.name) || this.byUuid(bs.uuid)) {
      this.log.warn("lvstore with the same name or uuid already loaded; not loaded", {
        bdev: bdev.name,
        lvs: bs.name,
      });
      return;
    }
    if (bdev.claim) return;
    this.registry.claim(bdev, "read_many_write_one", `lvs:${bs.uuid}`);
    const store = this.#newStore(bs, bdev);
    try {
      await store.lock.run(() => this.#openAll(store, md, legacy));
    } catch (err) {
      closeMedia(store);
      this.registry.release(bdev, `lvs:${bs.uuid}`);
      this.log.warn("lvstore not loaded: its lvols could not be opened", {
        bdev: bdev.name,
        err: String(err),
      });
      return;
    }
    this.#stores.push(store);
    this.log.info("lvstore loaded", { bdev: bdev.name, lvs: bs.name, lvols: bs.lvols.length });
    for (const lvol of bs.lvols) await this.#registerLvol(store, lvol);
  }

  /**
   * Opens the bytes of every lvol of a store being loaded. Legacy lvols (metadata from before
   * homes) are copied from the old layout into own containers and the upgraded metadata written,
   * before anything else touches the base. Files in the store's directory that no lvol owns
   * (left by a crash between creating a file and persisting its lvol) are removed.
   */
  async #openAll(store: LoadedStore, md: LvstoreMetadata, legacy: readonly Lvol[]): Promise<void> {
    for (const lvol of store.bs.lvols) {
      const home = store.bs.home(lvol);
      if (legacy.includes(lvol)) store.media.set(lvol, this.#createOwn(store, lvol));
      else store.media.set(lvol, home.kind === "run" ? runIo(store, home) : this.#openOwn(store, lvol));
    }
    if (legacy.length > 0) {
      const source = legacyByteSource(md);
      const cs = store.bs.clusterSize;
      for (const lvol of legacy) {
        const media = mediaOf(store, lvol);
        for (let i = 0; i < lvol.numClusters; i++) {
          const pc = source(lvol.uuid, i);
          if (pc !== undefined) await copyRange(store.base.io, pc * cs, media, i * cs, cs);
        }
      }
      await writeMetadata(store);
      this.log.info("lvstore metadata upgraded: lvols copied into files of their own", {
        lvs: store.bs.name,
        lvols: legacy.map((l) => l.name),
      });
    }
    if (store.ownDir === undefined || !existsSync(store.ownDir)) return;
    const owned = new Set(
      store.bs.lvols.filter((l) => store.bs.home(l).kind === "own").map((l) => `${l.uuid}.img`),
    );
    for (const name of readdirSync(store.ownDir)) {
      if (owned.has(name)) continue;
      try {
        unlinkSync(join(store.ownDir, name));
      } catch {
        // gone already, or not ours to remove
      }
    }
  }

  /** Unloads (without destroying) every store whose base goes away. */
  async #onRemove(bdev: Bdev): Promise<void> {
    for (const store of [...this.#stores]) if (store.base === bdev) await this.#unload(store);
  }

  async #unload(store: LoadedStore): Promise<void> {
    for (const b of [...store.bdevs.values()]) await this.registry.unregister(b);
    const at = this.#stores.indexOf(store);
    if (at >= 0) this.#stores.splice(at, 1);
    await store.lock.run(async () => closeMedia(store));
    this.registry.release(store.base, `lvs:${store.bs.uuid}`);
  }
}

/**
 * The data path of one lvol: its bytes are all in its home; writes to clusters SPDK has not
 * allocated yet (a thin lvol, a clone) allocate them, as copy-on-write would, for the accounting.
 */
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
      return mediaOf(this.store, this.lvol).read(offset, length);
    });
  }

  write(offset: number, data: Uint8Array): Promise<void> {
    return this.store.lock.run(async () => {
      // A snapshot's bdev does not support writes; the bdev layer fails them.
      if (this.lvol.snapshot) throw new ErrnoError(Errno.EIO, "snapshot is read-only");
      checkRange(offset, data.length, this.sizeBytes);
      const { bs } = this.store;
      const cs = bs.clusterSize;
      const fresh: number[] = [];
      if (data.length > 0) {
        const last = Math.floor((offset + data.length - 1) / cs);
        for (let i = Math.floor(offset / cs); i <= last; i++)
          if ((this.lvol.map[i] as number) < 0) fresh.push(i);
      }
      if (fresh.length > bs.freeClusters) throw new ErrnoError(Errno.ENOSPC, "no free cluster");
      const undo = fresh.length > 0 ? bs.checkpoint() : undefined;
      for (const i of fresh) this.lvol.map[i] = bs.allocate();
      try {
        await mediaOf(this.store, this.lvol).write(offset, data);
        // Like a thin blob's cluster allocation, the new mapping is persisted before completing.
        if (undo) await writeMetadata(this.store);
      } catch (err) {
        undo?.();
        throw err;
      }
    });
  }

  /**
   * Unmap: the range reads as zeros afterwards, done on the lvol's home as the medium can (a hole
   * punched into its file or the drive's), so no cluster is allocated and no zeros are written.
   * Without it the target wrote an unmap's zeros through write(): mkfs's discard of a 1 GiB
   * volume was 1 GiB of synchronous writes that held the target's event loop (keep-alives
   * included) for seconds, and allocated every cluster of a thin lvol.
   */
  deallocate(offset: number, length: number): Promise<void> {
    return this.store.lock.run(async () => {
      if (this.lvol.snapshot) throw new ErrnoError(Errno.EIO, "snapshot is read-only");
      checkRange(offset, length, this.sizeBytes);
      await zeroRange(mediaOf(this.store, this.lvol), offset, length);
    });
  }
}

/** The file extent of `lvol`'s bytes (lab-side inspection and pinning); none for a snapshot (read-only) or RAM. */
function lvolExtent(store: LoadedStore, lvol: Lvol): FileExtent | undefined {
  if (lvol.snapshot) return undefined;
  const m = store.media.get(lvol);
  return m === undefined ? undefined : extentOfIo(m);
}

function extentOfIo(io: BlockIo): FileExtent | undefined {
  return io.fileExtent?.();
}

function mediaOf(store: LoadedStore, lvol: Lvol): Media {
  const m = store.media.get(lvol);
  if (m === undefined) throw new ErrnoError(Errno.EIO, `lvol ${lvol.name} is not open`);
  return m;
}

function closeMedia(store: LoadedStore): void {
  for (const m of store.media.values()) if (m instanceof FileExtentIo) m.close();
  store.media.clear();
}

function ownPath(dir: string, lvol: Lvol): string {
  return join(dir, `${lvol.uuid}.img`);
}

/** The window onto the base of a run home. */
function runIo(store: LoadedStore, home: Home & { kind: "run" }): WindowIo {
  const cs = store.bs.clusterSize;
  return new WindowIo(store.base.io, home.start * cs, home.count * cs);
}

/** Zeros (deallocates) a run of base clusters. */
async function zeroRun(store: LoadedStore, run: ClusterRun): Promise<void> {
  const cs = store.bs.clusterSize;
  await zeroRange(store.base.io, run.start * cs, run.count * cs);
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
