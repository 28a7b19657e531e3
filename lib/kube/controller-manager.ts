// The start/stop/ready scaffolding every binary's controllers share, after controller-runtime's
// Manager: controllers register against one CacheSet; start() syncs every cache, then runs every
// controller's workers; stop() ends the workers, then the caches; ready means all caches synced.
import type { Clock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { Registry } from "../metrics.ts";
import type { CacheSet } from "./cache-set.ts";
import type { WorkQueue } from "./queue.ts";
import { type Controller, type Reconcile, runController } from "./runner.ts";

/** One controller as the manager runs it. Its cache handlers fill `queue`; the manager drains it. */
export interface ManagedController {
  /** The `controller` label and log field; unique within a manager. */
  name: string;
  /** Owned by the manager from add() on: stop() shuts it down. */
  queue: WorkQueue;
  /** Concurrent reconciles, an integer >= 1. */
  workers: number;
  reconcile: Reconcile;
  /** Runs once every cache has its first list, before the first reconcile. Must not throw. */
  onSynced?(): void;
  /** Runs at the start of stop(), before the workers are stopped. Must not throw. */
  onStop?(): void;
}

export interface ControllerManagerOptions {
  caches: CacheSet;
  logger: Logger;
  clock: Clock;
  /** Reconcile and queue metrics of every controller (see runner.ts). */
  registry?: Registry;
}

/**
 * Controllers are added before start(); start() may be called once. A controller's queue fills
 * from cache events as soon as the caches list, but nothing is reconciled until every cache of
 * the process has synced, so a reconcile never reads a cache that is still empty.
 */
export class ControllerManager {
  readonly caches: CacheSet;
  private readonly specs: ManagedController[] = [];
  private readonly running: Controller[] = [];
  private state: "new" | "starting" | "running" | "stopped" = "new";
  private stopping: Promise<void> | undefined;

  constructor(private readonly opts: ControllerManagerOptions) {
    this.caches = opts.caches;
  }

  /** Registers a controller. Throws StorageError("invalid") after start() or for a duplicate name. */
  add(c: ManagedController): void {
    if (this.state !== "new") throw new StorageError("invalid", `controller ${c.name} added after start`);
    if (this.specs.some((s) => s.name === c.name))
      throw new StorageError("invalid", `controller ${c.name} added twice`);
    this.specs.push(c);
  }

  /**
   * Syncs every cache, then starts every controller's workers; resolves once they run. An abort of
   * `signal` while the caches sync rejects with its reason and stops everything. A stop() during
   * the sync makes start() resolve without starting any worker.
   */
  async start(signal?: AbortSignal): Promise<void> {
    if (this.state !== "new") throw new StorageError("invalid", "controller manager started twice");
    this.state = "starting";
    try {
      await this.opts.caches.start(signal);
    } catch (err) {
      await this.stop();
      throw err;
    }
    if (this.state !== "starting") return;
    for (const c of this.specs) c.onSynced?.();
    for (const c of this.specs) {
      this.running.push(
        runController({
          name: c.name,
          queue: c.queue,
          workers: c.workers,
          reconcile: c.reconcile,
          logger: this.opts.logger,
          registry: this.opts.registry,
          clock: this.opts.clock,
        }),
      );
    }
    this.state = "running";
  }

  /** True while the controllers run on synced caches. */
  get ready(): boolean {
    return this.state === "running" && this.opts.caches.synced;
  }

  /**
   * Stops every controller (in-flight reconciles settle first), then every cache. Idempotent;
   * callable before start() (queues are shut down, caches never started are left alone).
   */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.state = "stopped";
      for (const c of this.specs) c.onStop?.();
      for (const c of this.specs) c.queue.shutDown();
      await Promise.all(this.running.map((r) => r.stop()));
      await this.opts.caches.stop();
    })();
    return this.stopping;
  }
}
