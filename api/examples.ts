// One valid object per kind, as a manager/agent/CSI would see it mid-life. Tests start from these and
// mutate one field; docs/api.md quotes them. Functions, so callers may mutate their copy freely.
import type { NVMeDevice } from "./nvme-device.ts";
import type { NVMeDeviceClaim } from "./nvme-device-claim.ts";
import type { NVMePartition } from "./nvme-partition.ts";
import type { NVMeSnapshot } from "./nvme-snapshot.ts";
import type { NVMeVolumeAttachment } from "./nvme-volume-attachment.ts";
import type { RDMAStorageNode } from "./rdma-storage-node.ts";

const T = "2026-02-01T10:00:00Z";
const GiB = 1024 ** 3;

export function exampleNVMeDevice(): NVMeDevice {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDevice",
    metadata: { name: "node-a-3f2c9e1b", uid: "6d1f7c1e-0000-4000-8000-000000000001", generation: 1 },
    spec: {
      nodeName: "node-a",
      pciAddress: "0000:3b:00.0",
      serial: "S4EWNX0R123456",
      model: "SAMSUNG MZQL23T8HCLS",
      allocatableBytes: 3_800 * GiB,
      numaNode: 0,
    },
    status: {
      phase: "Claimed",
      claimRef: { namespace: "distort-system", name: "drive-1", uid: "6d1f7c1e-0000-4000-8000-000000000002" },
      freeBytes: 3_700 * GiB,
      activeBackend: "spdk",
      reservations: [
        {
          uid: "0f8fad5b-d9cb-469f-a165-70867728950e",
          namespace: "distort-system",
          name: "pvc-0f8fad5b",
          bytes: 100 * GiB,
        },
      ],
      conditions: [],
      observedGeneration: 1,
    },
  };
}

export function exampleNVMeDeviceClaim(): NVMeDeviceClaim {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDeviceClaim",
    metadata: { name: "drive-1", namespace: "distort-system", uid: "6d1f7c1e-0000-4000-8000-000000000002" },
    spec: { serial: "S4EWNX0R123456", nodeName: "node-a" },
    status: {
      phase: "Bound",
      deviceName: "node-a-3f2c9e1b",
      nodeName: "node-a",
      conditions: [
        {
          type: "Bound",
          status: "True",
          observedGeneration: 1,
          lastTransitionTime: T,
          reason: "DeviceBound",
          message: "",
        },
      ],
      observedGeneration: 1,
    },
  };
}

export function exampleNVMePartition(): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: {
      name: "pvc-0f8fad5b",
      namespace: "distort-system",
      uid: "0f8fad5b-d9cb-469f-a165-70867728950e",
    },
    spec: {
      sizeBytes: 100 * GiB,
      nodeName: "node-a",
      deviceSerial: "S4EWNX0R123456",
      claimRef: { namespace: "distort-system", name: "drive-1", uid: "6d1f7c1e-0000-4000-8000-000000000002" },
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "rdma", portalPort: 4420, coreMask: "0x3" },
    },
    status: {
      state: "Exported",
      externalId: "vol-4b1d0c6f9a",
      volumeHandle: "distort-system/pvc-0f8fad5b",
      backendPath: "9c3e6a2e-1f3b-4f7e-9d2a-0c4b5e6f7a8b",
      nqn: "nqn.2026-02.io.distort:volume-vol-4b1d0c6f9a",
      portalIP: "192.168.100.10",
      portalPort: 4420,
      transport: "rdma",
      allocatedBytes: 100 * GiB,
      conditions: [
        {
          type: "Ready",
          status: "True",
          lastTransitionTime: T,
          reason: "Exported",
          message: "listening on rdma",
        },
      ],
      observedGeneration: 1,
    },
  };
}

export function exampleNVMeSnapshot(): NVMeSnapshot {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeSnapshot",
    metadata: {
      name: "snapshot-7c9e6679",
      namespace: "distort-system",
      uid: "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    },
    spec: {
      sourcePartitionName: "pvc-0f8fad5b",
      sourcePartitionUID: "0f8fad5b-d9cb-469f-a165-70867728950e",
    },
    status: {
      readyToUse: true,
      sizeBytes: 107374182400,
      externalId: "snap-7c9e6679742540de944b",
      nodeName: "node-a",
      deviceSerial: "S4EWNX0R123456",
      creationTime: T,
      conditions: [
        { type: "Ready", status: "True", lastTransitionTime: T, reason: "SnapshotTaken", message: "" },
      ],
      observedGeneration: 1,
    },
  };
}

export function exampleNVMeVolumeAttachment(): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    // The name CSI ControllerPublishVolume derives for the example partition (attachmentNameFor).
    metadata: { name: "pvc-0f8fad5b-c812e1edb6", namespace: "distort-system" },
    spec: {
      partitionName: "pvc-0f8fad5b",
      partitionUID: "0f8fad5b-d9cb-469f-a165-70867728950e",
      nodeId: "node-b",
      hostNQN: "nqn.2014-08.org.nvmexpress:uuid:7d3a0a36-6c1f-4c55-9a51-1f2b3c4d5e6f",
      attachmentId: "att-1",
    },
    status: {
      observedAttachmentId: "att-1",
      conditions: [
        { type: "AccessReady", status: "True", lastTransitionTime: T, reason: "HostAllowed", message: "" },
      ],
    },
  };
}

export function exampleRDMAStorageNode(): RDMAStorageNode {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name: "node-a", namespace: "distort-system" },
    spec: { nodeName: "node-a" },
    status: {
      rdmaIP: "192.168.100.10",
      transport: "rdma",
      linkSpeedMbps: 100_000,
      totalBytes: 3_800 * GiB,
      freeBytes: 3_700 * GiB,
      exportCount: 1,
      lastHeartbeatTime: T,
      conditions: [
        { type: "Ready", status: "True", lastTransitionTime: T, reason: "HeartbeatFresh", message: "" },
        {
          type: "NVMeInventoryReady",
          status: "True",
          lastTransitionTime: T,
          reason: "ScanComplete",
          message: "",
        },
      ],
    },
  };
}
