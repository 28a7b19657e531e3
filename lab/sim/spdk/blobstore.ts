// The pure core of an lvol store: blobstore layout arithmetic, SPDK's cluster accounting for thin
// and thick lvols, snapshots and clones, the emulator's placement of their bytes (physical-map.ts),
// and the metadata record that is persisted on the base device. No I/O here; lvol-store.ts moves
// bytes and writes this metadata.
//
// The accounting is SPDK's: what each lvol has allocated (num_allocated_clusters), what the store
// has free, a snapshot taking over its origin's clusters and leaving it a thin clone, a snapshot's
// merge into its only clone on delete. Where bytes lie is the emulator's own business and kept
// apart (see physical-map.ts): every lvol holds all of its bytes, so any of them is one file extent.
import { randomUUID } from "node:crypto";
import * as v from "valibot";
import { type Home, type HomeResize, PhysicalMap } from "./physical-map.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

export type { ClusterRun, Home, HomeResize } from "./physical-map.ts";

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

/** A logical volume (blob). `map[i]` is the cluster SPDK's accounting gives logical cluster i, or -1. */
export class Lvol {
  constructor(
    readonly uuid: string,
    public name: string,
    public thin: boolean,
    /** Created by bdev_lvol_snapshot: read-only from then on. */
    readonly snapshot: boolean,
    public parent: Lvol | null,
    /**
     * Allocated clusters by logical index (-1: not allocated; SPDK would read the parent's or
     * zeros there). Accounting only: the bytes are wherever the lvol's home is.
     */
    public map: number[],
  ) {}

  get numClusters(): number {
    return this.map.length;
  }

  get allocatedClusters(): number {
    return this.map.filter((pc) => pc >= 0).length;
  }

  /**
   * The logical indexes of the clusters this lvol has allocated itself, ascending: what a shallow
   * copy writes (spdk_bs_blob_shallow_copy visits `active.clusters[i] != 0`), never the parent's.
   */
  get ownClusters(): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.map.length; i++) if ((this.map[i] as number) >= 0) out.push(i);
    return out;
  }
}

/** Persisted form of the store, validated on load. */
const RunSchema = v.tuple([v.number(), v.number(), v.number()]);
const count = v.pipe(v.number(), v.integer(), v.minValue(0));
const HomeSchema = v.variant("kind", [
  v.object({ kind: v.literal("run"), start: count, count }),
  v.object({ kind: v.literal("own") }),
]);
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
      /** [logicalStart, cluster, count] runs of allocated clusters. */
      clusters: v.array(RunSchema),
      /**
       * Where the bytes are. Absent in metadata from before lvols had homes ("legacy"): their bytes
       * then lie at their allocated clusters on the base, falling through to the parent's.
       */
      home: v.optional(HomeSchema),
      /** Legacy only: [start, count, 0] runs of logical clusters whose bytes were on the base. */
      written: v.optional(v.array(RunSchema)),
    }),
  ),
});
export type LvstoreMetadata = v.InferOutput<typeof MetadataSchema>;

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
  /** Where each lvol's bytes are. */
  readonly physical: PhysicalMap;
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
    this.physical = new PhysicalMap(layout.totalClusters, layout.mdClusters);
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

  /** Where the bytes of `lvol` are. */
  home(lvol: Lvol): Home {
    return this.physical.home(lvol);
  }

  /**
   * A function that puts the whole store back as it is now (lvols, their accounting, parents,
   * clone order and homes), to undo a change whose byte work or metadata write failed.
   */
  checkpoint(): () => void {
    const used = this.#used.slice();
    const lvols = [...this.lvols];
    const fields = lvols.map((l) => ({ l, name: l.name, thin: l.thin, parent: l.parent, map: [...l.map] }));
    const cloneSeq = new Map(this.#cloneSeq);
    const seq = this.#seq;
    const physical = this.physical.checkpoint();
    return () => {
      this.#used.set(used);
      this.lvols.splice(0, this.lvols.length, ...lvols);
      for (const f of fields) {
        f.l.name = f.name;
        f.l.thin = f.thin;
        f.l.parent = f.parent;
        f.l.map = f.map;
      }
      this.#cloneSeq.clear();
      for (const [l, n] of cloneSeq) this.#cloneSeq.set(l, n);
      this.#seq = seq;
      physical();
    };
  }

  /** Takes one free cluster for accounting; ENOSPC when none is left. */
  allocate(): number {
    const at = this.#used.indexOf(0);
    if (at < 0) throw new ErrnoError(Errno.ENOSPC, "no free cluster");
    this.#used[at] = 1;
    return at;
  }

  #release(pc: number): void {
    if (pc >= this.layout.mdClusters) this.#used[pc] = 0;
  }

  /**
   * A new lvol. A thick one gets all its clusters now and a run of base clusters for a home when
   * one fits (the caller zeroes it); a thin one allocates on first write. ENOSPC when a thick one
   * needs more clusters than are free.
   */
  createLvol(name: string, sizeBytes: number, thin: boolean): Lvol {
    this.checkNewName(name);
    const n = this.clustersFor(sizeBytes);
    if (!thin && n > this.freeClusters) throw new ErrnoError(Errno.ENOSPC, `${n} clusters wanted`);
    const map = thin ? new Array<number>(n).fill(-1) : Array.from({ length: n }, () => this.allocate());
    const lvol = new Lvol(randomUUID(), name, thin, false, null, map);
    this.physical.place(lvol, n, !thin);
    this.lvols.push(lvol);
    return lvol;
  }

  /**
   * Grows or shrinks `lvol` and returns the byte work left to do. A thick lvol allocates the new
   * clusters (ENOSPC when too few are free) and frees the cut ones; a thin one only changes length.
   * EPERM for a snapshot.
   */
  resize(lvol: Lvol, sizeBytes: number): HomeResize {
    if (lvol.snapshot) throw new ErrnoError(Errno.EPERM, "a snapshot is read-only");
    const n = this.clustersFor(sizeBytes);
    const old = lvol.numClusters;
    if (n > old && !lvol.thin && n - old > this.freeClusters) {
      throw new ErrnoError(Errno.ENOSPC, `${n - old} more clusters wanted`);
    }
    const plan = this.physical.resize(lvol, old, n);
    if (n < old) {
      for (let i = n; i < old; i++) this.#release(lvol.map[i] as number);
      lvol.map.length = n;
    } else {
      for (let i = old; i < n; i++) lvol.map.push(lvol.thin ? -1 : this.allocate());
    }
    return plan;
  }

  /**
   * Snapshots `lvol`: the snapshot takes over its clusters and stays as thin as `lvol` was; `lvol`
   * becomes a thin clone of it with nothing allocated. The snapshot gets its own container (the
   * caller copies `lvol`'s bytes into it); `lvol` keeps its home. EEXIST for a taken name, EINVAL
   * for a snapshot of a snapshot.
   */
  snapshot(lvol: Lvol, name: string): Lvol {
    this.checkNewName(name);
    if (lvol.snapshot) throw new ErrnoError(Errno.EINVAL, "cannot snapshot a snapshot");
    const snap = new Lvol(randomUUID(), name, lvol.thin, true, null, lvol.map);
    this.#setParent(snap, lvol.parent);
    this.physical.place(snap, snap.numClusters, false);
    this.lvols.push(snap);
    lvol.map = new Array<number>(snap.map.length).fill(-1);
    lvol.thin = true;
    this.#setParent(lvol, snap);
    return snap;
  }

  /**
   * A thin clone of snapshot `snap`, in a container of its own (the caller copies the snapshot's
   * bytes into it). EINVAL when `snap` is not a snapshot, EEXIST for the name.
   */
  clone(snap: Lvol, name: string): Lvol {
    if (!snap.snapshot) throw new ErrnoError(Errno.EINVAL, `${snap.name} is not a snapshot`);
    this.checkNewName(name);
    const c = new Lvol(randomUUID(), name, true, false, null, new Array<number>(snap.map.length).fill(-1));
    this.#setParent(c, snap);
    this.physical.place(c, c.numClusters, false);
    this.lvols.push(c);
    return c;
  }

  /**
   * Deletes `lvol` and returns its former home (whose bytes the caller frees). A snapshot with
   * several clones cannot go (EPERM); one with a single clone is merged into it first: the clone
   * keeps its own clusters, takes the snapshot's others and inherits its parent. No bytes move in
   * a merge: the clone holds all of its bytes already.
   */
  delete(lvol: Lvol): Home {
    const clones = this.clonesOf(lvol);
    if (clones.length > 1) throw new ErrnoError(Errno.EPERM, `${lvol.name} has ${clones.length} clones`);
    const only = clones[0];
    if (only) {
      for (let i = 0; i < only.map.length; i++) {
        const mine = lvol.map[i];
        if (only.map[i] === -1 && mine !== undefined && mine >= 0) {
          only.map[i] = mine;
          lvol.map[i] = -1;
        }
      }
      this.#setParent(only, lvol.parent);
    }
    for (const pc of lvol.map) if (pc >= 0) this.#release(pc);
    this.lvols.splice(this.lvols.indexOf(lvol), 1);
    this.#cloneSeq.delete(lvol);
    return this.physical.remove(lvol);
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
        home: { ...this.physical.home(l) },
      })),
    };
  }

  /**
   * Rebuilds a store from its metadata (lvol order and clone order kept). A legacy lvol (no home
   * recorded) whose bytes are one run of written clusters on the base is homed there; every other
   * legacy lvol gets an own container and is listed in `legacy`: the caller fills it from the old
   * layout (legacyByteSource) before anything is written to the base.
   */
  static fromMetadata(md: LvstoreMetadata): { bs: Blobstore; legacy: Lvol[] } {
    const layout: Layout = {
      totalClusters: md.totalClusters,
      mdClusters: md.mdClusters,
      totalDataClusters: md.totalClusters - md.mdClusters,
    };
    const bs = new Blobstore(md.uuid, md.name, md.clusterSize, md.blockSize, layout);
    const byUuid = new Map<string, Lvol>();
    const legacy: Lvol[] = [];
    for (const r of md.lvols) {
      const map = decodeMap(r.clusters, r.numClusters);
      for (const pc of map) if (pc >= 0 && pc < bs.#used.length) bs.#used[pc] = 1;
      const lvol = new Lvol(r.uuid, r.name, r.thin, r.snapshot, null, map);
      byUuid.set(r.uuid, lvol);
      bs.lvols.push(lvol);
      const home = r.home ?? legacyRun(r, md.mdClusters);
      if (home === undefined) legacy.push(lvol);
      bs.physical.adopt(lvol, home ?? { kind: "own" });
    }
    for (const r of md.lvols) {
      const lvol = byUuid.get(r.uuid) as Lvol;
      lvol.parent = r.parent === null ? null : (byUuid.get(r.parent) ?? null);
      bs.#cloneSeq.set(lvol, r.cloneSeq);
      bs.#seq = Math.max(bs.#seq, r.cloneSeq + 1);
    }
    return { bs, legacy };
  }
}

type LvolRecord = LvstoreMetadata["lvols"][number];

/**
 * Where a legacy thick lvol's bytes were when they form one run, as the old layout kept thick
 * lvols: not thin, no snapshot or parent, every cluster written, consecutive clusters past the
 * metadata. Undefined for anything else.
 */
function legacyRun(r: LvolRecord, mdClusters: number): Home | undefined {
  if (r.thin || r.snapshot || r.parent !== null || r.numClusters === 0) return undefined;
  const map = decodeMap(r.clusters, r.numClusters);
  if (new Set(decodeSet(r.written ?? [])).size !== r.numClusters) return undefined;
  const start = map[0] as number;
  if (start < mdClusters) return undefined;
  for (let i = 1; i < map.length; i++) if (map[i] !== start + i) return undefined;
  return { kind: "run", start, count: map.length };
}

/**
 * For legacy metadata: the base cluster holding logical cluster i of lvol `uuid` under the old
 * layout (the lvol's own written cluster, else its nearest ancestor's), or undefined where it read
 * as zeros.
 */
export function legacyByteSource(md: LvstoreMetadata): (uuid: string, i: number) => number | undefined {
  const records = new Map(
    md.lvols.map((r) => [
      r.uuid,
      { r, map: decodeMap(r.clusters, r.numClusters), written: new Set(decodeSet(r.written ?? [])) },
    ]),
  );
  return (uuid, i) => {
    for (let at = records.get(uuid); at; at = at.r.parent === null ? undefined : records.get(at.r.parent)) {
      if (i >= at.r.numClusters) break;
      const pc = at.map[i] as number;
      if (pc >= 0) return at.written.has(i) ? pc : undefined;
    }
    return undefined;
  };
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

function decodeSet(runs: readonly (readonly [number, number, number])[]): number[] {
  const out: number[] = [];
  for (const [s, c] of runs) for (let k = 0; k < c; k++) out.push(s + k);
  return out;
}
