// Registry of the six storage.distort.io/v1alpha1 kinds: names, scope, schemas and kubectl columns.
// The CRD generator, the docs and every client (watch caches, typed patches) read kinds from here.
import type * as v from "valibot";
import { API_VERSION, GROUP, type PrinterColumn, type SelectableField, VERSION } from "./common.ts";
import {
  NVMeDevicePrinterColumns,
  NVMeDeviceSchema,
  NVMeDeviceSelectableFields,
  NVMeDeviceSpecSchema,
  NVMeDeviceStatusSchema,
} from "./nvme-device.ts";
import {
  NVMeDeviceClaimPrinterColumns,
  NVMeDeviceClaimSchema,
  NVMeDeviceClaimSelectableFields,
  NVMeDeviceClaimSpecSchema,
  NVMeDeviceClaimStatusSchema,
} from "./nvme-device-claim.ts";
import {
  NVMePartitionPrinterColumns,
  NVMePartitionSchema,
  NVMePartitionSelectableFields,
  NVMePartitionSpecSchema,
  NVMePartitionStatusSchema,
} from "./nvme-partition.ts";
import {
  NVMeSnapshotPrinterColumns,
  NVMeSnapshotSchema,
  NVMeSnapshotSelectableFields,
  NVMeSnapshotSpecSchema,
  NVMeSnapshotStatusSchema,
} from "./nvme-snapshot.ts";
import {
  NVMeVolumeAttachmentPrinterColumns,
  NVMeVolumeAttachmentSchema,
  NVMeVolumeAttachmentSelectableFields,
  NVMeVolumeAttachmentSpecSchema,
  NVMeVolumeAttachmentStatusSchema,
} from "./nvme-volume-attachment.ts";
import {
  RDMAStorageNodePrinterColumns,
  RDMAStorageNodeSchema,
  RDMAStorageNodeSelectableFields,
  RDMAStorageNodeSpecSchema,
  RDMAStorageNodeStatusSchema,
} from "./rdma-storage-node.ts";

export { API_VERSION, GROUP, VERSION };

// Sync schemas only: every consumer parses with v.parse/v.safeParse.
type AnySchema = v.GenericSchema;

/** Everything needed to address, parse and install one kind. Immutable; safe to share. */
export interface KindDef<
  TKind extends string = string,
  TSchema extends AnySchema = AnySchema,
  TSpec extends AnySchema = AnySchema,
  TStatus extends AnySchema = AnySchema,
> {
  readonly group: typeof GROUP;
  readonly version: typeof VERSION;
  readonly apiVersion: typeof API_VERSION;
  readonly kind: TKind;
  /** One sentence; the CRD's top-level description. */
  readonly description: string;
  /** Resource name in URLs, e.g. /apis/storage.distort.io/v1alpha1/namespaces/ns/nvmepartitions. */
  readonly plural: string;
  readonly singular: string;
  readonly listKind: `${TKind}List`;
  readonly shortNames: readonly string[];
  /** `kubectl get distort` lists every kind. */
  readonly categories: readonly string[];
  readonly scope: "Namespaced" | "Cluster";
  /** Whole object: apiVersion, kind, metadata, spec, status?. */
  readonly schema: TSchema;
  readonly specSchema: TSpec;
  readonly statusSchema: TStatus;
  readonly printerColumns: readonly PrinterColumn[];
  /** JSONPaths usable as field selectors (`spec.nodeName=...`) on list and watch. */
  readonly selectableFields: readonly SelectableField[];
}

function defineKind<
  const TKind extends string,
  TSchema extends AnySchema,
  TSpec extends AnySchema,
  TStatus extends AnySchema,
>(
  d: Omit<
    KindDef<TKind, TSchema, TSpec, TStatus>,
    "group" | "version" | "apiVersion" | "listKind" | "categories"
  >,
): KindDef<TKind, TSchema, TSpec, TStatus> {
  return Object.freeze({
    group: GROUP,
    version: VERSION,
    apiVersion: API_VERSION,
    listKind: `${d.kind}List` as const,
    categories: ["distort"],
    ...d,
  });
}

export const kinds = {
  NVMeDevice: defineKind({
    kind: "NVMeDevice",
    description:
      "A physical NVMe controller on a storage node, identified by its exact serial; namespace ID 1 is offered for placement.",
    plural: "nvmedevices",
    singular: "nvmedevice",
    shortNames: ["nvmedev"],
    scope: "Cluster",
    schema: NVMeDeviceSchema,
    specSchema: NVMeDeviceSpecSchema,
    statusSchema: NVMeDeviceStatusSchema,
    printerColumns: NVMeDevicePrinterColumns,
    selectableFields: NVMeDeviceSelectableFields,
  }),
  NVMeDeviceClaim: defineKind({
    kind: "NVMeDeviceClaim",
    description:
      "An administrative reservation of one physical NVMe drive by exact serial, authorizing DISTORT to allocate from it.",
    plural: "nvmedeviceclaims",
    singular: "nvmedeviceclaim",
    shortNames: ["nvmeclaim"],
    scope: "Namespaced",
    schema: NVMeDeviceClaimSchema,
    specSchema: NVMeDeviceClaimSpecSchema,
    statusSchema: NVMeDeviceClaimStatusSchema,
    printerColumns: NVMeDeviceClaimPrinterColumns,
    selectableFields: NVMeDeviceClaimSelectableFields,
  }),
  NVMePartition: defineKind({
    kind: "NVMePartition",
    description:
      "A volume carved from a claimed NVMe drive (SPDK lvol or disk partition) and exported over NVMe-oF.",
    plural: "nvmepartitions",
    singular: "nvmepartition",
    shortNames: ["nvmepart"],
    scope: "Namespaced",
    schema: NVMePartitionSchema,
    specSchema: NVMePartitionSpecSchema,
    statusSchema: NVMePartitionStatusSchema,
    printerColumns: NVMePartitionPrinterColumns,
    selectableFields: NVMePartitionSelectableFields,
  }),
  NVMeSnapshot: defineKind({
    kind: "NVMeSnapshot",
    description:
      "A point-in-time, read-only copy of an NVMePartition (SPDK lvol snapshot) that new partitions can be cloned from.",
    plural: "nvmesnapshots",
    singular: "nvmesnapshot",
    shortNames: ["nvmesnap"],
    scope: "Namespaced",
    schema: NVMeSnapshotSchema,
    specSchema: NVMeSnapshotSpecSchema,
    statusSchema: NVMeSnapshotStatusSchema,
    printerColumns: NVMeSnapshotPrinterColumns,
    selectableFields: NVMeSnapshotSelectableFields,
  }),
  NVMeVolumeAttachment: defineKind({
    kind: "NVMeVolumeAttachment",
    description:
      "The single-writer ownership record of an exported NVMePartition: which node and host NQN the target admits.",
    plural: "nvmevolumeattachments",
    singular: "nvmevolumeattachment",
    shortNames: ["nvmeva"],
    scope: "Namespaced",
    schema: NVMeVolumeAttachmentSchema,
    specSchema: NVMeVolumeAttachmentSpecSchema,
    statusSchema: NVMeVolumeAttachmentStatusSchema,
    printerColumns: NVMeVolumeAttachmentPrinterColumns,
    selectableFields: NVMeVolumeAttachmentSelectableFields,
  }),
  RDMAStorageNode: defineKind({
    kind: "RDMAStorageNode",
    description:
      "Heartbeat and summary of one storage node: RDMA endpoint, capacity, exports and NVMe inventory health.",
    plural: "rdmastoragenodes",
    singular: "rdmastoragenode",
    shortNames: ["rdmanode"],
    scope: "Namespaced",
    schema: RDMAStorageNodeSchema,
    specSchema: RDMAStorageNodeSpecSchema,
    statusSchema: RDMAStorageNodeStatusSchema,
    printerColumns: RDMAStorageNodePrinterColumns,
    selectableFields: RDMAStorageNodeSelectableFields,
  }),
} as const;

export type KindName = keyof typeof kinds;
/** The parsed object type of a kind, e.g. `KindObject<"NVMePartition">`. */
export type KindObject<K extends KindName> = v.InferOutput<(typeof kinds)[K]["schema"]>;
