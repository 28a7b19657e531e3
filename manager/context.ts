// What every manager controller is given: typed clients (the API server port), the shared
// inventory over the watch caches, events, clock, logger, metrics and configuration.
import type {
  NVMeDevice,
  NVMeDeviceClaim,
  NVMePartition,
  NVMeSnapshot,
  NVMeVolumeAttachment,
  RDMAStorageNode,
} from "../api/index.ts";
import type { Clock } from "../lib/clock.ts";
import type { KeyedMutex } from "../lib/concurrency/keyed-mutex.ts";
import type { ResourceClient } from "../lib/kube/resource.ts";
import type { Logger } from "../lib/log.ts";
import type { ManagerConfig } from "./config.ts";
import type { EventPort } from "./events.ts";
import type { Inventory } from "./inventory.ts";
import type { ManagerMetrics } from "./metrics.ts";

export interface Clients {
  devices: ResourceClient<NVMeDevice>;
  claims: ResourceClient<NVMeDeviceClaim>;
  partitions: ResourceClient<NVMePartition>;
  nodes: ResourceClient<RDMAStorageNode>;
  /** Read only, to place a restore on the drive holding its snapshot. */
  snapshots?: ResourceClient<NVMeSnapshot>;
  /** The replica controller admits a replicated volume's serving node to each of its copies. */
  attachments?: ResourceClient<NVMeVolumeAttachment>;
}

export interface ManagerContext {
  clients: Clients;
  inventory: Inventory;
  /** Serialises this process's writes to one device's status (ledger, ownership, conditions). */
  deviceLocks: KeyedMutex;
  events: EventPort;
  clock: Clock;
  log: Logger;
  metrics: ManagerMetrics;
  config: ManagerConfig;
}

/** Which keys of a controller's queue an object change concerns. Return [] for none. */
export interface Triggers {
  device?(oldObj: NVMeDevice | undefined, obj: NVMeDevice): Iterable<string>;
  claim?(oldObj: NVMeDeviceClaim | undefined, obj: NVMeDeviceClaim): Iterable<string>;
  partition?(oldObj: NVMePartition | undefined, obj: NVMePartition): Iterable<string>;
  node?(oldObj: RDMAStorageNode | undefined, obj: RDMAStorageNode): Iterable<string>;
}
