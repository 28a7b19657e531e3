// The watch caches of one process: one WatchCache per kind, handed to every controller that asks
// for that kind, all with the process's object transform; started, synced and stopped together.
import { realClock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { WatchCache } from "./cache.ts";
import type { KubeConnection } from "./connection.ts";
import { type KubeObject, ResourceClient, type ResourceKind } from "./resource.ts";

/** Where a kind is watched: one namespace (all when omitted) and server-side selectors. */
export interface CacheScope {
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
}

/**
 * Shrinks an object of `kind` before it is stored (after the schema parse and the managedFields
 * strip). Same contract as WatchCacheOptions.transform; returning the object unchanged is fine.
 */
export type ObjectTransform = (kind: ResourceKind, obj: KubeObject) => KubeObject;

export interface CacheSetOptions {
  logger: Logger;
  /** Resync period of every cache (0 or omitted: none). */
  resyncMs?: number;
  transform?: ObjectTransform;
}

function kindId(kind: ResourceKind): string {
  return `${kind.plural}.${kind.group}`;
}

function sameScope(a: CacheScope, b: CacheScope): boolean {
  return (
    (a.namespace ?? "") === (b.namespace ?? "") &&
    (a.labelSelector ?? "") === (b.labelSelector ?? "") &&
    (a.fieldSelector ?? "") === (b.fieldSelector ?? "")
  );
}

function describe(s: CacheScope): string {
  const parts = [
    s.namespace ? `namespace ${s.namespace}` : "all namespaces",
    ...(s.labelSelector ? [`labels ${s.labelSelector}`] : []),
    ...(s.fieldSelector ? [`fields ${s.fieldSelector}`] : []),
  ];
  return parts.join(", ");
}

/**
 * controller-runtime's shared informer cache, reduced to what DISTORT needs. cache(kind, scope)
 * returns the one cache of that kind, creating it on first request; a request for a kind already
 * cached under another scope throws StorageError("invalid"), since two scopes would mean two
 * watches. Caches are created before start(); asking after start() throws as well, so no
 * controller can read a cache that was never synced.
 */
export class CacheSet {
  private readonly caches = new Map<string, WatchCache<KubeObject>>();
  private started = false;
  private stopping: Promise<void> | undefined;

  constructor(
    private readonly conn: KubeConnection,
    private readonly opts: CacheSetOptions,
  ) {}

  /** The process's cache of `kind`, watched with `scope` (see the class contract). */
  cache<T extends KubeObject>(kind: ResourceKind<T>, scope: CacheScope = {}): WatchCache<T> {
    const id = kindId(kind);
    const have = this.caches.get(id);
    if (have) {
      if (!sameScope(have.scope, scope)) {
        throw new StorageError(
          "invalid",
          `${kind.kind} is already cached for ${describe(have.scope)}; a second cache for ${describe(scope)} would be a second watch`,
        );
      }
      return have as unknown as WatchCache<T>;
    }
    if (this.started) {
      throw new StorageError("invalid", `${kind.kind} cache requested after the caches started`);
    }
    const t = this.opts.transform;
    const cache = new WatchCache<T>(new ResourceClient(this.conn, kind), {
      ...scope,
      resyncMs: this.opts.resyncMs,
      logger: this.opts.logger,
      ...(t ? { transform: (o: T) => t(kind as ResourceKind, o) as T } : {}),
    });
    this.caches.set(id, cache as unknown as WatchCache<KubeObject>);
    return cache;
  }

  /** Every cache, in the order they were first requested. */
  all(): WatchCache<KubeObject>[] {
    return [...this.caches.values()];
  }

  /** True once every cache holds its first list. */
  get synced(): boolean {
    return this.all().every((c) => c.hasSynced);
  }

  /**
   * Starts every cache; resolves once all have listed. An abort of `signal` first rejects with its
   * reason (the caches keep running: stop() ends them). Calling it again waits for the same sync.
   */
  async start(signal?: AbortSignal): Promise<void> {
    this.started = true;
    const synced = Promise.all(this.all().map((c) => c.start())).then(() => {});
    if (!signal) return synced;
    return Promise.race([
      synced,
      new Promise<never>((_, reject) => {
        const fail = () => reject(signal.reason ?? new StorageError("unavailable", "cache start aborted"));
        if (signal.aborted) fail();
        else signal.addEventListener("abort", fail, { once: true });
      }),
    ]);
  }

  /**
   * Stops every cache for sure and resolves once their loops have exited; the contents stay
   * readable. A stop that lands while a cache (re)lists could let it open one more watch that
   * lives until the server ends it; the current watch is aborted until the loop is gone. Idempotent.
   */
  stop(): Promise<void> {
    this.started = true;
    this.stopping ??= Promise.all(
      this.all().map(async (cache) => {
        let stopped = false;
        const done = cache.stop().then(() => {
          stopped = true;
        });
        while (!stopped) {
          cache.restartWatch();
          // Real time on purpose: this waits for sockets to close, not for a logical deadline.
          await Promise.race([done, realClock.sleep(50)]);
        }
      }),
    ).then(() => {});
    return this.stopping;
  }
}
