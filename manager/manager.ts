// Assembles the manager's four controllers (claims, placement, capacity, storage nodes) over one
// set of watch caches and one inventory, and runs them until stopped. main.ts calls it while this
// process leads; integration tests call it directly.
import type { NVMeDevice, NVMeDeviceClaim, NVMePartition, RDMAStorageNode } from "../api/index.ts";
import { kinds } from "../api/index.ts";
import type { Clock } from "../lib/clock.ts";
import { StorageError } from "../lib/errors.ts";
import { type CacheHandlers, WatchCache } from "../lib/kube/cache.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { WorkQueue } from "../lib/kube/queue.ts";
import { type KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import { type Controller, type Reconcile, runController } from "../lib/kube/runner.ts";
import type { Logger } from "../lib/log.ts";
import type { Registry } from "../lib/metrics.ts";
import { CAPACITY, capacityReconciler, capacityTriggers } from "./capacity/capacity-controller.ts";
import { CLAIMS, claimReconciler, claimTriggers } from "./claims/claim-controller.ts";
import type { ManagerConfig } from "./config.ts";
import type { Clients, ManagerContext, Triggers } from "./context.ts";
import { KeyedMutex } from "./device-locks.ts";
import { EventPort, type EventSink } from "./events.ts";
import { Inventory } from "./inventory.ts";
import { managerMetrics } from "./metrics.ts";
import {
  PLACEMENT,
  PlacementState,
  placementReconciler,
  placementTriggers,
} from "./placement/placement-controller.ts";
import { nodeReconciler, nodeTriggers, STORAGE_NODES } from "./storage-nodes/node-controller.ts";

export interface StartOptions {
  conn: KubeConnection;
  config: ManagerConfig;
  clock: Clock;
  logger: Logger;
  registry: Registry;
  events: EventSink;
  /** Aborting it while the caches sync abandons the start (rejects with the signal's reason). */
  signal?: AbortSignal;
}

export interface RunningManager {
  readonly inventory: Inventory;
  /** Every controller's queue, by controller name (for tests and diagnostics). */
  readonly queues: ReadonlyMap<string, WorkQueue>;
  /** Stops the controllers (waiting for in-flight reconciles), the caches, and pending Events. Idempotent. */
  stop(): Promise<void>;
}

interface Spec {
  name: string;
  workers: number;
  reconcile: Reconcile;
  triggers: Triggers;
}

/**
 * Lists and watches the four kinds (devices cluster-wide, claims and partitions in every
 * namespace, storage nodes in config.namespace; all narrowed by config.labelSelector), waits
 * until every cache holds its first list, then starts the controllers. Resolves once they run.
 */
export async function startManager(opts: StartOptions): Promise<RunningManager> {
  const { conn, config, clock, registry } = opts;
  const log = opts.logger;
  const clients: Clients = {
    devices: new ResourceClient(conn, kinds.NVMeDevice),
    claims: new ResourceClient(conn, kinds.NVMeDeviceClaim),
    partitions: new ResourceClient(conn, kinds.NVMePartition),
    snapshots: new ResourceClient(conn, kinds.NVMeSnapshot),
    nodes: new ResourceClient(conn, kinds.RDMAStorageNode),
  };
  const inventory = new Inventory();
  const metrics = managerMetrics(registry);
  const events = new EventPort(opts.events, log);
  const ctx: ManagerContext = {
    clients,
    inventory,
    deviceLocks: new KeyedMutex(),
    events,
    clock,
    log,
    metrics,
    config,
  };
  const placement = new PlacementState();
  const specs: Spec[] = [
    { name: CLAIMS, workers: config.workers, reconcile: claimReconciler(ctx), triggers: claimTriggers(ctx) },
    {
      name: PLACEMENT,
      workers: config.placementWorkers,
      reconcile: placementReconciler(ctx, placement),
      triggers: placementTriggers(ctx, placement),
    },
    {
      name: CAPACITY,
      workers: config.workers,
      reconcile: capacityReconciler(ctx),
      triggers: capacityTriggers(ctx),
    },
    {
      name: STORAGE_NODES,
      workers: config.workers,
      reconcile: nodeReconciler(ctx),
      triggers: nodeTriggers(),
    },
  ];
  const queues = new Map(specs.map((s) => [s.name, new WorkQueue({ name: s.name, clock })]));

  const common = { labelSelector: config.labelSelector, resyncMs: config.resyncMs, logger: log };
  const caches = {
    devices: new WatchCache(clients.devices, common),
    claims: new WatchCache(clients.claims, common),
    partitions: new WatchCache(clients.partitions, common),
    nodes: new WatchCache(clients.nodes, { ...common, namespace: config.namespace }),
  };

  /** Inventory first (triggers read it), then every controller's mapping of the change to keys. */
  function wire<T extends KubeObject>(
    cache: WatchCache<T>,
    set: (o: T) => void,
    del: (o: T) => void,
    pick: (t: Triggers) => ((old: T | undefined, obj: T) => Iterable<string>) | undefined,
    after?: () => void,
  ): void {
    const fire = (old: T | undefined, obj: T) => {
      for (const s of specs) {
        const map = pick(s.triggers);
        if (!map) continue;
        const q = queues.get(s.name) as WorkQueue;
        for (const key of map(old, obj)) q.add(key);
      }
      after?.();
    };
    const handlers: CacheHandlers<T> = {
      add: (o) => {
        set(o);
        fire(undefined, o);
      },
      update: (old, o) => {
        set(o);
        fire(old, o);
      },
      delete: (o) => {
        del(o);
        fire(o, o);
      },
      resync: (o) => fire(o, o),
    };
    cache.on(handlers);
  }
  wire<NVMeDevice>(
    caches.devices,
    (o) => inventory.setDevice(o),
    (o) => inventory.deleteDevice(o),
    (t) => t.device,
  );
  wire<NVMeDeviceClaim>(
    caches.claims,
    (o) => inventory.setClaim(o),
    (o) => inventory.deleteClaim(o),
    (t) => t.claim,
  );
  wire<RDMAStorageNode>(
    caches.nodes,
    (o) => inventory.setNode(o),
    (o) => inventory.deleteNode(o),
    (t) => t.node,
  );
  wire<NVMePartition>(
    caches.partitions,
    (o) => inventory.setPartition(o),
    (o) => inventory.deletePartition(o),
    (t) => t.partition,
    () => metrics.pendingPartitions.set({}, inventory.pendingCount),
  );

  const all = Object.values(caches) as WatchCache<KubeObject>[];
  const stopCaches = () => Promise.all(all.map((c) => stopCache(c, clock)));
  const started = Promise.all(all.map((c) => c.start()));
  if (opts.signal) {
    const signal = opts.signal;
    const aborted = new Promise<never>((_, reject) => {
      const fail = () => reject(signal.reason ?? new StorageError("unavailable", "manager start aborted"));
      if (signal.aborted) fail();
      else signal.addEventListener("abort", fail, { once: true });
    });
    try {
      await Promise.race([started, aborted]);
    } catch (err) {
      for (const q of queues.values()) q.shutDown();
      await stopCaches();
      throw err;
    }
  } else {
    await started;
  }
  log.info("caches synced", {
    devices: inventory.deviceCount(),
    partitions: caches.partitions.keys().length,
    pending: inventory.pendingCount,
  });

  const controllers: Controller[] = specs.map((s) =>
    runController({
      name: s.name,
      queue: queues.get(s.name) as WorkQueue,
      workers: s.workers,
      reconcile: s.reconcile,
      logger: log,
      registry,
      clock,
    }),
  );
  let stopping: Promise<void> | undefined;
  return {
    inventory,
    queues,
    stop() {
      stopping ??= (async () => {
        await Promise.all(controllers.map((c) => c.stop()));
        await stopCaches();
        placement.digest?.flush();
        await events.drain();
      })();
      return stopping;
    },
  };
}

/**
 * Stops a watch cache for sure. WatchCache.stop() aborts the watch open at the time of the call,
 * but a stop during a (re)list lets the loop open one more watch afterwards, which would then run
 * until the server ends it (minutes) and hold up leadership handover. Aborting whatever watch is
 * current until the loop has exited closes that window.
 */
async function stopCache(cache: WatchCache<KubeObject>, clock: Clock): Promise<void> {
  let stopped = false;
  const done = cache.stop().then(() => {
    stopped = true;
  });
  while (!stopped) {
    cache.restartWatch();
    await Promise.race([done, clock.sleep(50)]);
  }
}
