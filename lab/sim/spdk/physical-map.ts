// Where the emulator keeps the bytes of each lvol of one store (its "home"), apart from the cluster
// accounting SPDK reports (blobstore.ts). Pure bookkeeping; lvol-store.ts moves the bytes.
//
// Every lvol holds all of its bytes itself, in one file extent (which lab-side tests read at rest
// through BdevHandle.fileExtent). A thick lvol lives in a run of base clusters (one extent of the drive file) when one fits;
// everything else, and a thick lvol no run fits, gets a sparse container of its own (a file under
// the emulator's data directory, or RAM on a RAM base). A snapshot gets its own container holding a
// copy of the origin's bytes at snapshot time, and the origin keeps its home: its later writes
// never reach the snapshot. A clone starts as a copy of
// its snapshot. SPDK's copy-on-write sharing is thus accounting only, never a byte dependency.
import type { Lvol } from "./blobstore.ts";

/** Base clusters start..start+count-1. */
export interface ClusterRun {
  readonly start: number;
  readonly count: number;
}

/**
 * Where an lvol's bytes are: a run of base clusters holding logical clusters 0..count-1 in order
 * (count is the lvol's size in clusters; 0 only keeps the place of a lvol shrunk to nothing), or
 * the lvol's own sparse container, as long as the lvol.
 */
export type Home = ({ readonly kind: "run" } & ClusterRun) | { readonly kind: "own" };

/** The byte work a resize leaves to the caller, before the metadata is persisted unless noted. */
export interface HomeResize {
  readonly before: Home;
  /** Equal to `before` (same object) unless the lvol moved: then its bytes are copied first. */
  readonly after: Home;
  /** Base clusters the lvol newly holds in a run, to be zeroed before anything is copied in. */
  readonly zero: ClusterRun | undefined;
  /** Base clusters given up (shrink, or the old run after a move): deallocate after persisting. */
  readonly released: ClusterRun | undefined;
}

const OWN: Home = { kind: "own" };

/**
 * The homes of one store's lvols and which base clusters runs occupy. Mutations validate first and
 * throw ErrnoError before changing anything. The metadata clusters are never handed out.
 */
export class PhysicalMap {
  readonly #used: Uint8Array;
  readonly #homes = new Map<Lvol, Home>();

  constructor(
    readonly totalClusters: number,
    readonly mdClusters: number,
  ) {
    this.#used = new Uint8Array(totalClusters);
    this.#used.fill(1, 0, mdClusters);
  }

  /** The home of `lvol`; throws when it has none (a bug: every stored lvol has one). */
  home(lvol: Lvol): Home {
    const h = this.#homes.get(lvol);
    if (h === undefined) throw new Error(`lvol ${lvol.name} has no home`);
    return h;
  }

  /** Base clusters no run occupies (for tests and diagnostics). */
  get freeBaseClusters(): number {
    let n = 0;
    for (const u of this.#used) if (u === 0) n++;
    return n;
  }

  /** The first (lowest) run of `n` > 0 free base clusters, or undefined when none fits. */
  findRun(n: number): number | undefined {
    let len = 0;
    for (let pc = this.mdClusters; pc < this.#used.length; pc++) {
      len = this.#used[pc] === 0 ? len + 1 : 0;
      if (len === n) return pc - n + 1;
    }
    return undefined;
  }

  /**
   * Homes a new lvol of `n` clusters: the first run that fits when `wantRun` (a thick lvol) and n > 0,
   * else its own container. The caller zeroes a run before use.
   */
  place(lvol: Lvol, n: number, wantRun: boolean): Home {
    const start = wantRun && n > 0 ? this.findRun(n) : undefined;
    if (start === undefined) return this.#set(lvol, OWN);
    this.#used.fill(1, start, start + n);
    return this.#set(lvol, { kind: "run", start, count: n });
  }

  /** Homes `lvol` at `home` as found in stored metadata; a run is marked used. */
  adopt(lvol: Lvol, home: Home): void {
    if (home.kind === "run") {
      if (home.start < this.mdClusters || home.start + home.count > this.totalClusters) {
        throw new Error(`lvol ${lvol.name}: run ${home.start}+${home.count} outside the data clusters`);
      }
      this.#used.fill(1, home.start, home.start + home.count);
    }
    this.#set(lvol, home);
  }

  /**
   * Follows a size change of `lvol` from `oldN` to `newN` clusters. An own container just changes
   * length. A run grows in place when the base clusters after it are free, else moves to the first
   * run that fits, else to an own container; it shrinks in place.
   */
  resize(lvol: Lvol, oldN: number, newN: number): HomeResize {
    const before = this.home(lvol);
    const same = { before, after: before, zero: undefined, released: undefined };
    if (newN === oldN) return same;
    if (before.kind === "own") return same;
    if (newN < oldN) {
      const released = { start: before.start + newN, count: oldN - newN };
      this.#used.fill(0, released.start, released.start + released.count);
      const after = this.#set(lvol, { kind: "run", start: before.start, count: newN });
      return { before, after, zero: undefined, released };
    }
    const end = before.start + oldN;
    if (this.#freeFrom(end, newN - oldN)) {
      this.#used.fill(1, end, before.start + newN);
      const after = this.#set(lvol, { kind: "run", start: before.start, count: newN });
      return { before, after, zero: { start: end, count: newN - oldN }, released: undefined };
    }
    // The new run is looked for while the old one is still held, so they never overlap and the
    // old bytes stay intact until the new home is persisted.
    const start = this.findRun(newN);
    const released = oldN > 0 ? { start: before.start, count: oldN } : undefined;
    this.#used.fill(0, before.start, before.start + oldN);
    if (start === undefined) return { before, after: this.#set(lvol, OWN), zero: undefined, released };
    this.#used.fill(1, start, start + newN);
    const after = this.#set(lvol, { kind: "run", start, count: newN });
    return { before, after, zero: { start, count: newN }, released };
  }

  /** Forgets `lvol`; returns its home, whose run (if any) is free again. */
  remove(lvol: Lvol): Home {
    const h = this.home(lvol);
    if (h.kind === "run") this.#used.fill(0, h.start, h.start + h.count);
    this.#homes.delete(lvol);
    return h;
  }

  /** A function that puts every home and the base allocation back as they are now. */
  checkpoint(): () => void {
    const used = this.#used.slice();
    const homes = new Map(this.#homes);
    return () => {
      this.#used.set(used);
      this.#homes.clear();
      for (const [l, h] of homes) this.#homes.set(l, h);
    };
  }

  #set(lvol: Lvol, home: Home): Home {
    this.#homes.set(lvol, home);
    return home;
  }

  /** True when the `n` clusters from `start` exist and no run holds them. */
  #freeFrom(start: number, n: number): boolean {
    if (start + n > this.#used.length) return false;
    for (let pc = start; pc < start + n; pc++) if (this.#used[pc] !== 0) return false;
    return true;
  }
}
