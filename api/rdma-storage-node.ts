// RDMAStorageNode (namespaced): the agent's heartbeat and summary of one storage node (RDMA endpoint,
// capacity, exports, inventory health). Placement refuses nodes whose record is stale, unready or incomplete.
import * as v from "valibot";
import {
  API_VERSION,
  conditions,
  dateTime,
  immutable,
  int64,
  ipAddress,
  name,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  type PrinterColumn,
  quantity,
  type SelectableField,
  str,
  TransportSchema,
} from "./common.ts";
import { drainCheck, drainFields, drainRule } from "./drain.ts";

/** Condition types written on RDMAStorageNode.status. */
export const RDMAStorageNodeConditionTypes = {
  /** Heartbeat fresh and RDMA endpoint usable; the manager sets False when the heartbeat goes stale. */
  Ready: "Ready",
  /** Kernel-bound NVMe discovery completed without errors. */
  KernelInventoryReady: "KernelInventoryReady",
  /** SPDK-bound NVMe discovery completed without errors. */
  SpdkInventoryReady: "SpdkInventoryReady",
  /** Both sources complete: absence of a device may be trusted. Placement requires True. */
  NVMeInventoryReady: "NVMeInventoryReady",
} as const;

export const RDMAStorageNodeSpecSchema = v.pipe(
  v.object({
    nodeName: v.pipe(name("Kubernetes node this record describes."), immutable("spec.nodeName")),
    ...drainFields,
  }),
  drainCheck(),
  drainRule(),
  v.description(
    "Which node (written by the agent at creation), and the operator's cordon (unschedulable) and drain; the agent never writes those two.",
  ),
);
export type RDMAStorageNodeSpec = v.InferOutput<typeof RDMAStorageNodeSpecSchema>;

export const RDMAStorageNodeStatusSchema = v.pipe(
  v.object({
    rdmaIP: v.optional(
      ipAddress("status.rdmaIP", "Address of the active RDMA port's interface (portal IP)."),
    ),
    transport: v.optional(v.pipe(TransportSchema, v.description("Transport the node's listeners use."))),
    linkSpeedMbps: v.optional(int64("Link speed of the active port in Mb/s.")),
    totalBytes: v.optional(int64("Sum of allocatable bytes of devices claimed on this node.")),
    freeBytes: v.optional(int64("Sum of free bytes of devices claimed on this node.")),
    total: v.optional(quantity("totalBytes as a quantity (reporter, with totalBytes).")),
    free: v.optional(quantity("freeBytes as a quantity (reporter, with freeBytes).")),
    servedTransports: v.optional(
      str(
        "Transports of the partitions this node exports now, sorted and comma-separated (e.g. tcp or rdma,tcp); empty when it exports none. status.transport is only what discovery found for the listener.",
        32,
      ),
    ),
    exportCount: v.optional(int64("Partitions currently exported by this node.")),
    spdkVersion: v.optional(
      v.pipe(
        v.string(),
        v.maxLength(64),
        v.description(
          "Version of the node's SPDK target (spdk_get_version), e.g. v25.05.1; below the agent's minimum SpdkInventoryReady is False with reason SpdkVersionUnsupported.",
        ),
      ),
    ),
    lastHeartbeatTime: v.optional(dateTime("When the agent's reporter last refreshed this status.")),
    conditions: conditions("Ready, KernelInventoryReady, SpdkInventoryReady, NVMeInventoryReady."),
    observedGeneration: ObservedGenerationSchema,
  }),
  v.description("Node summary, written by the agent's reporter every scan; Ready expired by the manager."),
);
export type RDMAStorageNodeStatus = v.InferOutput<typeof RDMAStorageNodeStatusSchema>;

export const RDMAStorageNodeSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("RDMAStorageNode"),
  metadata: ObjectMetaSchema,
  spec: RDMAStorageNodeSpecSchema,
  status: v.optional(RDMAStorageNodeStatusSchema),
});
export type RDMAStorageNode = v.InferOutput<typeof RDMAStorageNodeSchema>;

export const RDMAStorageNodePrinterColumns: readonly PrinterColumn[] = [
  { name: "Node", type: "string", jsonPath: ".spec.nodeName" },
  { name: "RDMA-IP", type: "string", jsonPath: ".status.rdmaIP" },
  {
    name: "Serves",
    type: "string",
    jsonPath: ".status.servedTransports",
    description: "transports of exported volumes",
  },
  { name: "Listener", type: "string", jsonPath: ".status.transport", priority: 1 },
  { name: "Ready", type: "string", jsonPath: '.status.conditions[?(@.type=="Ready")].status' },
  {
    name: "Inventory",
    type: "string",
    jsonPath: '.status.conditions[?(@.type=="NVMeInventoryReady")].status',
    priority: 1,
  },
  { name: "Free", type: "string", jsonPath: ".status.free" },
  { name: "Drain", type: "string", jsonPath: '.status.conditions[?(@.type=="Drained")].reason', priority: 1 },
  { name: "Total", type: "string", jsonPath: ".status.total", priority: 1 },
  { name: "Exports", type: "integer", jsonPath: ".status.exportCount" },
  { name: "Heartbeat", type: "date", jsonPath: ".status.lastHeartbeatTime", priority: 1 },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const RDMAStorageNodeSelectableFields: readonly SelectableField[] = [".spec.nodeName"];
