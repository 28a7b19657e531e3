// Builders for the manager's tests: valid objects of each kind with only the fields a case cares
// about spelled out. Unit tests use them as observed state; integration tests create them (the
// server assigns uid, resourceVersion and generation there).
import type {
  ClaimRef,
  Condition,
  DeviceReservation,
  NVMeDevice,
  NVMeDeviceClaim,
  NVMePartition,
  RDMAStorageNode,
  TopologyRequirement,
} from "../../api/index.ts";
import { formatConditionTime } from "../../lib/kube/conditions.ts";

export const MiB = 1024 ** 2;
export const GiB = 1024 ** 3;
export const T0 = Date.parse("2026-02-01T10:00:00Z");
const API = "storage.distort.io/v1alpha1" as const;

export function cond(
  type: string,
  status: "True" | "False" | "Unknown",
  reason = "Test",
  at = T0,
): Condition {
  return { type, status, reason, message: "", lastTransitionTime: formatConditionTime(new Date(at)) };
}

export interface DeviceOpts {
  node?: string;
  serial?: string;
  allocatable?: number;
  /** Claimed by this claim (phase Claimed); omitted: no status at all unless phase is given. */
  claim?: ClaimRef;
  phase?: "Available" | "Claimed" | "Unavailable";
  reservations?: DeviceReservation[];
  activeBackend?: "spdk" | "kernel";
  conditions?: Condition[];
  labels?: Record<string, string>;
}

export function device(name: string, o: DeviceOpts = {}): NVMeDevice {
  const d: NVMeDevice = {
    apiVersion: API,
    kind: "NVMeDevice",
    metadata: {
      name,
      uid: `uid-${name}`,
      generation: 1,
      resourceVersion: "1",
      ...(o.labels ? { labels: o.labels } : {}),
    },
    spec: {
      nodeName: o.node ?? "node-a",
      pciAddress: "0000:3b:00.0",
      serial: o.serial ?? `SER-${name}`,
      model: "TEST",
      allocatableBytes: o.allocatable ?? 100 * GiB,
      numaNode: 0,
    },
  };
  const phase = o.phase ?? (o.claim ? "Claimed" : undefined);
  if (phase) {
    d.status = {
      phase,
      ...(o.claim ? { claimRef: o.claim } : {}),
      reservations: o.reservations ?? [],
      ...(o.activeBackend ? { activeBackend: o.activeBackend } : {}),
      conditions: o.conditions ?? [],
    };
  }
  return d;
}

export interface ClaimOpts {
  uid?: string;
  serial?: string;
  nodeName?: string;
  /** Status Bound to this device (on `boundNode`). */
  boundTo?: string;
  boundNode?: string;
  deleting?: boolean;
  finalizers?: string[];
  generation?: number;
  labels?: Record<string, string>;
  conditions?: Condition[];
}

export function claim(namespace: string, name: string, o: ClaimOpts = {}): NVMeDeviceClaim {
  const c: NVMeDeviceClaim = {
    apiVersion: API,
    kind: "NVMeDeviceClaim",
    metadata: {
      name,
      namespace,
      uid: o.uid ?? `uid-claim-${name}`,
      generation: o.generation ?? 1,
      resourceVersion: "1",
      ...(o.finalizers ? { finalizers: o.finalizers } : {}),
      ...(o.deleting ? { deletionTimestamp: "2026-02-01T10:00:00Z" } : {}),
      ...(o.labels ? { labels: o.labels } : {}),
    },
    spec: { serial: o.serial ?? "SER-d1", ...(o.nodeName ? { nodeName: o.nodeName } : {}) },
  };
  if (o.boundTo) {
    c.status = {
      phase: "Bound",
      deviceName: o.boundTo,
      nodeName: o.boundNode ?? "node-a",
      conditions: o.conditions ?? [cond("Bound", "True", "DeviceBound")],
      observedGeneration: c.metadata.generation,
    };
  }
  return c;
}

export function refOf(c: NVMeDeviceClaim): ClaimRef {
  return { namespace: c.metadata.namespace as string, name: c.metadata.name, uid: c.metadata.uid as string };
}

/** A device and the claim bound to it, consistent with each other. */
export function claimedDevice(
  name: string,
  o: DeviceOpts & { claimNamespace?: string; claimName?: string } = {},
): { device: NVMeDevice; claim: NVMeDeviceClaim } {
  const node = o.node ?? "node-a";
  const serial = o.serial ?? `SER-${name}`;
  const c = claim(o.claimNamespace ?? "admin", o.claimName ?? `claim-${name}`, {
    serial,
    boundTo: name,
    boundNode: node,
  });
  return { device: device(name, { ...o, node, serial, claim: refOf(c) }), claim: c };
}

export interface NodeOpts {
  /** Heartbeat time in ms; undefined: none recorded. */
  heartbeat?: number;
  ready?: boolean;
  rdmaIP?: string | null;
  inventory?: boolean;
  labels?: Record<string, string>;
  namespace?: string;
  name?: string;
}

export function storageNode(nodeName: string, o: NodeOpts = {}): RDMAStorageNode {
  const hb = "heartbeat" in o ? o.heartbeat : T0;
  const conditions: Condition[] = [];
  conditions.push(
    cond("Ready", o.ready === false ? "False" : "True", o.ready === false ? "LinkDown" : "HeartbeatFresh"),
  );
  conditions.push(cond("NVMeInventoryReady", o.inventory === false ? "False" : "True", "ScanComplete"));
  return {
    apiVersion: API,
    kind: "RDMAStorageNode",
    metadata: {
      name: o.name ?? nodeName,
      namespace: o.namespace ?? "distort-system",
      resourceVersion: "1",
      ...(o.labels ? { labels: o.labels } : {}),
    },
    spec: { nodeName },
    status: {
      ...(o.rdmaIP === null ? {} : { rdmaIP: o.rdmaIP ?? "192.168.100.10" }),
      transport: "rdma",
      ...(hb === undefined ? {} : { lastHeartbeatTime: new Date(hb).toISOString() }),
      conditions,
    },
  };
}

export interface PartitionOpts {
  uid?: string;
  size?: number;
  node?: string;
  serial?: string;
  claimRef?: ClaimRef;
  backend?: "spdk" | "kernel";
  topology?: TopologyRequirement;
  deleting?: boolean;
  generation?: number;
  conditions?: Condition[];
  state?: "Pending" | "Placed" | "Provisioning" | "Exported" | "Deleting" | "Failed";
  labels?: Record<string, string>;
}

export function partition(namespace: string, name: string, o: PartitionOpts = {}): NVMePartition {
  const p: NVMePartition = {
    apiVersion: API,
    kind: "NVMePartition",
    metadata: {
      name,
      namespace,
      uid: o.uid ?? `uid-part-${name}`,
      generation: o.generation ?? 1,
      resourceVersion: "1",
      ...(o.deleting ? { deletionTimestamp: "2026-02-01T10:00:00Z", finalizers: ["test/hold"] } : {}),
      ...(o.labels ? { labels: o.labels } : {}),
    },
    spec: {
      sizeBytes: o.size ?? GiB,
      backend: o.backend ?? "spdk",
      volumeManager: "partition",
      ...(o.node ? { nodeName: o.node, deviceSerial: o.serial ?? "SER-d1" } : {}),
      ...(o.claimRef ? { claimRef: o.claimRef } : {}),
      ...(o.topology ? { topology: o.topology } : {}),
    },
  };
  if (o.state || o.conditions) p.status = { state: o.state ?? "Pending", conditions: o.conditions ?? [] };
  return p;
}

/** Only what the API server accepts on create: drops server-owned metadata and status. */
export function forCreate<T extends { metadata: Record<string, unknown>; status?: unknown }>(obj: T): T {
  const { uid: _u, resourceVersion: _r, generation: _g, deletionTimestamp: _d, ...meta } = obj.metadata;
  const { status: _s, ...rest } = obj;
  return { ...rest, metadata: meta } as T;
}
