// NVMeDeviceClaim (namespaced): an administrator's reservation of one physical drive by exact serial,
// authorizing DISTORT to allocate from it. The manager binds it to the matching NVMeDevice.
import * as v from "valibot";
import {
  API_VERSION,
  conditions,
  immutable,
  name,
  ObjectMetaSchema,
  ObservedGenerationSchema,
  type PrinterColumn,
  type SelectableField,
} from "./common.ts";

/** Condition types written on NVMeDeviceClaim.status. */
export const NVMeDeviceClaimConditionTypes = {
  /** Generation-aware binding result of the manager's claim reconciler. */
  Bound: "Bound",
} as const;

export const NVMeDeviceClaimSpecSchema = v.pipe(
  v.object({
    serial: v.pipe(
      v.string(),
      v.minLength(1, "spec.serial must not be empty"),
      v.maxLength(256),
      immutable("spec.serial"),
      v.description("Exact serial number of the drive to reserve. Immutable."),
    ),
    nodeName: v.optional(
      name("If set, only a device on this node may satisfy the claim (guards against serial collisions)."),
    ),
    overcommitRatio: v.optional(
      v.pipe(
        v.number(),
        v.minValue(1, "spec.overcommitRatio must be at least 1"),
        v.maxValue(100, "spec.overcommitRatio must be at most 100"),
        v.description(
          "How far thin partitions may overcommit the drive: their sizes plus the thick ones' may sum to allocatableBytes x this ratio (thick ones alone never beyond allocatableBytes). Absent: 1, no overcommit. Claims of one drive class share a value.",
        ),
      ),
    ),
  }),
  v.description("Which drive to reserve."),
);
export type NVMeDeviceClaimSpec = v.InferOutput<typeof NVMeDeviceClaimSpecSchema>;

export const NVMeDeviceClaimPhaseSchema = v.pipe(
  v.picklist(["Pending", "Bound", "Lost"]),
  v.description(
    "Pending: no matching device yet; Bound: device reserved; Lost: the bound device disappeared.",
  ),
);
export type NVMeDeviceClaimPhase = v.InferOutput<typeof NVMeDeviceClaimPhaseSchema>;

export const NVMeDeviceClaimStatusSchema = v.pipe(
  v.object({
    phase: NVMeDeviceClaimPhaseSchema,
    deviceName: v.optional(name("metadata.name of the bound NVMeDevice.")),
    nodeName: v.optional(name("Node of the bound NVMeDevice.")),
    conditions: conditions("Bound and related observations."),
    observedGeneration: ObservedGenerationSchema,
  }),
  v.description("Binding result, written by the manager."),
);
export type NVMeDeviceClaimStatus = v.InferOutput<typeof NVMeDeviceClaimStatusSchema>;

export const NVMeDeviceClaimSchema = v.object({
  apiVersion: v.literal(API_VERSION),
  kind: v.literal("NVMeDeviceClaim"),
  metadata: ObjectMetaSchema,
  spec: NVMeDeviceClaimSpecSchema,
  status: v.optional(NVMeDeviceClaimStatusSchema),
});
export type NVMeDeviceClaim = v.InferOutput<typeof NVMeDeviceClaimSchema>;

export const NVMeDeviceClaimPrinterColumns: readonly PrinterColumn[] = [
  { name: "Serial", type: "string", jsonPath: ".spec.serial" },
  { name: "Phase", type: "string", jsonPath: ".status.phase" },
  { name: "Device", type: "string", jsonPath: ".status.deviceName" },
  { name: "Node", type: "string", jsonPath: ".status.nodeName" },
  { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
];

export const NVMeDeviceClaimSelectableFields: readonly SelectableField[] = [".spec.serial"];
