// NVMeDevice (cluster-scoped): one physical NVMe controller on a storage node, identified by its exact
// serial. The agent creates it from discovery; the manager records claim ownership and free capacity.
import * as v from "valibot";
import {
  API_VERSION,
  BackendSchema,
  ClaimRefSchema,
  cel,
  conditions,
  dateTime,
  immutable,
  int64,
  intRange,
  name,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  openapi,
  type PrinterColumn,
  positiveBytes,
  quantity,
  type SelectableField,
  str,
} from "./common.ts";
import { drainCheck, drainFields, drainRule } from "./drain.ts";

export const NVMeDevicePhaseSchema = v.pipe(
  v.picklist(["Available", "Claimed", "Unavailable"]),
  v.description(
    "Available: unclaimed; Claimed: reserved by status.claimRef; Unavailable: absent from the last complete scan (claim identity kept for recovery).",
  ),
);
export type NVMeDevicePhase = v.InferOutput<typeof NVMeDevicePhaseSchema>;

export const NVMeDeviceSpecSchema = v.pipe(
  v.object({
    nodeName: v.pipe(name("Kubernetes node the controller is attached to."), immutable("spec.nodeName")),
    pciAddress: v.pipe(
      v.string(),
      v.maxLength(16),
      // Lower-case, zero-padded domain:bus:device.function; domains above 0xffff exist (Intel VMD).
      v.regex(
        /^[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$/,
        "spec.pciAddress must be normalized (0000:00:00.0)",
      ),
      v.description("Normalized PCI address, lower-case domain:bus:device.function (e.g. 0000:3b:00.0)."),
    ),
    serial: v.pipe(
      str("Exact hardware serial number; the stable identity claims and partitions match on.", 256, 1),
      immutable("spec.serial"),
    ),
    model: str("Model number reported by the controller.", 256),
    allocatableBytes: positiveBytes(
      "Capacity of namespace ID 1 offered for placement: 1% reserved for backend metadata, rounded down to 4 MiB.",
    ),
    numaNode: v.pipe(intRange(-1, 4095), v.description("NUMA node of the PCI device; -1 when unknown.")),
    ...drainFields,
  }),
  drainCheck(),
  drainRule(),
  v.description(
    "Hardware facts discovered by the agent, and the operator's cordon (unschedulable) and drain of this drive; the agent never writes those two.",
  ),
);
export type NVMeDeviceSpec = v.InferOutput<typeof NVMeDeviceSpecSchema>;

/**
 * A ledger entry whose partition was deleted while its data could not be removed (the drive was
 * lost, or its storage node): the room stays held, since the drive may come back holding the old
 * volume, until the agent has deleted that volume from the returned drive (it then drops the
 * entry) or the device itself is deleted (a drive that will not return).
 */
export const LeftoverSchema = v.pipe(
  v.object({
    since: dateTime("When the partition was released without its volume being deleted (RFC 3339)."),
    reason: v.pipe(
      v.string(),
      v.minLength(1),
      v.maxLength(64),
      v.description("Why its volume could not be deleted: DeviceUnavailable or NodeLost."),
    ),
  }),
  v.description(
    "The partition is gone but its volume may still be on the drive: the agent deletes it when the drive is back, then drops this entry.",
  ),
);
export type Leftover = v.InferOutput<typeof LeftoverSchema>;

/**
 * One entry of the device's placement ledger: capacity promised to one NVMePartition. The manager
 * writes it (resourceVersion-guarded) BEFORE it sets the partition's spec.nodeName/deviceSerial, so
 * the apiserver arbitrates every promise and two managers can never over-commit the device.
 */
export const DeviceReservationSchema = v.pipe(
  v.object({
    uid: str("metadata.uid of the NVMePartition the capacity is promised to.", 128, 1),
    namespace: v.pipe(
      v.string(),
      v.minLength(1),
      v.maxLength(63),
      v.description("Namespace of the NVMePartition."),
    ),
    name: name("Name of the NVMePartition."),
    bytes: positiveBytes("Bytes promised: the partition's size rounded up to the 4 MiB allocation unit."),
    thin: v.optional(
      v.pipe(
        v.boolean(),
        v.description(
          "A thin partition: promised against the overcommit budget (allocatableBytes x the claim's overcommitRatio) rather than physical capacity.",
        ),
      ),
    ),
    leftover: v.optional(LeftoverSchema),
  }),
  v.description("Capacity promised to one partition (placement ledger entry)."),
);
export type DeviceReservation = v.InferOutput<typeof DeviceReservationSchema>;

const claimedNeedsRef = "status.claimRef is required when status.phase is Claimed";

/** The drive's lvstore as the agent last read it from SPDK (bdev_lvol_get_lvstores). */
export const LvstoreUsageSchema = v.pipe(
  v.object({
    totalBytes: int64("Data clusters of the lvstore x cluster size (total_data_clusters)."),
    freeBytes: int64("Free clusters x cluster size: what thin volumes can still allocate."),
    observedTime: dateTime("When the agent read it (RFC 3339)."),
  }),
  v.description(
    "Physical fullness of the drive's lvstore (agent); placement refuses thin volumes above a threshold.",
  ),
);
export type LvstoreUsage = v.InferOutput<typeof LvstoreUsageSchema>;

export const NVMeDeviceStatusSchema = v.pipe(
  v.object({
    phase: NVMeDevicePhaseSchema,
    claimRef: v.optional(ClaimRefSchema),
    freeBytes: v.optional(
      int64("allocatableBytes minus the rounded sizes of partitions placed on this device (manager)."),
    ),
    allocatable: v.optional(
      quantity("spec.allocatableBytes as a quantity, e.g. 31.7Gi (manager, with freeBytes)."),
    ),
    free: v.optional(quantity("freeBytes as a quantity, e.g. 30.7Gi (manager, with freeBytes).")),
    provisionedBytes: v.optional(
      int64("Sizes of every partition held on the device, thin and thick (manager, with freeBytes)."),
    ),
    thinBytes: v.optional(int64("The thin partitions' share of provisionedBytes (manager, with freeBytes).")),
    overcommitRatio: v.optional(
      v.pipe(
        v.number(),
        v.minValue(1),
        v.maxValue(100),
        v.description("The owning claim's overcommitRatio the manager last accounted with (manager)."),
      ),
    ),
    lvstore: v.optional(LvstoreUsageSchema),
    activeBackend: v.optional(
      v.pipe(
        BackendSchema,
        v.description(
          "Backend currently owning the controller; a lock against mixing SPDK and kernel allocations.",
        ),
      ),
    ),
    reservations: v.optional(
      v.pipe(
        v.array(DeviceReservationSchema),
        v.maxLength(4096),
        openapi({ "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"] }),
        v.description(
          "Placement ledger (manager): one entry per partition placed on, or being placed on, this device. Entries are removed only once their partition is gone or was placed on another device; a leftover entry (its partition released while the drive or node was lost) only once the agent deleted the volume from the drive.",
        ),
      ),
      () => [],
    ),
    conditions: conditions("Observations of the device by the agent and the manager."),
    observedGeneration: ObservedGenerationSchema,
  }),
  v.forward(
    v.partialCheck(
      [["phase"], ["claimRef"]],
      (s) => s.phase !== "Claimed" || s.claimRef !== undefined,
      claimedNeedsRef,
    ),
    ["claimRef"],
  ),
  cel("self.phase != 'Claimed' || has(self.claimRef)", claimedNeedsRef, {
    fieldPath: ".claimRef",
    reason: "FieldValueRequired",
  }),
  v.description("Ownership and capacity, written by the manager and the agent."),
);
export type NVMeDeviceStatus = v.InferOutput<typeof NVMeDeviceStatusSchema>;

export const NVMeDeviceSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("NVMeDevice"),
  metadata: ObjectMetaSchema,
  spec: NVMeDeviceSpecSchema,
  status: v.optional(NVMeDeviceStatusSchema),
});
export type NVMeDevice = v.InferOutput<typeof NVMeDeviceSchema>;

export const NVMeDevicePrinterColumns: readonly PrinterColumn[] = [
  { name: "Node", type: "string", jsonPath: ".spec.nodeName" },
  { name: "Serial", type: "string", jsonPath: ".spec.serial" },
  { name: "Allocatable", type: "string", jsonPath: ".status.allocatable" },
  { name: "Free", type: "string", jsonPath: ".status.free" },
  { name: "Phase", type: "string", jsonPath: ".status.phase" },
  { name: "Backend", type: "string", jsonPath: ".status.activeBackend" },
  { name: "Claim", type: "string", jsonPath: ".status.claimRef.name", priority: 1 },
  { name: "Model", type: "string", jsonPath: ".spec.model", priority: 1 },
  { name: "PCI", type: "string", jsonPath: ".spec.pciAddress", priority: 1 },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const NVMeDeviceSelectableFields: readonly SelectableField[] = [".spec.nodeName", ".spec.serial"];
