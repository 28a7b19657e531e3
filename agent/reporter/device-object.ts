// What the reporter writes on an NVMeDevice, as pure functions of the stored object and one
// observation: the spec of a new device, the spec fields an existing one may have updated (never
// nodeName or serial), and the status after the drive was seen or found missing by a complete scan.

import { API_VERSION, type Backend } from "../../api/common.ts";
import type { NVMeDevice, NVMeDeviceSpec, NVMeDeviceStatus } from "../../api/nvme-device.ts";
import { setCondition } from "../../lib/kube/conditions.ts";
import type { DiscoveredDevice } from "../discovery/inventory.ts";

/** Condition the reporter keeps on every NVMeDevice: is the drive in the node's inventory. */
export const PRESENT = "Present";

/** What one scan says about a device object of this node. */
export type DeviceObservation =
  | { readonly kind: "present"; readonly device: DiscoveredDevice }
  /** Missing from a complete scan; `why` is a skip reason (Mounted, Excluded...) when discovery gave one. */
  | { readonly kind: "absent"; readonly why?: string };

/** A new NVMeDevice for a discovered drive (status is written separately: the API ignores it on create). */
export function newDevice(name: string, node: string, d: DiscoveredDevice): NVMeDevice {
  return {
    apiVersion: API_VERSION,
    kind: "NVMeDevice",
    metadata: { name },
    spec: {
      nodeName: node,
      pciAddress: d.pciAddress,
      serial: d.serial,
      model: d.model,
      allocatableBytes: d.allocatableBytes,
      numaNode: d.numaNode,
    },
  };
}

/** True when the stored object is the one for this (node, serial); anything else is not ours to touch. */
export function identityMatches(obj: NVMeDevice, node: string, serial: string): boolean {
  return obj.spec.nodeName === node && obj.spec.serial === serial;
}

/** The fields the reporter keeps current on an existing device. */
export type MutableSpec = Pick<NVMeDeviceSpec, "pciAddress" | "model" | "allocatableBytes" | "numaNode">;

/**
 * The merge patch for `spec` to match the drive, or undefined when nothing changed. Only model,
 * capacity, NUMA node and PCI address (a drive moved to another slot keeps its identity, but
 * the agent must address it where it is now); nodeName and serial are identity and never change.
 */
export function specPatch(spec: NVMeDeviceSpec, d: DiscoveredDevice): Partial<MutableSpec> | undefined {
  const patch: Partial<MutableSpec> = {};
  if (spec.pciAddress !== d.pciAddress) patch.pciAddress = d.pciAddress;
  if (spec.model !== d.model) patch.model = d.model;
  if (spec.allocatableBytes !== d.allocatableBytes) patch.allocatableBytes = d.allocatableBytes;
  if (spec.numaNode !== d.numaNode) patch.numaNode = d.numaNode;
  return Object.keys(patch).length > 0 ? patch : undefined;
}

function presentCondition(d: DiscoveredDevice) {
  const where = d.spdk
    ? `SPDK controller ${d.spdk.controller}${d.spdk.bdev ? ` (bdev ${d.spdk.bdev})` : ""}`
    : `kernel controller ${d.kernel?.controller ?? "?"}${d.kernel?.blockDevice ? ` (/dev/${d.kernel.blockDevice})` : ""}`;
  return {
    type: PRESENT,
    status: "True" as const,
    reason: d.activeBackend === "spdk" ? "BoundToSpdk" : "BoundToKernel",
    message: `${where} at ${d.pciAddress}`,
  };
}

/**
 * The status after `obs`, from the latest stored object. Present: a device without status starts
 * Available; one the reporter had marked Unavailable returns to Claimed when it still holds a
 * claimRef, else Available; Available and Claimed (the manager's phases) are kept. Absent: phase
 * Unavailable, claimRef and every other field kept so the claim can resume when the drive returns.
 * `onlyBackend`: the one backend this node's agent serves. A present device with no activeBackend
 * yet is locked to it, so the manager never places a partition of the other backend where no
 * agent could serve it; an existing lock is never changed here.
 * Pure; returns a value equal to the stored status when nothing changes (the writer skips it).
 */
export function nextDeviceStatus(
  latest: NVMeDevice,
  obs: DeviceObservation,
  now: Date,
  onlyBackend?: Backend,
): NVMeDeviceStatus {
  const prev = latest.status;
  // A device the reporter has just created has no status yet; every other field is someone else's.
  const base: NVMeDeviceStatus = prev ?? { phase: "Available", reservations: [], conditions: [] };
  const generation = latest.metadata.generation;
  const gen = generation === undefined ? {} : { observedGeneration: generation };
  if (obs.kind === "present") {
    const phase =
      prev === undefined
        ? "Available"
        : prev.phase === "Unavailable"
          ? prev.claimRef
            ? "Claimed"
            : "Available"
          : prev.phase;
    return {
      ...base,
      phase,
      ...(onlyBackend && !base.activeBackend ? { activeBackend: onlyBackend } : {}),
      conditions: setCondition(prev?.conditions ?? [], { ...presentCondition(obs.device), ...gen }, now),
    };
  }
  const why = obs.why ?? "NotFound";
  return {
    ...base,
    phase: "Unavailable",
    conditions: setCondition(
      prev?.conditions ?? [],
      {
        type: PRESENT,
        status: "False",
        reason: why,
        message:
          why === "NotFound"
            ? "not found by a complete scan of kernel and SPDK controllers"
            : `left out by a complete scan (${why})`,
        ...gen,
      },
      now,
    ),
  };
}
