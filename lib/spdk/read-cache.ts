// A read-through cache in front of an SpdkRpc for the two reads every export's pass makes (one
// subsystem by NQN, one bdev by name or alias), filled by a node-wide listing (two RPCs for every
// export) or by the reads themselves, and invalidated by every mutation sent through it.
import { type Clock, realClock } from "../clock.ts";
import type { CallOptions, SpdkRpc } from "./client.ts";
import { SpdkError } from "./errors.ts";

export interface ReadCacheOptions {
  rpc: SpdkRpc;
  clock?: Clock;
  /**
   * Longest a read is served again (default 15000). It bounds how late a change nobody made
   * through this cache (an operator's RPC by hand) is noticed, on top of the verify period.
   */
  ttlMs?: number;
}

/** Methods that change nothing a cached read reports. Any other method invalidates. */
const READ_ONLY = new Set([
  "nvmf_get_subsystems",
  "bdev_get_bdevs",
  "nvmf_get_transports",
  "nvmf_subsystem_get_listeners",
  "nvmf_subsystem_get_controllers",
  "nvmf_subsystem_get_qpairs",
  "nvmf_get_stats",
  "bdev_get_iostat",
  "bdev_nvme_get_controllers",
  "bdev_lvol_get_lvstores",
  "bdev_lvol_get_lvols",
  "bdev_raid_get_bdevs",
  "keyring_get_keys",
  "framework_get_reactors",
  "spdk_get_version",
  "rpc_get_methods",
  "thread_get_stats",
  "bdev_nvme_get_transport_statistics",
  // Waits for examine to finish: bdevs may appear (lvols), none changes, and only bdevs found are
  // ever kept, so what is kept stays true.
  "bdev_wait_for_examine",
]);
/** Mutations that touch one subsystem (params.nqn) and no bdev. */
const SUBSYSTEM_ONLY = /^nvmf_(create_subsystem|delete_subsystem|subsystem_)/;
/** Mutations that touch no subsystem record (keys, transports). */
const NEITHER = /^(keyring_|nvmf_create_transport$|nvmf_set_)/;

interface Entry {
  /** The raw record, or null: the target said it does not exist. */
  value: unknown;
  /** Invalidation counter when the read was sent. */
  sent: number;
  at: number;
  generation: number;
}

interface Listing {
  byKey: Map<string, unknown>;
  sent: number;
  at: number;
  generation: number;
}

/**
 * An SpdkRpc that serves `nvmf_get_subsystems {nqn}` and `bdev_get_bdevs {name}` from what it
 * last read, as the target would have answered them at that read.
 *
 * Coherence: a result is served only while the connection it was read over is still the
 * established one (a restarted target is a new connection), for at most ttlMs, and only when no
 * mutation of the same record was sent through this cache from before that read was sent until
 * after it was answered (a mutation invalidates when it is sent and again when it completes, so
 * a read overlapping it is never kept). A subsystem mutation invalidates that NQN (all NQNs when
 * it names none); a bdev mutation, or any method not known to be read-only, invalidates every
 * bdev (and every subsystem when it is not known to spare them). A listing (load()) answers
 * "no such subsystem" for an NQN it lacks; for bdevs only hits are ever kept (a bdev may appear
 * without a call through here, e.g. lvols once examine has run, and a wrong "absent" would create).
 * Errors, unlisted methods and calls with other parameters pass straight through.
 */
export class SpdkReadCache implements SpdkRpc {
  readonly #rpc: SpdkRpc;
  readonly #clock: Clock;
  readonly #ttlMs: number;
  #seq = 0;
  readonly #dirtySub = new Map<string, number>();
  #allSubsDirty = 0;
  #allBdevsDirty = 0;
  readonly #subs = new Map<string, Entry>();
  readonly #bdevs = new Map<string, Entry>();
  #subList: Listing | undefined;
  #bdevList: Listing | undefined;
  /** Served from the cache / sent through, per method, for metrics and benches. */
  readonly stats = { hits: 0, misses: 0, loads: 0 };

  constructor(opts: ReadCacheOptions) {
    this.#rpc = opts.rpc;
    this.#clock = opts.clock ?? realClock;
    this.#ttlMs = opts.ttlMs ?? 15_000;
  }

  get connectionGeneration(): number | undefined {
    return this.#rpc.connectionGeneration;
  }

  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.#rpc.serialize(key, fn);
  }

  /** Drops everything read so far (e.g. on a target restart). */
  forget(): void {
    this.#subs.clear();
    this.#bdevs.clear();
    this.#subList = undefined;
    this.#bdevList = undefined;
  }

  /**
   * Reads every subsystem and every bdev at once (two calls in flight together) and keeps them as
   * the answer to the per-record reads that follow. Rejects with the calls' errors (nothing kept).
   */
  async load(opts?: CallOptions): Promise<void> {
    // A listing describes one incarnation only when it is read over one known connection: before
    // the first call of this process there is none yet, so establish it first.
    if (this.#rpc.connectionGeneration === undefined)
      await this.#rpc.call("spdk_get_version", undefined, opts);
    const sent = ++this.#seq;
    const generation = this.#rpc.connectionGeneration;
    const at = this.#clock.now();
    const [subs, bdevs] = await Promise.all([
      this.#rpc.call("nvmf_get_subsystems", undefined, opts),
      this.#rpc.call("bdev_get_bdevs", undefined, opts),
    ]);
    this.stats.loads++;
    if (generation === undefined || generation !== this.#rpc.connectionGeneration) return;
    if (Array.isArray(subs)) {
      const byKey = new Map<string, unknown>();
      for (const s of subs) if (typeof s?.nqn === "string") byKey.set(s.nqn, s);
      this.#subList = { byKey, sent, at, generation };
    }
    if (Array.isArray(bdevs)) {
      const byKey = new Map<string, unknown>();
      for (const b of bdevs) for (const k of bdevKeys(b)) byKey.set(k, b);
      this.#bdevList = { byKey, sent, at, generation };
    }
  }

  async call(method: string, params?: object, opts?: CallOptions): Promise<unknown> {
    const p = params as Record<string, unknown> | undefined;
    const keys = p ? Object.keys(p).filter((k) => p[k] !== undefined) : [];
    if (method === "nvmf_get_subsystems" && keys.length === 1 && typeof p?.nqn === "string")
      return this.#readSubsystem(p.nqn, params as object, opts);
    if (method === "bdev_get_bdevs" && keys.length === 1 && typeof p?.name === "string")
      return this.#readBdev(p.name, params as object, opts);
    if (READ_ONLY.has(method)) return this.#rpc.call(method, params, opts);
    const nqn = typeof p?.nqn === "string" ? p.nqn : undefined;
    this.#invalidate(method, nqn);
    try {
      return await this.#rpc.call(method, params, opts);
    } finally {
      this.#invalidate(method, nqn);
    }
  }

  #invalidate(method: string, nqn: string | undefined): void {
    const seq = ++this.#seq;
    if (NEITHER.test(method)) return;
    if (SUBSYSTEM_ONLY.test(method)) {
      if (nqn === undefined) this.#allSubsDirty = seq;
      else {
        this.#dirtySub.set(nqn, seq);
        this.#subs.delete(nqn);
      }
      return;
    }
    this.#allBdevsDirty = seq;
    this.#bdevs.clear();
    if (!method.startsWith("bdev_")) {
      this.#allSubsDirty = seq;
      this.#subs.clear();
    }
  }

  #fresh(x: { sent: number; at: number; generation: number }, dirty: number): boolean {
    return (
      x.generation === this.#rpc.connectionGeneration &&
      this.#clock.now() - x.at < this.#ttlMs &&
      dirty <= x.sent
    );
  }

  async #readSubsystem(nqn: string, params: object, opts?: CallOptions): Promise<unknown> {
    const dirty = Math.max(this.#allSubsDirty, this.#dirtySub.get(nqn) ?? 0);
    const e = this.#subs.get(nqn);
    if (e && this.#fresh(e, dirty)) return this.#answer("nvmf_get_subsystems", params, e.value);
    const l = this.#subList;
    if (l && this.#fresh(l, dirty))
      return this.#answer("nvmf_get_subsystems", params, l.byKey.get(nqn) ?? null);
    return this.#readThrough("nvmf_get_subsystems", params, opts, (value, entry) => {
      if (Math.max(this.#allSubsDirty, this.#dirtySub.get(nqn) ?? 0) <= entry.sent)
        this.#subs.set(nqn, { ...entry, value });
    });
  }

  async #readBdev(name: string, params: object, opts?: CallOptions): Promise<unknown> {
    const dirty = this.#allBdevsDirty;
    const e = this.#bdevs.get(name);
    if (e && this.#fresh(e, dirty)) return this.#answer("bdev_get_bdevs", params, e.value);
    const l = this.#bdevList;
    const listed = l?.byKey.get(name);
    if (l && listed !== undefined && this.#fresh(l, dirty))
      return this.#answer("bdev_get_bdevs", params, listed);
    return this.#readThrough("bdev_get_bdevs", params, opts, (value, entry) => {
      if (value === null || this.#allBdevsDirty > entry.sent) return;
      // Under its name and every alias: an export's pass reads an lvol by alias, its QoS by name.
      for (const k of [name, ...bdevKeys(value)]) this.#bdevs.set(k, { ...entry, value });
    });
  }

  /** The target's reply to a per-record read of `value` (a one-element list, or -19). */
  #answer(method: string, params: object, value: unknown): unknown {
    this.stats.hits++;
    if (value === null) throw new SpdkError(method, -19, "No such device", { params });
    return [structuredClone(value)];
  }

  async #readThrough(
    method: string,
    params: object,
    opts: CallOptions | undefined,
    keep: (value: unknown, entry: Omit<Entry, "value">) => void,
  ): Promise<unknown> {
    this.stats.misses++;
    const entry = { sent: ++this.#seq, at: this.#clock.now(), generation: this.#rpc.connectionGeneration };
    const kept = (value: unknown) => {
      if (entry.generation !== undefined && entry.generation === this.#rpc.connectionGeneration)
        keep(value, entry as Omit<Entry, "value">);
    };
    try {
      const r = await this.#rpc.call(method, params, opts);
      if (Array.isArray(r) && r.length === 1) kept(structuredClone(r[0]));
      return r;
    } catch (err) {
      if (err instanceof SpdkError && err.code === -19) kept(null);
      throw err;
    }
  }
}

function bdevKeys(b: unknown): string[] {
  const o = b as { name?: unknown; aliases?: unknown };
  const out: string[] = [];
  if (typeof o?.name === "string") out.push(o.name);
  if (Array.isArray(o?.aliases)) for (const a of o.aliases) if (typeof a === "string") out.push(a);
  return out;
}
