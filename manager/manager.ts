// Assembles the manager's controllers (claims, placement, capacity, replicas, rebuild grants,
// storage nodes) over one set of watch caches and one inventory, and runs them until stopped.
// main.ts calls it while this process leads; integration tests call it directly.
import type { NVMeDevice, NVMeDeviceClaim, NVMePartition, RDMAStorageNode } from "../api/index.ts";
import { HANDOVER_ANNOTATION, kinds } from "../api/index.ts";
import type { Clock } from "../lib/clock.ts";
import { KeyedMutex } from "../lib/concurrency/keyed-mutex.ts";
import type { CacheHandlers, WatchCache } from "../lib/kube/cache.ts";
import { CacheSet, type ObjectTransform } from "../lib/kube/cache-set.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { ControllerManager } from "../lib/kube/controller-manager.ts";
import { WorkQueue } from "../lib/kube/queue.ts";
import { type KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import type { Reconcile } from "../lib/kube/runner.ts";
import type { Logger } from "../lib/log.ts";
import type { Registry } from "../lib/metrics.ts";
import { CAPACITY, capacityReconciler, capacityTriggers } from "./capacity/capacity-controller.ts";
import { CLAIMS, claimReconciler, claimTriggers } from "./claims/claim-controller.ts";
import type { ManagerConfig } from "./config.ts";
import type { Clients, ManagerContext, Triggers } from "./context.ts";
import { DRAIN, drainReconciler, drainTriggers } from "./drain/drain-controller.ts";
import { EventPort, type EventSink } from "./events.ts";
import { Inventory } from "./inventory.ts";
import { LOST_NODES, lostNodeReconciler, lostNodeTriggers } from "./lost-nodes/lost-node-controller.ts";
import { managerMetrics } from "./metrics.ts";
import {
  PLACEMENT,
  PlacementState,
  placementReconciler,
  placementTriggers,
} from "./placement/placement-controller.ts";
import {
  REBUILD_GRANTS,
  RebuildGrantState,
  rebuildGrantReconciler,
  rebuildGrantTriggers,
} from "./replicas/rebuild-grant-controller.ts";
import { REPLICAS, replicaReconciler, replicaTriggers } from "./replicas/replica-controller.ts";
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

/**
 * What the manager drops before caching (managedFields are gone already): the annotations of
 * NVMePartitions (the CSI controller's request records, the bulk of a partition's metadata),
 * which no manager controller reads (but storage.distort.io/handover-from, kept: the replica
 * controller's planned handover reads it); every manager write of a partition is a patch or a status
 * write, never a whole-object replace from the cache. Other kinds are kept whole.
 */
export const managerTransform: ObjectTransform = (kind, obj) => {
  if (kind.kind === kinds.NVMePartition.kind) {
    const handover = obj.metadata.annotations?.[HANDOVER_ANNOTATION];
    delete obj.metadata.annotations;
    if (handover !== undefined) obj.metadata.annotations = { [HANDOVER_ANNOTATION]: handover };
  }
  return obj;
};

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
    attachments: new ResourceClient(conn, kinds.NVMeVolumeAttachment),
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
      name: REPLICAS,
      workers: config.workers,
      reconcile: replicaReconciler(ctx),
      triggers: replicaTriggers(ctx),
    },
    {
      // One decision over the whole cluster: one key, one worker.
      name: REBUILD_GRANTS,
      workers: 1,
      reconcile: rebuildGrantReconciler(ctx, new RebuildGrantState()),
      triggers: rebuildGrantTriggers(),
    },
    {
      name: LOST_NODES,
      workers: config.workers,
      reconcile: lostNodeReconciler(ctx),
      triggers: lostNodeTriggers(),
    },
    {
      name: STORAGE_NODES,
      workers: config.workers,
      reconcile: nodeReconciler(ctx),
      triggers: nodeTriggers(),
    },
    { name: DRAIN, workers: config.workers, reconcile: drainReconciler(ctx), triggers: drainTriggers() },
  ];
  const queues = new Map(specs.map((s) => [s.name, new WorkQueue({ name: s.name, clock })]));

  // One cache per kind for all four controllers, made anew for every leadership term.
  const cacheSet = new CacheSet(conn, {
    logger: log,
    resyncMs: config.resyncMs,
    transform: managerTransform,
  });
  const scope = { labelSelector: config.labelSelector };
  const caches = {
    devices: cacheSet.cache(kinds.NVMeDevice, scope),
    claims: cacheSet.cache(kinds.NVMeDeviceClaim, scope),
    partitions: cacheSet.cache(kinds.NVMePartition, scope),
    nodes: cacheSet.cache(kinds.RDMAStorageNode, { ...scope, namespace: config.namespace }),
  };
  const controllers = new ControllerManager({ caches: cacheSet, logger: log, clock, registry });
  for (const s of specs) {
    controllers.add({
      name: s.name,
      queue: queues.get(s.name) as WorkQueue,
      workers: s.workers,
      reconcile: s.reconcile,
    });
  }

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

  // Caches sync first (an abort of opts.signal meanwhile stops them and rejects), then the
  // controllers run.
  await controllers.start(opts.signal);
  log.info("caches synced", {
    devices: inventory.deviceCount(),
    partitions: caches.partitions.keys().length,
    pending: inventory.pendingCount,
  });

  let stopping: Promise<void> | undefined;
  return {
    inventory,
    queues,
    stop() {
      stopping ??= (async () => {
        await controllers.stop();
        placement.digest?.flush();
        await events.drain();
      })();
      return stopping;
    },
  };
}
