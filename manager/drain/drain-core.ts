// Drain of a storage node or a drive, as pure functions: which copy of a replicated volume drains
// (and why), and what the Drained condition of a draining RDMAStorageNode / NVMeDevice says about
// what is still on it. The replica core uses copyDrain to replace a draining copy before it is
// retired; the drain controller writes the condition and the Events.
import {
  DRAINED,
  DrainReasons,
  isDraining,
  type NVMeDevice,
  type NVMePartition,
  type RDMAStorageNode,
} from "../../api/index.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import type { ConditionInput } from "../status-patch.ts";

/** What the drain decisions read (the inventory implements it). */
export interface DrainView {
  node(nodeName: string): RDMAStorageNode | undefined;
  devicesWithSerial?(serial: string): NVMeDevice[];
}

/**
 * Why partition `p` (a placed copy or partition) drains: "drain of node <n>" when its storage
 * node drains, "drain of device <d>" when its drive does; undefined when neither does.
 */
export function copyDrain(p: NVMePartition, view: DrainView): string | undefined {
  const n = p.spec.nodeName;
  if (!n) return undefined;
  if (isDraining(view.node(n))) return `drain of node ${n}`;
  const serial = p.spec.deviceSerial;
  if (!serial) return undefined;
  const d = view.devicesWithSerial?.(serial).find((x) => x.spec.nodeName === n);
  return isDraining(d) ? `drain of device ${d?.metadata.name}` : undefined;
}

/** What is still on a draining node or drive. */
export interface DrainLeft {
  /** Replica partitions (copies) still here, "namespace/name". */
  copies: string[];
  /** Replicated volumes served from here (node drain only). */
  served: string[];
  /** Single-copy partitions here: they cannot move (see docs/operations). */
  singleCopy: string[];
  /** Exports the agent still reports (node drain only; status.exportCount). */
  exports: number;
}

const key = (p: NVMePartition) => `${p.metadata.namespace}/${p.metadata.name}`;

/**
 * What of DISTORT is still on node `nodeName` (device undefined) or on drive `device` of it, from
 * every partition the manager sees. A partition being deleted still counts until it is gone.
 */
export function drainLeft(
  nodeName: string,
  device: NVMeDevice | undefined,
  partitions: Iterable<NVMePartition>,
  exportCount: number,
): DrainLeft {
  const left: DrainLeft = { copies: [], served: [], singleCopy: [], exports: device ? 0 : exportCount };
  for (const p of partitions) {
    if (p.spec.nodeName !== nodeName) continue;
    if ((p.spec.replicas ?? 1) > 1) {
      if (!device) left.served.push(key(p));
      continue;
    }
    if (device && p.spec.deviceSerial !== device.spec.serial) continue;
    if (p.spec.replicaOf) left.copies.push(key(p));
    else left.singleCopy.push(key(p));
  }
  left.copies.sort();
  left.served.sort();
  left.singleCopy.sort();
  return left;
}

function listed(items: string[], max = 8): string {
  return items.length > max
    ? `${items.slice(0, max).join(", ")} and ${items.length - max} more`
    : items.join(", ");
}

export interface DrainOutcome {
  /** The Drained condition to hold, or undefined: leave the object alone (never drained). */
  condition?: ConditionInput;
  /** Events on the drained object. */
  events: { type: "Normal" | "Warning"; reason: string; note: string }[];
  /** Single-copy volumes to warn (once, when the drain starts being blocked by them). */
  blocked: string[];
}

/**
 * The Drained condition of `obj` (a node record or a device) given what is `left` on it. Only an
 * object that drains, or that carries a Drained condition from an earlier drain, gets one. Pure.
 */
export function decideDrained(
  obj: RDMAStorageNode | NVMeDevice,
  what: string,
  left: DrainLeft,
): DrainOutcome {
  const out: DrainOutcome = { events: [], blocked: [] };
  const had = findCondition(obj.status?.conditions ?? [], DRAINED);
  const generation = obj.metadata.generation;
  if (!isDraining(obj)) {
    if (!had || had.reason === DrainReasons.NotDraining) return out;
    out.condition = {
      type: DRAINED,
      status: "False",
      reason: DrainReasons.NotDraining,
      message: `${what} is not draining (spec.drain is not true)`,
      observedGeneration: generation,
    };
    if (had.status !== "True")
      out.events.push({ type: "Normal", reason: "DrainStopped", note: `drain of ${what} stopped` });
    return out;
  }
  const parts: string[] = [];
  if (left.copies.length) parts.push(`copies ${listed(left.copies)} (being replaced elsewhere first)`);
  if (left.served.length) parts.push(`served volumes ${listed(left.served)} (handed over to another node)`);
  if (left.singleCopy.length)
    parts.push(`single-copy volumes ${listed(left.singleCopy)} (cannot move: delete or migrate them)`);
  if (left.exports > 0) parts.push(`${left.exports} export(s) the agent still reports`);
  const n = left.copies.length + left.served.length + left.singleCopy.length;
  if (parts.length === 0) {
    out.condition = {
      type: DRAINED,
      status: "True",
      reason: DrainReasons.Drained,
      message: `nothing of DISTORT is left on ${what}`,
      observedGeneration: generation,
    };
    if (had?.status !== "True")
      out.events.push({
        type: "Normal",
        reason: "DrainCompleted",
        note: `${what} drained: nothing left on it`,
      });
    return out;
  }
  const reason = left.singleCopy.length ? DrainReasons.SingleCopyVolumes : DrainReasons.Draining;
  out.condition = {
    type: DRAINED,
    status: "False",
    reason,
    message: `${n} left: ${parts.join("; ")}`.slice(0, 1024),
    observedGeneration: generation,
  };
  if (!had || had.reason === DrainReasons.NotDraining || had.status === "True")
    out.events.push({
      type: "Normal",
      reason: "DrainStarted",
      note: `drain of ${what} started: ${n} left (${parts.join("; ")})`.slice(0, 1024),
    });
  if (reason === DrainReasons.SingleCopyVolumes && had?.reason !== DrainReasons.SingleCopyVolumes) {
    out.events.push({
      type: "Warning",
      reason: "DrainBlocked",
      note: `drain of ${what} cannot finish: single-copy volumes ${listed(left.singleCopy)} cannot move`,
    });
    out.blocked = left.singleCopy;
  }
  return out;
}
