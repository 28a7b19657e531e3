// The names the manager writes into the API: its finalizer, the condition types it owns, and the
// component name Events carry. Kept in one place so docs, tests and controllers agree.

/** Finalizer the claim reconciler puts on every NVMeDeviceClaim it binds; removed after release. */
export const CLAIM_FINALIZER = "storage.distort.io/device-release";

/** Condition types the manager writes, per kind. */
export const ConditionTypes = {
  /** NVMePartition: placement result (True once spec.nodeName is set; False with a reason while unplaceable). */
  Scheduled: "Scheduled",
  /** NVMeDeviceClaim: generation-aware binding result. */
  Bound: "Bound",
  /** NVMeDeviceClaim, while deleting: False with the partitions that hold the device. */
  Released: "Released",
  /** NVMeDevice: whether its storage node is usable for placement (mirrors node health). */
  StorageNodeReady: "StorageNodeReady",
  /** NVMeDevice: True when placed partitions add up to more than the allocatable bytes. */
  Overcommitted: "Overcommitted",
  /** RDMAStorageNode: the agent's readiness; the manager sets False when the heartbeat is stale. */
  Ready: "Ready",
  /** RDMAStorageNode: aggregate inventory health written by the agent; placement requires True. */
  NVMeInventoryReady: "NVMeInventoryReady",
} as const;

/** reportingController of every Event the manager records. */
export const EVENT_CONTROLLER = "storage.distort.io/manager";
