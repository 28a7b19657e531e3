// The RDMAStorageNode status the reporter publishes each pass, as a pure function: the RDMA
// endpoint, capacity of the node's claimed devices, export count, heartbeat, and the Ready,
// KernelInventoryReady, SpdkInventoryReady and NVMeInventoryReady conditions with reasons.
import type { NVMeDevice } from "../../api/nvme-device.ts";
import {
  RDMAStorageNodeConditionTypes as C,
  type RDMAStorageNodeStatus,
} from "../../api/rdma-storage-node.ts";
import { type Condition, setCondition } from "../../lib/kube/conditions.ts";
import { formatQuantity } from "../../lib/units.ts";
import type { DiscoveryResult, SourceHealth } from "../discovery/inventory.ts";
import type { EndpointResult } from "../discovery/rdma-endpoint.ts";

/** Sums over the devices of `node` whose phase is Claimed (Unavailable ones hold no usable capacity). */
export interface ClaimedCapacity {
  readonly totalBytes: number;
  /** A claimed device the manager has not yet accounted (no status.freeBytes) counts as 0 free. */
  readonly freeBytes: number;
  readonly devices: number;
}

/** Capacity of the claimed devices of `node`. Pure. */
export function claimedCapacity(devices: Iterable<NVMeDevice>, node: string): ClaimedCapacity {
  let totalBytes = 0;
  let freeBytes = 0;
  let count = 0;
  for (const d of devices) {
    if (d.spec.nodeName !== node || d.status?.phase !== "Claimed") continue;
    count++;
    totalBytes += d.spec.allocatableBytes;
    freeBytes += Math.min(d.status.freeBytes ?? 0, d.spec.allocatableBytes);
  }
  return { totalBytes, freeBytes, devices: count };
}

/** Everything one pass observed about the node. */
export interface NodeObservation {
  readonly endpoint: EndpointResult;
  readonly inventory: Pick<DiscoveryResult, "kernel" | "spdk" | "complete" | "spdkVersion">;
  readonly capacity: ClaimedCapacity;
  /** undefined when the count could not be read this pass: the previous value is kept. */
  readonly exportCount: number | undefined;
  /** Transports of the partitions exported now; undefined when unread this pass (previous kept). */
  readonly servedTransports?: readonly string[] | undefined;
}

type CondInput = Omit<Condition, "lastTransitionTime">;

function sourceCondition(type: string, h: SourceHealth): Omit<CondInput, "observedGeneration"> {
  return {
    type,
    status: h.state === "ok" ? "True" : "False",
    reason: h.reason,
    message: h.state === "ok" ? h.message : `${h.state}: ${h.message}`,
  };
}

function inventoryCondition(inv: NodeObservation["inventory"]): Omit<CondInput, "observedGeneration"> {
  const summary = `kernel ${inv.kernel.state} (${inv.kernel.reason}), spdk ${inv.spdk.state} (${inv.spdk.reason})`;
  if (inv.complete && inv.kernel.state === "ok" && inv.spdk.state === "ok") {
    return { type: C.NVMeInventoryReady, status: "True", reason: "InventoryComplete", message: summary };
  }
  const kernelBad = inv.kernel.state !== "ok";
  const spdkBad = inv.spdk.state !== "ok";
  const reason =
    kernelBad && spdkBad
      ? "SourcesNotReady"
      : kernelBad
        ? "KernelInventoryNotReady"
        : spdkBad
          ? "SpdkInventoryNotReady"
          : "InventoryIncomplete";
  return {
    type: C.NVMeInventoryReady,
    status: "False",
    reason,
    message: `absent drives are not trusted until a complete scan: ${summary}`,
  };
}

function readyCondition(e: EndpointResult): Omit<CondInput, "observedGeneration"> {
  if (!e.ok) return { type: C.Ready, status: "False", reason: e.reason, message: e.message };
  const p = e.endpoint;
  const speed = p.linkSpeedMbps === undefined ? "" : `, ${p.linkSpeedMbps} Mb/s`;
  if (p.device === "configured") {
    return {
      type: C.Ready,
      status: "True",
      reason: "PortalConfigured",
      message: `${p.ip} (configured portal address)`,
    };
  }
  return {
    type: C.Ready,
    status: "True",
    reason: "RdmaEndpointReady",
    message: `${p.ip} on ${p.netdev} (${p.device} port ${p.port}${speed})`,
  };
}

/**
 * The status after this pass, from the stored one. Endpoint fields are dropped when no endpoint
 * is usable (a stale portal must not be advertised); conditions other than the four are kept.
 * lastHeartbeatTime is `now`. Pure.
 */
export function nextNodeStatus(
  prev: RDMAStorageNodeStatus | undefined,
  generation: number | undefined,
  obs: NodeObservation,
  now: Date,
): RDMAStorageNodeStatus {
  const gen = generation === undefined ? {} : { observedGeneration: generation };
  let conditions: Condition[] = prev?.conditions ?? [];
  for (const c of [
    readyCondition(obs.endpoint),
    sourceCondition(C.KernelInventoryReady, obs.inventory.kernel),
    sourceCondition(C.SpdkInventoryReady, obs.inventory.spdk),
    inventoryCondition(obs.inventory),
  ]) {
    conditions = setCondition(conditions, { ...c, ...gen }, now);
  }
  const exportCount = obs.exportCount ?? prev?.exportCount;
  const served =
    obs.servedTransports === undefined
      ? prev?.servedTransports
      : [...new Set(obs.servedTransports)].sort().join(",");
  // A pass that could not read the version keeps the last one read.
  const spdkVersion = obs.inventory.spdkVersion ?? prev?.spdkVersion;
  const e = obs.endpoint;
  return {
    ...(e.ok
      ? {
          rdmaIP: e.endpoint.ip,
          ...(e.endpoint.transport === undefined ? {} : { transport: e.endpoint.transport }),
          ...(e.endpoint.linkSpeedMbps === undefined ? {} : { linkSpeedMbps: e.endpoint.linkSpeedMbps }),
        }
      : {}),
    totalBytes: obs.capacity.totalBytes,
    freeBytes: obs.capacity.freeBytes,
    total: formatQuantity(obs.capacity.totalBytes),
    free: formatQuantity(obs.capacity.freeBytes),
    ...(served === undefined ? {} : { servedTransports: served }),
    ...(exportCount === undefined ? {} : { exportCount }),
    ...(spdkVersion === undefined ? {} : { spdkVersion }),
    lastHeartbeatTime: new Date(now).toISOString(),
    conditions,
    ...gen,
  };
}
