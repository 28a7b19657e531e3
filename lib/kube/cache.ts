// A list+watch cache of one kind: lists, then watches from the list's resourceVersion with
// bookmarks; re-watches when the server ends a watch; relists on 410 Gone; resyncs periodically.
// Objects are parsed with the kind's schema, stored without managedFields, and through the
// caller's transform, so a process keeps only the fields it reads.
import { errorMessage } from "../errors.ts";
import type { Logger } from "../log.ts";
import { type KubeObject, objectKey, type ResourceClient } from "./resource.ts";

export interface CacheHandlers<T> {
  add?(obj: T): void;
  update?(oldObj: T, newObj: T): void;
  delete?(obj: T): void;
  /** Called for every cached object each resync period; controllers usually enqueue the key. */
  resync?(obj: T): void;
}

export interface WatchCacheOptions<T extends KubeObject = KubeObject> {
  /** Watch one namespace; all namespaces when omitted. */
  namespace?: string;
  labelSelector?: string;
  /** Server-side filter on selectable fields, e.g. "spec.nodeName=node-a". */
  fieldSelector?: string;
  /** Period of resync callbacks; 0 disables them. */
  resyncMs?: number;
  /** Upper bound the server may keep one watch open, in seconds (randomised below it). */
  watchTimeoutSeconds?: number;
  /** First and maximum delay between failed list/watch attempts. */
  backoffMs?: { initial: number; max: number };
  /**
   * Applied to every object after the schema parse, before it is stored or handed to handlers
   * (deleted objects included). It may drop fields the process never reads, to bound memory; it
   * must keep metadata.name, namespace, uid and resourceVersion, and must not throw (an object it
   * throws on is rejected like a schema failure). Whoever writes an object back from the cache
   * (a whole-object replace) must not have its fields dropped here.
   */
  transform?(obj: T): T;
  logger: Logger;
}

export interface CacheStats {
  lists: number;
  watches: number;
  /** Watches the server refused or ended with 410 Gone, each followed by a relist. */
  expired: number;
  /** Objects the schema rejected (kept out of the cache, logged). */
  rejected: number;
}

type WatchEvent = {
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";
  object: Record<string, unknown>;
};

class Gone extends Error {}

/**
 * The cache is read-only for callers: get() and list() return the stored objects, which must not
 * be mutated. Handlers run synchronously in event order and must not throw (a throw is logged).
 */
export class WatchCache<T extends KubeObject> {
  private readonly store = new Map<string, T>();
  private readonly handlers: CacheHandlers<T>[] = [];
  private resourceVersion = "";
  private synced = false;
  private syncedWaiters: (() => void)[] = [];
  private stopped = false;
  /** Aborts whatever request is in flight (list or watch) when the cache stops. */
  private readonly stopCtl = new AbortController();
  private watchAbort: AbortController | undefined;
  private resyncTimer: ReturnType<typeof setInterval> | undefined;
  private loop: Promise<void> | undefined;
  private nextWatchFrom: string | undefined;
  readonly stats: CacheStats = { lists: 0, watches: 0, expired: 0, rejected: 0 };

  constructor(
    private readonly client: ResourceClient<T>,
    private readonly opts: WatchCacheOptions<T>,
  ) {}

  /** The kind this cache holds. */
  get kind(): ResourceClient<T>["kind"] {
    return this.client.kind;
  }

  /** Where and what it watches (namespace, selectors), as given. */
  get scope(): { namespace?: string; labelSelector?: string; fieldSelector?: string } {
    const { namespace, labelSelector, fieldSelector } = this.opts;
    return { namespace, labelSelector, fieldSelector };
  }

  on(handlers: CacheHandlers<T>): this {
    this.handlers.push(handlers);
    return this;
  }

  /**
   * Calls `fn` on every add, update and delete with the object as it now is (the new state of an
   * update, the last known state of a delete): what a controller needs to queue a key.
   */
  onChange(fn: (obj: T) => void): this {
    return this.on({ add: fn, update: (_old, obj) => fn(obj), delete: fn });
  }

  get hasSynced(): boolean {
    return this.synced;
  }

  get(key: string): T | undefined {
    return this.store.get(key);
  }

  list(): T[] {
    return [...this.store.values()];
  }

  keys(): string[] {
    return [...this.store.keys()];
  }

  /** Starts the list/watch loop; resolves once the first list is in the cache. */
  async start(): Promise<void> {
    if (this.loop) return this.waitForSync();
    this.loop = this.run();
    const resync = this.opts.resyncMs ?? 0;
    if (resync > 0) {
      this.resyncTimer = setInterval(() => {
        for (const obj of this.store.values()) this.emit("resync", obj);
      }, resync);
    }
    return this.waitForSync();
  }

  waitForSync(): Promise<void> {
    if (this.synced) return Promise.resolve();
    return new Promise((resolve) => this.syncedWaiters.push(resolve));
  }

  /** Stops watching; the cache keeps its last contents. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.resyncTimer) clearInterval(this.resyncTimer);
    this.stopCtl.abort();
    this.watchAbort?.abort();
    await this.loop?.catch(() => {});
  }

  /**
   * Ends the current watch and resumes from `resourceVersion` (default: the last one seen). A
   * version the server has already compacted makes it answer 410 Gone, which proves and exercises
   * the relist path; operators can also use it to force a fresh watch.
   */
  restartWatch(resourceVersion?: string): void {
    this.nextWatchFrom = resourceVersion;
    this.watchAbort?.abort();
  }

  private emit(what: "add" | "delete" | "resync", obj: T): void;
  private emit(what: "update", obj: T, oldObj: T): void;
  private emit(what: keyof CacheHandlers<T>, obj: T, oldObj?: T): void {
    for (const h of this.handlers) {
      try {
        if (what === "update") h.update?.(oldObj as T, obj);
        else h[what]?.(obj);
      } catch (err) {
        this.opts.logger.error("cache handler threw", {
          kind: this.client.kind.kind,
          err: errorMessage(err),
        });
      }
    }
  }

  private parse(raw: unknown): T | undefined {
    try {
      const obj = this.client.parse(raw);
      return this.opts.transform ? this.opts.transform(obj) : obj;
    } catch (err) {
      this.stats.rejected++;
      this.opts.logger.error("object rejected by schema", {
        kind: this.client.kind.kind,
        err: errorMessage(err),
      });
      return undefined;
    }
  }

  private async relist(): Promise<void> {
    const path = this.client.collectionPath(this.opts.namespace);
    const q = new URLSearchParams();
    if (this.opts.labelSelector) q.set("labelSelector", this.opts.labelSelector);
    if (this.opts.fieldSelector) q.set("fieldSelector", this.opts.fieldSelector);
    const res = await this.client.conn.request(`${path}?${q}`, { signal: this.stopCtl.signal });
    if (!res.ok) throw new Error(`list ${path}: HTTP ${res.status} ${(await res.text()).slice(0, 300)}`);
    const body = (await res.json()) as { items: unknown[]; metadata: { resourceVersion: string } };
    this.stats.lists++;
    const seen = new Set<string>();
    for (const raw of body.items) {
      const obj = this.parse(raw);
      if (!obj) continue;
      const key = objectKey(obj.metadata);
      seen.add(key);
      const old = this.store.get(key);
      this.store.set(key, obj);
      if (!old) this.emit("add", obj);
      else if (old.metadata.resourceVersion !== obj.metadata.resourceVersion) this.emit("update", obj, old);
    }
    // Objects deleted while no watch was open surface as deletes, exactly once.
    for (const [key, old] of this.store) {
      if (!seen.has(key)) {
        this.store.delete(key);
        this.emit("delete", old);
      }
    }
    this.resourceVersion = body.metadata.resourceVersion;
    if (!this.synced) {
      this.synced = true;
      for (const w of this.syncedWaiters.splice(0)) w();
    }
  }

  private apply(ev: WatchEvent): void {
    const rv = (ev.object.metadata as { resourceVersion?: string } | undefined)?.resourceVersion;
    if (ev.type === "BOOKMARK") {
      if (rv) this.resourceVersion = rv;
      return;
    }
    if (ev.type === "ERROR") {
      const status = ev.object as { code?: number; message?: string };
      if (status.code === 410) throw new Gone(status.message ?? "resource version expired");
      throw new Error(`watch error ${status.code}: ${status.message}`);
    }
    const obj = this.parse(ev.object);
    if (rv) this.resourceVersion = rv;
    if (!obj) return;
    const key = objectKey(obj.metadata);
    const old = this.store.get(key);
    if (ev.type === "DELETED") {
      this.store.delete(key);
      this.emit("delete", obj);
    } else {
      this.store.set(key, obj);
      if (old) this.emit("update", obj, old);
      else this.emit("add", obj);
    }
  }

  /** One watch from the current resourceVersion; returns when the server ends it normally. */
  private async watchOnce(): Promise<void> {
    const from = this.nextWatchFrom ?? this.resourceVersion;
    this.nextWatchFrom = undefined;
    const max = this.opts.watchTimeoutSeconds ?? 600;
    const q = new URLSearchParams({
      watch: "1",
      resourceVersion: from,
      allowWatchBookmarks: "true",
      // Spread reconnects of many clients, as client-go does.
      timeoutSeconds: String(Math.floor(max / 2 + Math.random() * (max / 2))),
    });
    if (this.opts.labelSelector) q.set("labelSelector", this.opts.labelSelector);
    if (this.opts.fieldSelector) q.set("fieldSelector", this.opts.fieldSelector);
    const abort = new AbortController();
    this.watchAbort = abort;
    if (this.stopped) return;
    const onStop = () => abort.abort();
    this.stopCtl.signal.addEventListener("abort", onStop, { once: true });
    const res = await this.client.conn.request(`${this.client.collectionPath(this.opts.namespace)}?${q}`, {
      signal: abort.signal,
    });
    this.stats.watches++;
    if (res.status === 410) throw new Gone(await res.text());
    if (!res.ok || !res.body)
      throw new Error(`watch: HTTP ${res.status} ${(await res.text()).slice(0, 300)}`);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl = buf.indexOf("\n");
        while (nl >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) this.apply(JSON.parse(line) as WatchEvent);
          nl = buf.indexOf("\n");
        }
      }
    } catch (err) {
      if (abort.signal.aborted) return; // restartWatch() or stop()
      throw err;
    } finally {
      this.stopCtl.signal.removeEventListener("abort", onStop);
      reader.releaseLock();
    }
  }

  private async run(): Promise<void> {
    const backoff = this.opts.backoffMs ?? { initial: 200, max: 30_000 };
    let delay = backoff.initial;
    let needList = true;
    while (!this.stopped) {
      try {
        if (needList) {
          await this.relist();
          needList = false;
        }
        await this.watchOnce();
        delay = backoff.initial;
      } catch (err) {
        if (this.stopped) break;
        if (err instanceof Gone) {
          this.stats.expired++;
          this.opts.logger.info("watch expired, relisting", {
            kind: this.client.kind.kind,
            err: err.message,
          });
          needList = true;
          continue;
        }
        if ((err as Error)?.name === "AbortError") continue;
        this.opts.logger.warn("list/watch failed, retrying", {
          kind: this.client.kind.kind,
          err: errorMessage(err),
          retryInMs: delay,
        });
        await Bun.sleep(delay);
        delay = Math.min(delay * 2, backoff.max);
      }
    }
  }
}
