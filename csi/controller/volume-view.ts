// How an NVMePartition looks through CSI: its volume context (from the export status and the
// recorded request), its capacity, its health, and whether a CreateVolume waiting on it is done,
// failed or still waiting. Pure.
import * as v from "valibot";
import type { NVMePartition } from "../../api/index.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { roundUpToUnit as roundUp } from "../../lib/units.ts";
import { formatPortals, VolumeContextKeys, VolumeContextSchema } from "../../lib/volume-context.ts";
import { aborted, csiError } from "../errors.ts";
import type { VolumeRecord } from "./fingerprint.ts";

/** Scheduled=False reasons (manager placement) that mean "no room that fits", not "try again soon". */
const NO_ROOM = new Set(["InsufficientCapacity", "TopologyMismatch", "NoClaimedDevice", "BackendLocked"]);

/**
 * The volume_context for an exported partition, or undefined while it is not exported (no NQN or
 * portal yet, or a status that does not make a context the node could parse). Reconnect settings
 * come from the recorded request; partitions made by hand have none.
 */
export function volumeContextOf(
  p: NVMePartition,
  record: VolumeRecord | undefined,
): Record<string, string> | undefined {
  const s = p.status;
  if (s?.state !== "Exported" || !s.nqn || !s.portalIP || !s.portalPort) return undefined;
  const ctx: Record<string, string> = {
    [VolumeContextKeys.nqn]: s.nqn,
    [VolumeContextKeys.portalIP]: s.portalIP,
    [VolumeContextKeys.portalPort]: String(s.portalPort),
    [VolumeContextKeys.transport]: s.transport ?? p.spec.targetOptions?.transport ?? "rdma",
  };
  // Several listeners: every one is a path the node connects (multipath). Only what the agent
  // read back from the target is listed, the primary included, so the list stands on its own.
  if (s.portals && s.portals.length > 1) ctx[VolumeContextKeys.portals] = formatPortals(s.portals);
  const r = record?.params;
  if (r?.ctrlLossTmo !== undefined) ctx[VolumeContextKeys.ctrlLossTmo] = String(r.ctrlLossTmo);
  if (r?.reconnectDelay !== undefined) ctx[VolumeContextKeys.reconnectDelay] = String(r.reconnectDelay);
  if (r?.fastIoFailTmo !== undefined) ctx[VolumeContextKeys.fastIoFailTmo] = String(r.fastIoFailTmo);
  if (r?.mkfsOptions !== undefined) ctx[VolumeContextKeys.mkfsOptions] = r.mkfsOptions;
  // The node parses with the same schema: never hand out a context it would refuse.
  return v.is(VolumeContextSchema, ctx) ? ctx : undefined;
}

/**
 * A replicated volume's portals for the publish context: where it is served now, then each of
 * its copies' nodes (which stand by for it under the same NQN and port), without repeats; none
 * for a volume of one copy or one not exported yet. `copies`: the partitions naming it in
 * spec.replicaOf.
 */
export function replicatedPortalsOf(
  volume: NVMePartition,
  copies: readonly NVMePartition[],
): { address: string; port: number }[] {
  if ((volume.spec.replicas ?? 1) <= 1) return [];
  const s = volume.status;
  if (s?.state !== "Exported" || !s.portalIP || !s.portalPort) return [];
  const out = [{ address: s.portalIP, port: s.portalPort }, ...(s.portals ?? [])];
  const uid = volume.metadata.uid;
  for (const c of [...copies].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name))) {
    const cs = c.status;
    if (c.spec.replicaOf?.uid !== uid || c.metadata.deletionTimestamp || cs?.state !== "Exported") continue;
    // The standby listens on the copy node's portals at the volume's port.
    const addresses = cs.portals?.length
      ? cs.portals.map((x) => x.address)
      : cs.portalIP
        ? [cs.portalIP]
        : [];
    for (const address of addresses) out.push({ address, port: s.portalPort });
  }
  return out
    .map(({ address, port }) => ({ address, port }))
    .filter((p, i, all) => all.findIndex((q) => q.address === p.address && q.port === p.port) === i);
}

/** Bytes the volume holds: what the volume manager allocated, else the rounded request. */
export function capacityOf(p: NVMePartition): number {
  return p.status?.allocatedBytes ?? roundUp(p.spec.sizeBytes);
}

function cond(p: NVMePartition, type: string) {
  return findCondition(p.status?.conditions ?? [], type);
}

/** One line on where the partition stands, for timeout messages and volume conditions. */
export function progressOf(p: NVMePartition | undefined): string {
  if (!p) return "the NVMePartition is not visible yet";
  const parts = [`state ${p.status?.state ?? "(none)"}`];
  if (p.spec.nodeName) parts.push(`placed on ${p.spec.nodeName}`);
  for (const t of ["Scheduled", "Ready"]) {
    const c = cond(p, t);
    if (c) parts.push(`${t}=${c.status} ${c.reason}${c.message ? `: ${c.message}` : ""}`);
  }
  if (p.metadata.deletionTimestamp) parts.push("being deleted");
  return parts.join("; ");
}

/** One adverse health condition, as CSI's VolumeHealthEntry carries it. */
export interface HealthIssue {
  status: "INACCESSIBLE";
  /** CamelCase, from the partition's condition when it has one. */
  reason: string;
  message: string;
}

/**
 * The controller's view of a volume's health (CSI v1.13 VolumeHealth, successor of the removed
 * VolumeCondition): none while exported and Ready; INACCESSIBLE otherwise — not exported yet or
 * any more, failed, or being deleted — with the agent's or manager's reason.
 */
export function volumeHealth(p: NVMePartition): HealthIssue[] {
  if (p.metadata.deletionTimestamp)
    return [{ status: "INACCESSIBLE", reason: "Deleting", message: progressOf(p) }];
  const ready = cond(p, "Ready");
  const state = p.status?.state;
  if (state === "Exported" && ready?.status === "True") return [];
  const reason =
    ready && ready.status !== "True" && ready.reason
      ? ready.reason
      : state === "Failed"
        ? "Failed"
        : state === "Exported"
          ? "NotReady"
          : "NotExported";
  return [{ status: "INACCESSIBLE", reason, message: progressOf(p) }];
}

/**
 * CreateVolume's verdict on the cached partition of UID `uid`: the partition once exported,
 * undefined to keep waiting, or a throw:
 * - replaced by another object of the same name, or being deleted: ABORTED (the CO retries);
 * - state Failed (the agent refused it, e.g. its drive is locked to the other backend):
 *   UNAVAILABLE with the agent's reason; kept retryable so the CO still owns a volume to delete;
 * - not placeable (Scheduled=False for lack of a fitting device, judged on the current
 *   generation): RESOURCE_EXHAUSTED, which also lets a WaitForFirstConsumer claim reschedule.
 */
export function createVerdict(p: NVMePartition | undefined, uid: string): NVMePartition | undefined {
  if (!p) return undefined;
  if (p.metadata.uid !== uid)
    throw aborted(`NVMePartition ${p.metadata.name} was replaced while waiting for it`);
  if (p.metadata.deletionTimestamp) throw aborted(`NVMePartition ${p.metadata.name} is being deleted`);
  const state = p.status?.state;
  if (state === "Exported" && volumeContextOf(p, undefined)) return p;
  if (state === "Failed") {
    const ready = cond(p, "Ready");
    throw csiError(
      "unavailable",
      `NVMePartition ${p.metadata.name} failed${p.spec.nodeName ? ` on ${p.spec.nodeName}` : ""}: ${ready ? `${ready.reason}: ${ready.message}` : "no reason given"}`,
      { reason: ready?.reason },
    );
  }
  const scheduled = cond(p, "Scheduled");
  if (
    !p.spec.nodeName &&
    scheduled?.status === "False" &&
    NO_ROOM.has(scheduled.reason) &&
    (scheduled.observedGeneration === undefined || scheduled.observedGeneration === p.metadata.generation)
  ) {
    throw csiError(
      "exhausted",
      `no storage for NVMePartition ${p.metadata.name}: ${scheduled.reason}: ${scheduled.message}`,
      {
        reason: scheduled.reason,
      },
    );
  }
  return undefined;
}
