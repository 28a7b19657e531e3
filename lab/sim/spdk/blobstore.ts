// The pure core of an lvol store: blobstore layout arithmetic, cluster allocation, thin and thick
// lvols, snapshots and clones, and the metadata record that is persisted on the base device.
// No I/O here; lvol-store.ts moves bytes and writes this metadata.
//
// Lab deviation from SPDK (which maps a thick blob's clusters wherever they are free): a thick lvol
// is kept as ONE run of physical clusters, so its bytes are one extent of the base device that the
// lab's initiator can show with a loop device. Create takes the first run that fits; growing
// extends in place when the following clusters are free, else moves the lvol to the first run
// that fits (lvol-store.ts copies the bytes). Only when no run fits although enough clusters are
// free does a thick lvol get scattered clusters, as SPDK would give it: the RPC succeeds, but the
// lvol has no runOf() and the lab initiator refuses to attach it. Thin lvols, snapshots and clones
// are mapped as SPDK maps them and are never attachable by the lab initiator.
import { randomUUID } from "node:crypto";
import * as v from "valibot";
import { Errno, ErrnoError } from "./rpc-error.ts";

/** SPDK's lvstore default cluster size (4 MiB). */
export const DEFAULT_CLUSTER_SIZE = 4 * 1024 * 1024;
/** Blobstore metadata page size. */
export const PAGE_SIZE = 4096;
/** Longest lvstore / lvol name (SPDK_LVS_NAME_MAX and SPDK_LVOL_NAME_MAX minus the NUL). */
export const MAX_NAME = 63;
// sizeof(struct spdk_bs_md_mask): type, length, then the bits.
const MASK_HEADER = 8;

/** Where the metadata ends and how many clusters hold data, as spdk_bs_init computes it. */
export interface Layout {
  readonly totalClusters: number;
  readonly mdClusters: number;
  readonly totalDataClusters: number;
}

/**
 * The blobstore layout on a base device of `baseBytes`: the super block, three bit masks and one
 * metadata page per cluster (num_md_pages_per_cluster_ratio 100) are rounded up to whole clusters
 * at the front. Throws ErrnoError EINVAL for a cluster size that is not a multiple of the page
 * and block size, ENOMEM when the metadata would not fit (SPDK's answer for a too small device).
 */
export function computeLayout(
  baseBytes: number,
  blockSize: number,
  clusterSize: number,
  mdRatio = 100,
): Layout {
  if (clusterSize < PAGE_SIZE || clusterSize % PAGE_SIZE !== 0 || clusterSize % blockSize !== 0) {
    throw new ErrnoError(Errno.EINVAL, `cluster size ${clusterSize}`);
  }
  if (PAGE_SIZE % blockSize !== 0) throw new ErrnoError(Errno.EINVAL, `block size ${blockSize}`);
  const totalClusters = Math.floor(baseBytes / clusterSize);
  const mdLen = Math.floor((mdRatio * totalClusters) / 100);
  const mask = (bits: number) => Math.ceil((MASK_HEADER + Math.ceil(bits / 8)) / PAGE_SIZE);
  const mdPages = 1 + mask(mdLen) + mask(totalClusters) + mask(mdLen) + mdLen;
  const mdClusters = Math.ceil(mdPages / (clusterSize / PAGE_SIZE));
  if (totalClusters === 0 || mdClusters >= totalClusters) {
    throw new ErrnoError(Errno.ENOMEM, "device too small for the blobstore metadata");
  }
  return { totalClusters, mdClusters, totalDataClusters: totalClusters - mdClusters };
}

/** A logical volume (blob). `map[i]` is the physical cluster of logical cluster i, or -1. */
export class Lvol {
  constructor(
    readonly uuid: string,
    public name: string,
    public thin: boolean,
    /** Created by bdev_lvol_snapshot: read-only from then on. */
    readonly snapshot: boolean,
    public parent: Lvol | null,
    public map: number[],
    /**
     * Logical clusters whose bytes live on the device. An allocated but unwritten cluster still
     * reads as zeros, which spares zeroing whole thick volumes on creation.
     */
    public written: Set<number>,
  ) {}

  get numClusters(): number {
    return this.map.length;
  }

  get allocatedClusters(): number {
    return this.map.filter((pc) => pc >= 0).length;
  }
}

/** Persisted form of the store, validated on load. */
const RunSchema = v.tuple([v.number(), v.number(), v.number()]);
const MetadataSchema = v.object({
  format: v.literal("distort-sim-lvstore"),
  version: v.literal(1),
  uuid: v.string(),
  name: v.string(),
  clusterSize: v.number(),
  blockSize: v.number(),
  totalClusters: v.number(),
  mdClusters: v.number(),
  lvols: v.array(
    v.object({
      uuid: v.string(),
      name: v.string(),
      thin: v.boolean(),
      snapshot: v.boolean(),
      parent: v.nullable(v.string()),
      /** Orders the clones of one snapshot. */
      cloneSeq: v.number(),
      numClusters: v.number(),
      /** [logicalStart, physicalStart, count] runs of allocated clusters. */
      clusters: v.array(RunSchema),
      /** [start, count, 0] runs of written logical clusters. */
      written: v.array(RunSchema),
    }),
  ),
});
export type LvstoreMetadata = v.InferOutput<typeof MetadataSchema>;

/** Physical clusters start..start+count-1, holding logical clusters 0..count-1 in order. */
export interface ClusterRun {
  readonly start: number;
  readonly count: number;
}

/** The byte work a resize leaves to the caller, in this order, before the metadata is persisted. */
export interface ResizePlan {
  /** Physical clusters the lvol newly owns whose bytes must read as zeros. */
  readonly zero: readonly number[];
  /** [from, to] physical clusters whose bytes must be copied (a relocation). */
  readonly copy: readonly (readonly [from: number, to: number])[];
  /**
   * Physical clusters the lvol gave up (a shrink, or its old place after a relocation); already
   * free in the map, so the caller may deallocate them once the metadata is persisted.
   */
  readonly released: readonly number[];
}

/** Parses stored metadata; throws a valibot error when it is not ours or is damaged. */
export function parseMetadata(json: unknown): LvstoreMetadata {
  return v.parse(MetadataSchema, json);
}

/**
 * One lvol store. Mutations validate first and then change state, so a thrown ErrnoError leaves
 * the store as it was. Not safe for concurrent use across awaits; lvol-store.ts serialises.
 */
export class Blobstore {
  readonly lvols: Lvol[] = [];
  readonly #used: Uint8Array;

  constructor(
    readonly uuid: string,
    public name: string,
    readonly clusterSize: number,
    readonly blockSize: number,
    readonly layout: Layout,
  ) {
    this.#used = new Uint8Array(layout.totalClusters);
    for (let i = 0; i < layout.mdClusters; i++) this.#used[i] = 1;
  }

  /** A fresh, empty store on a base device of `baseBytes`. */
  static create(
    name: string,
    baseBytes: number,
    blockSize: number,
    clusterSize = DEFAULT_CLUSTER_SIZE,
  ): Blobstore {
    checkName(name);
    return new Blobstore(
      randomUUID(),
      name,
      clusterSize,
      blockSize,
      computeLayout(baseBytes, blockSize, clusterSize),
    );
  }

  get freeClusters(): number {
    let n = 0;
    for (const u of this.#used) if (u === 0) n++;
    return n;
  }

  get metadataBytes(): number {
    return this.layout.mdClusters * this.clusterSize;
  }

  find(nameOrUuid: string): Lvol | undefined {
    return this.lvols.find((l) => l.name === nameOrUuid || l.uuid === nameOrUuid);
  }

  /** The clones of `snap`, in the order they became its clones. */
  clonesOf(snap: Lvol): Lvol[] {
    return this.lvols
      .filter((l) => l.parent === snap)
      .sort((a, b) => this.#cloneOrder(a) - this.#cloneOrder(b));
  }

  readonly #cloneSeq = new Map<Lvol, number>();
  #seq = 0;
  #cloneOrder(l: Lvol): number {
    return this.#cloneSeq.get(l) ?? 0;
  }
  #setParent(l: Lvol, parent: Lvol | null): void {
    l.parent = parent;
    this.#cloneSeq.set(l, this.#seq++);
  }

  /** Clusters needed for `bytes`, rounded up as spdk_blob_resize does. */
  clustersFor(bytes: number): number {
    return Math.ceil(bytes / this.clusterSize);
  }

  /** EEXIST when `name` is in use in this store, EINVAL when it is not a valid lvol name. */
  checkNewName(name: string): void {
    checkName(name);
    if (this.lvols.some((l) => l.name === name)) throw new ErrnoError(Errno.EEXIST, name);
  }

  /** The first (lowest) run of `n` > 0 free data clusters, or undefined when none fits. */
  findRun(n: number): number | undefined {
    let len = 0;
    for (let pc = this.layout.mdClusters; pc < this.#used.length; pc++) {
      len = this.#used[pc] === 0 ? len + 1 : 0;
      if (len === n) return pc - n + 1;
    }
    return undefined;
  }

  /**
   * Where the bytes of `lvol` lie when they are one run: a thick lvol (not a snapshot, not a clone)
   * with at least one cluster, every cluster written (so the device's bytes are the lvol's bytes)
   * and its clusters consecutive in logical order. Undefined for anything else.
   */
  runOf(lvol: Lvol): ClusterRun | undefined {
    if (lvol.thin || lvol.snapshot || lvol.parent !== null || lvol.numClusters === 0) return undefined;
    if (lvol.written.size !== lvol.numClusters) return undefined;
    const start = lvol.map[0] as number;
    if (start < this.layout.mdClusters) return undefined;
    for (let i = 1; i < lvol.map.length; i++) if (lvol.map[i] !== start + i) return undefined;
    return { start, count: lvol.map.length };
  }

  /**
   * A function that puts the cluster allocation and `lvol`'s mapping back as they are now, to undo
   * a change whose byte work or metadata write failed.
   */
  checkpoint(lvol: Lvol): () => void {
    const used = this.#used.slice();
    const map = [...lvol.map];
    const written = new Set(lvol.written);
    return () => {
      this.#used.set(used);
      lvol.map = map;
      lvol.written = written;
    };
  }

  /** Takes one free data cluster; ENOSPC when none is left. */
  allocate(): number {
    const at = this.#used.indexOf(0);
    if (at < 0) throw new ErrnoError(Errno.ENOSPC, "no free cluster");
    this.#used[at] = 1;
    return at;
  }

  #release(pc: number): void {
    if (pc >= this.layout.mdClusters) this.#used[pc] = 0;
  }

  /** True when the `n` clusters from `start` exist and are all free. */
  #freeFrom(start: number, n: number): boolean {
    if (start + n > this.#used.length) return false;
    for (let pc = start; pc < start + n; pc++) if (this.#used[pc] !== 0) return false;
    return true;
  }

  /** `n` clusters for a thick lvol: the first run that fits, else the first `n` free ones. */
  #take(n: number): number[] {
    const start = n === 0 ? undefined : this.findRun(n);
    if (start === undefined) return Array.from({ length: n }, () => this.allocate());
    this.#used.fill(1, start, start + n);
    return Array.from({ length: n }, (_, i) => start + i);
  }

  /**
   * A new lvol. A thick one gets all its clusters now, as one run when one fits (see the file
   * header), and counts them as written: the caller zeroes them on the device before use. ENOSPC
   * when fewer clusters are free than it needs.
   */
  createLvol(name: string, sizeBytes: number, thin: boolean): Lvol {
    this.checkNewName(name);
    const n = this.clustersFor(sizeBytes);
    if (!thin && n > this.freeClusters) throw new ErrnoError(Errno.ENOSPC, `${n} clusters wanted`);
    const map = thin ? new Array<number>(n).fill(-1) : this.#take(n);
    const written = thin ? new Set<number>() : new Set(map.keys());
    const lvol = new Lvol(randomUUID(), name, thin, false, null, map, written);
    this.lvols.push(lvol);
    return lvol;
  }

  /**
   * Grows or shrinks `lvol` and returns the byte work left to do. A thin lvol only changes its
   * length. A thick one grows in place when the clusters after its run are free, else moves to
   * the first run that fits (plan.copy), else takes scattered clusters; new clusters count as
   * written (plan.zero). `pinned` means something outside the emulator maps the lvol's current
   * extent: then it may only grow in place, and anything else (moving, scattering, shrinking under
   * the mapping) is EBUSY. EPERM for a snapshot; ENOSPC when too few clusters are free.
   */
  resize(lvol: Lvol, sizeBytes: number, opts: { pinned?: boolean } = {}): ResizePlan {
    if (lvol.snapshot) throw new ErrnoError(Errno.EPERM, "a snapshot is read-only");
    const n = this.clustersFor(sizeBytes);
    const old = lvol.numClusters;
    const released: number[] = [];
    if (n === old) return { zero: [], copy: [], released };
    if (n < old) {
      if (opts.pinned) throw new ErrnoError(Errno.EBUSY, `${lvol.name} is mapped; it cannot shrink`);
      for (let i = n; i < old; i++) {
        const pc = lvol.map[i] as number;
        if (pc >= 0) {
          this.#release(pc);
          released.push(pc);
        }
        lvol.written.delete(i);
      }
      lvol.map.length = n;
      return { zero: [], copy: [], released };
    }
    if (lvol.thin) {
      for (let i = old; i < n; i++) lvol.map.push(-1);
      return { zero: [], copy: [], released };
    }
    const grow = n - old;
    if (grow > this.freeClusters) throw new ErrnoError(Errno.ENOSPC, `${grow} more clusters wanted`);
    const run = this.runOf(lvol);
    const end = run === undefined ? -1 : run.start + run.count;
    let added: number[] | undefined;
    if (old === 0) added = this.#take(n);
    else if (run !== undefined && this.#freeFrom(end, grow)) added = this.#takeRange(end, grow);
    if (added !== undefined) {
      this.#append(lvol, added);
      return { zero: added, copy: [], released };
    }
    if (opts.pinned) {
      throw new ErrnoError(
        Errno.EBUSY,
        `${lvol.name} is mapped and can only grow in place, but the clusters after it are taken`,
      );
    }
    const start = this.findRun(n);
    if (start === undefined) {
      // No run fits: scattered, as SPDK would allocate (and no longer attachable in the lab).
      const scattered = Array.from({ length: grow }, () => this.allocate());
      this.#append(lvol, scattered);
      return { zero: scattered, copy: [], released };
    }
    // Relocate: the new run is taken while the old clusters are still held, so the two never
    // overlap and the old bytes stay intact until the new metadata is persisted.
    this.#used.fill(1, start, start + n);
    const zero: number[] = [];
    const copy: [number, number][] = [];
    for (let i = 0; i < n; i++) {
      const from = lvol.map[i];
      // Unwritten clusters (metadata from before thick lvols were zeroed) move as zeros.
      if (from !== undefined && from >= 0 && lvol.written.has(i)) copy.push([from, start + i]);
      else zero.push(start + i);
    }
    for (const pc of lvol.map) {
      if (pc >= 0) {
        this.#release(pc);
        released.push(pc);
      }
    }
    lvol.map = Array.from({ length: n }, (_, i) => start + i);
    lvol.written = new Set(lvol.map.keys());
    return { zero, copy, released };
  }

  /** Appends thick clusters to `lvol`, counted as written (the caller zeroes them). */
  #append(lvol: Lvol, pcs: readonly number[]): void {
    for (const pc of pcs) {
      lvol.written.add(lvol.map.length);
      lvol.map.push(pc);
    }
  }

  /** Marks the `n` free clusters from `start` used and returns them. */
  #takeRange(start: number, n: number): number[] {
    this.#used.fill(1, start, start + n);
    return Array.from({ length: n }, (_, i) => start + i);
  }

  /**
   * Snapshots `lvol`: the snapshot takes over its clusters and stays as thin as `lvol` was; `lvol`
   * becomes a thin clone of it with nothing allocated. EEXIST for a taken name, EINVAL for a
   * snapshot of a snapshot.
   */
  snapshot(lvol: Lvol, name: string): Lvol {
    this.checkNewName(name);
    if (lvol.snapshot) throw new ErrnoError(Errno.EINVAL, "cannot snapshot a snapshot");
    const snap = new Lvol(randomUUID(), name, lvol.thin, true, null, lvol.map, lvol.written);
    this.#setParent(snap, lvol.parent);
    this.lvols.push(snap);
    lvol.map = new Array<number>(snap.map.length).fill(-1);
    lvol.written = new Set();
    lvol.thin = true;
    this.#setParent(lvol, snap);
    return snap;
  }

  /** A thin clone of snapshot `snap`; EINVAL when `snap` is not a snapshot, EEXIST for the name. */
  clone(snap: Lvol, name: string): Lvol {
    if (!snap.snapshot) throw new ErrnoError(Errno.EINVAL, `${snap.name} is not a snapshot`);
    this.checkNewName(name);
    const c = new Lvol(
      randomUUID(),
      name,
      true,
      false,
      null,
      new Array<number>(snap.map.length).fill(-1),
      new Set(),
    );
    this.#setParent(c, snap);
    this.lvols.push(c);
    return c;
  }

  /**
   * Deletes `lvol`. A snapshot with several clones cannot go (EPERM); one with a single clone is
   * merged into it first (the clone keeps its own clusters, takes the snapshot's others and
   * inherits its parent). Returns the physical clusters that became free.
   */
  delete(lvol: Lvol): number[] {
    const clones = this.clonesOf(lvol);
    if (clones.length > 1) throw new ErrnoError(Errno.EPERM, `${lvol.name} has ${clones.length} clones`);
    const only = clones[0];
    if (only) {
      for (let i = 0; i < only.map.length; i++) {
        const mine = lvol.map[i];
        if (only.map[i] === -1 && mine !== undefined && mine >= 0) {
          only.map[i] = mine;
          if (lvol.written.has(i)) only.written.add(i);
          lvol.map[i] = -1;
        }
      }
      this.#setParent(only, lvol.parent);
    }
    const released: number[] = [];
    for (const pc of lvol.map) {
      if (pc >= 0) {
        this.#release(pc);
        released.push(pc);
      }
    }
    this.lvols.splice(this.lvols.indexOf(lvol), 1);
    this.#cloneSeq.delete(lvol);
    return released;
  }

  /** The record persisted on the base device; lvols in creation order. */
  toMetadata(): LvstoreMetadata {
    return {
      format: "distort-sim-lvstore",
      version: 1,
      uuid: this.uuid,
      name: this.name,
      clusterSize: this.clusterSize,
      blockSize: this.blockSize,
      totalClusters: this.layout.totalClusters,
      mdClusters: this.layout.mdClusters,
      lvols: this.lvols.map((l) => ({
        uuid: l.uuid,
        name: l.name,
        thin: l.thin,
        snapshot: l.snapshot,
        parent: l.parent?.uuid ?? null,
        cloneSeq: this.#cloneOrder(l),
        numClusters: l.numClusters,
        clusters: encodeMap(l.map),
        written: encodeSet([...l.written]),
      })),
    };
  }

  /** Rebuilds a store from its metadata (lvol order and clone order kept). */
  static fromMetadata(md: LvstoreMetadata): Blobstore {
    const layout: Layout = {
      totalClusters: md.totalClusters,
      mdClusters: md.mdClusters,
      totalDataClusters: md.totalClusters - md.mdClusters,
    };
    const bs = new Blobstore(md.uuid, md.name, md.clusterSize, md.blockSize, layout);
    const byUuid = new Map<string, Lvol>();
    for (const r of md.lvols) {
      const map = decodeMap(r.clusters, r.numClusters);
      for (const pc of map) if (pc >= 0 && pc < bs.#used.length) bs.#used[pc] = 1;
      const lvol = new Lvol(r.uuid, r.name, r.thin, r.snapshot, null, map, new Set(decodeSet(r.written)));
      byUuid.set(r.uuid, lvol);
      bs.lvols.push(lvol);
    }
    for (const r of md.lvols) {
      const lvol = byUuid.get(r.uuid) as Lvol;
      lvol.parent = r.parent === null ? null : (byUuid.get(r.parent) ?? null);
      bs.#cloneSeq.set(lvol, r.cloneSeq);
      bs.#seq = Math.max(bs.#seq, r.cloneSeq + 1);
    }
    return bs;
  }
}

function checkName(name: string): void {
  if (name.length === 0 || Buffer.byteLength(name) > MAX_NAME)
    throw new ErrnoError(Errno.EINVAL, `name ${name}`);
}

function encodeMap(map: readonly number[]): [number, number, number][] {
  const runs: [number, number, number][] = [];
  for (let i = 0; i < map.length; i++) {
    const pc = map[i] as number;
    if (pc < 0) continue;
    const last = runs[runs.length - 1];
    if (last && last[0] + last[2] === i && last[1] + last[2] === pc) last[2]++;
    else runs.push([i, pc, 1]);
  }
  return runs;
}

function decodeMap(runs: readonly (readonly [number, number, number])[], n: number): number[] {
  const map = new Array<number>(n).fill(-1);
  for (const [l, p, c] of runs) for (let k = 0; k < c; k++) map[l + k] = p + k;
  return map;
}

function encodeSet(items: number[]): [number, number, number][] {
  const runs: [number, number, number][] = [];
  for (const i of items.sort((a, b) => a - b)) {
    const last = runs[runs.length - 1];
    if (last && last[0] + last[1] === i) last[1]++;
    else runs.push([i, 1, 0]);
  }
  return runs;
}

function decodeSet(runs: readonly (readonly [number, number, number])[]): number[] {
  const out: number[] = [];
  for (const [s, c] of runs) for (let k = 0; k < c; k++) out.push(s + k);
  return out;
}
