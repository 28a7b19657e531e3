// Barrel for the storage.distort.io/v1alpha1 API: schemas, inferred types, the kind registry and CRD rendering.
// Import from "api/index.ts" (or the specific file) rather than reaching into helpers.
export * from "./common.ts";
export * from "./crd.ts";
export * from "./drain.ts";
export * from "./examples.ts";
export * from "./kinds.ts";
export * from "./nvme-device.ts";
export * from "./nvme-device-claim.ts";
export * from "./nvme-partition.ts";
export * from "./nvme-snapshot.ts";
export * from "./nvme-volume-attachment.ts";
export * from "./rdma-storage-node.ts";
export * from "./replicas.ts";
