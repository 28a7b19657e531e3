// The manager's own Prometheus metrics (the work queues and reconcile loops have theirs in
// lib/kube/runner.ts). Registered with reuse so a process that regains leadership re-attaches.
import type { RequestObserver } from "../lib/kube/request-metrics.ts";
import { kubeRequestCounter } from "../lib/kube/request-metrics.ts";
import { controllerMetrics } from "../lib/kube/runner.ts";
import type { Counter, Gauge, Histogram, Registry } from "../lib/metrics.ts";

export interface ManagerMetrics {
  /** Seconds from first seeing an unplaced partition to writing its placement. */
  placementLatency: Histogram<never>;
  /** Placement decisions by result (placed, unschedulable, conflict). */
  placements: Counter<"result">;
  /** Reservation writes refused by the API server's resourceVersion check (another writer won). */
  reservationConflicts: Counter<never>;
  /** Partitions without a node that are not being deleted. */
  pendingPartitions: Gauge<never>;
  /** Free bytes per device as last accounted. */
  deviceFreeBytes: Gauge<"device" | "node">;
  /** 1 while this process leads (runs controllers). */
  leader: Gauge<never>;
  /** Failover steps taken for replicated volumes whose serving node was lost. */
  failoverSteps: Counter<"step">;
  /** Cluster rebuild slots by state: granted (held by a serving node) or queued (asked, waiting). */
  rebuildSlots: Gauge<"state">;
  /** Rebuild slots granted. */
  rebuildGrants: Counter<never>;
  /** Rebuild slots the manager released because what they were for was gone. */
  rebuildSlotReleases: Counter<never>;
  /** 1 while a storage node or drive drains with something left on it, 0 once drained. */
  draining: Gauge<"kind" | "name">;
  /** Copies of replicated volumes removed by a drain after their replacement was current. */
  replicasMoved: Counter<never>;
}

const LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

export function managerMetrics(registry: Registry): ManagerMetrics {
  return {
    placementLatency: registry.histogram({
      name: "distort_placement_latency_seconds",
      help: "Time from the manager first seeing an unplaced NVMePartition to writing its placement.",
      buckets: LATENCY_BUCKETS,
      reuse: true,
    }),
    placements: registry.counter({
      name: "distort_placements_total",
      help: "Placement decisions by result.",
      labelNames: ["result"],
      reuse: true,
    }),
    reservationConflicts: registry.counter({
      name: "distort_reservation_conflicts_total",
      help: "Device ledger writes refused because another writer changed the device first.",
      reuse: true,
    }),
    pendingPartitions: registry.gauge({
      name: "distort_partitions_pending",
      help: "NVMePartitions not yet placed on a node (excluding ones being deleted).",
      reuse: true,
    }),
    deviceFreeBytes: registry.gauge({
      name: "distort_device_free_bytes",
      help: "Free bytes of an NVMeDevice: allocatable minus ledger and placed partitions.",
      labelNames: ["device", "node"],
      reuse: true,
    }),
    leader: registry.gauge({
      name: "distort_manager_leader",
      help: "1 while this manager process holds the leader lease and runs its controllers.",
      reuse: true,
    }),
    failoverSteps: registry.counter({
      name: "distort_failover_steps_total",
      help: "Failover steps for replicated volumes whose serving node missed heartbeats (fence, wait-fenced, promote, serve, stuck).",
      labelNames: ["step"],
      reuse: true,
    }),
    rebuildSlots: registry.gauge({
      name: "distort_rebuild_slots",
      help: "Cluster-wide rebuild slots of replicated volumes by state: granted (a serving node may run the rebuild) or queued (asked for, waiting for DISTORT_REBUILDS_PER_CLUSTER).",
      labelNames: ["state"],
      reuse: true,
    }),
    rebuildGrants: registry.counter({
      name: "distort_rebuild_grants_total",
      help: "Rebuild slots the manager granted to serving nodes.",
      reuse: true,
    }),
    rebuildSlotReleases: registry.counter({
      name: "distort_rebuild_slot_releases_total",
      help: "Rebuild slots the manager released because their copy, volume or serving node was gone or moved (slots of finished or failed rebuilds are released by the serving node).",
      reuse: true,
    }),
    draining: registry.gauge({
      name: "distort_drain_in_progress",
      help: "1 while a storage node (kind RDMAStorageNode) or drive (kind NVMeDevice) drains with something of DISTORT left on it; 0 once drained.",
      labelNames: ["kind", "name"],
      reuse: true,
    }),
    replicasMoved: registry.counter({
      name: "distort_drain_replicas_moved_total",
      help: "Copies of replicated volumes a drain removed after their replacement elsewhere was current.",
      reuse: true,
    }),
  };
}

/**
 * Every family the manager binary exports, registered at start (main.ts) and by the
 * metric-coverage test: its own, the controllers' work queues and reconciles, and the API
 * requests it sends. Returns the manager's metrics and the request observer for its connection.
 */
export function registerManagerMetrics(registry: Registry): {
  metrics: ManagerMetrics;
  onRequest: RequestObserver;
} {
  controllerMetrics(registry);
  return { metrics: managerMetrics(registry), onRequest: kubeRequestCounter(registry) };
}
