// The pure core of serving a replicated volume (an NVMePartition with spec.replicas > 1) on the
// node its spec.nodeName names: which copies the raid1 is built from, whether each can be reached
// yet, and what to create or tear down. No I/O; the partition controller carries it out through
// agent/nexus/assembler.ts and the SPDK backend's export and ACL code.
//
// Only copies the manager holds current are ever used: a status.replicas entry that is Online or
// Degraded with generation == status.dataGeneration. A copy behind the generation missed writes;
// reading it could return old data, so it is never attached, whatever its partition says.
import type { NVMePartition, ReplicaStatus } from "../../api/index.ts";
import { roundUpToUnit } from "../../lib/units.ts";
import { nexusBdevFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import type { QosLimits, Transport } from "../backends/types.ts";
import { blockedByAttachments, hasCleanupFinalizer, qosLimitsOf, type Why } from "../partitions/decide.ts";
import { externalIdFor, nqnFor, serialNumberFor } from "../partitions/identity.ts";
import { nexusControllerNameFor, nexusRaidUuidFor } from "./identity.ts";

/** Replica states whose copy holds every acknowledged write when its generation is current. */
const CURRENT_STATES: ReadonlySet<ReplicaStatus["state"]> = new Set(["Online", "Degraded"]);

/** Whether `p` is a replicated volume (served by a nexus rather than carved from a drive). */
export function isReplicatedVolume(p: NVMePartition): boolean {
  return (p.spec.replicas ?? 1) > 1;
}

/**
 * The copies of `v` the manager holds current: Online or Degraded at exactly
 * status.dataGeneration, with a UID. None before the manager declared a data generation.
 */
export function currentCopies(v: NVMePartition): ReplicaStatus[] {
  const gen = v.status?.dataGeneration;
  if (gen === undefined) return [];
  return (v.status?.replicas ?? []).filter(
    (r) => r.uid !== undefined && CURRENT_STATES.has(r.state) && r.generation === gen,
  );
}

/** How the serving node reaches one copy: its export, as the copy's own agent reported it. */
export interface CopyEndpoint {
  /** The copy partition's name and UID. */
  name: string;
  uid: string;
  /** The bdev_nvme controller name the nexus attaches it under. */
  controller: string;
  trtype: "TCP" | "RDMA";
  adrfam: "IPv4" | "IPv6";
  traddr: string;
  trsvcid: string;
  /** The copy's subsystem NQN: derived from its UID, and equal to what its status reports. */
  subnqn: string;
  /** The subsystem serial number its agent gives it: checked on the attached controller. */
  serialNumber: string;
}

/** Everything the serving node makes for a replicated volume. */
export interface NexusPlan {
  externalId: string;
  /** The volume's own subsystem NQN (consumers connect here, as to any partition). */
  nqn: string;
  /** The raid1 bdev's name and UUID (the UUID is the exported namespace's too). */
  raidBdev: string;
  raidUuid: string;
  /** The host NQN this node presents to the copies' subsystems. */
  hostNqn: string;
  /** The copies the raid is built from, in status.replicas order. */
  members: CopyEndpoint[];
  /**
   * Slots a raid made now gets: the volume's copies (spec.replicas) plus one spare, so that a copy
   * not current at creation, or a drain's replacement beside every copy, can join later through a
   * rebuild (SPDK adds a base bdev only into an empty slot). Default: the members, at least two.
   */
  slots?: number;
  /** Transport of the volume's own export. */
  transport: Transport;
  /** spec.sizeBytes rounded up as a partition is carved (what the volume asks to hold). */
  sizeBytes: number;
  qos: QosLimits;
}

/** What deleting a replicated volume removes from this node's target. */
export interface NexusTeardown {
  nqn: string;
  raidBdev: string;
  /** Controllers to detach: one per copy the volume's status has ever named (by UID). */
  controllers: string[];
}

export interface NexusObserved {
  volume: NVMePartition;
  nodeName: string;
  /** This agent serves the SPDK backend (the only one with a raid1 to build from). */
  spdk: boolean;
  /** The volume's own attachment records (consumers), by name. */
  attachments: readonly string[];
  /**
   * The partition of each current copy (currentCopies), by name, as read from the API server;
   * null when there is none. Only read while the volume is live.
   */
  copies?: ReadonlyMap<string, NVMePartition | null>;
}

export type NexusDecision =
  | { action: "ignore"; why: string }
  | { action: "add-finalizer" }
  | { action: "wait"; why: Why }
  | { action: "refuse"; why: Why }
  | { action: "block-deletion"; why: Why }
  | { action: "assemble"; plan: NexusPlan }
  | { action: "teardown"; teardown: NexusTeardown }
  | { action: "done" };

/** Ready reasons the nexus reports while it waits. */
export const NEXUS_REASONS = {
  notSpdk: "ReplicasNeedSpdk",
  noGeneration: "ReplicasPending",
  noCurrent: "NoCurrentReplica",
  tooFew: "TooFewCurrentReplicas",
  notReady: "ReplicasNotReady",
} as const;

/**
 * How the serving node reaches the copy of status entry `entry` (which has a UID), read from its
 * partition `copy`; or the problem that keeps it from being reached yet.
 */
export function endpointOf(
  entry: ReplicaStatus,
  copy: NVMePartition | null | undefined,
  volumeUid: string,
): { endpoint: CopyEndpoint; problem?: undefined } | { endpoint?: undefined; problem: string } {
  const uid = entry.uid as string;
  if (!copy) return { problem: "not found" };
  if (copy.metadata.uid !== uid) return { problem: `is another incarnation (uid ${copy.metadata.uid})` };
  if (copy.spec.replicaOf?.uid !== volumeUid)
    return { problem: "does not name this volume in spec.replicaOf" };
  if (copy.metadata.deletionTimestamp) return { problem: "is being deleted" };
  const s = copy.status;
  if (s?.state !== "Exported") return { problem: `is ${s?.state ?? "Pending"}, not Exported` };
  const subnqn = nqnFor(externalIdFor(uid));
  // The NQN is derived, never taken from status; a status that disagrees is not trusted at all.
  if (s.nqn !== subnqn) return { problem: `reports NQN ${s.nqn ?? "(none)"}, expected ${subnqn}` };
  if (!s.portalIP || s.portalPort === undefined || !s.transport)
    return { problem: "reports no portal (address, port, transport)" };
  const endpoint: CopyEndpoint = {
    name: copy.metadata.name,
    uid,
    controller: nexusControllerNameFor(uid),
    trtype: s.transport === "tcp" ? "TCP" : "RDMA",
    adrfam: s.portalIP.includes(":") ? "IPv6" : "IPv4",
    traddr: s.portalIP,
    trsvcid: String(s.portalPort),
    subnqn,
    serialNumber: serialNumberFor(externalIdFor(uid)),
  };
  return { endpoint };
}

/**
 * Decides the next step for replicated volume `o.volume` on this node. Pure and total. Deletion
 * wins; a live volume is served only by an SPDK agent, once its finalizer is on, from at least two
 * current copies that are all Exported at the portals their agents report.
 */
export function decideNexus(o: NexusObserved): NexusDecision {
  const v = o.volume;
  if (!v.spec.nodeName) return { action: "ignore", why: "no serving node chosen yet" };
  if (v.spec.nodeName !== o.nodeName) return { action: "ignore", why: `served by ${v.spec.nodeName}` };
  const uid = v.metadata.uid;
  if (!uid) return { action: "ignore", why: "no UID yet" };
  const hasFinalizer = hasCleanupFinalizer(v);
  const externalId = externalIdFor(uid);
  const nqn = nqnFor(externalId);
  const raidBdev = nexusBdevFor(externalId);
  const spdkWhy: Why = {
    reason: NEXUS_REASONS.notSpdk,
    message: `a replicated volume is served by an SPDK raid1 over its copies, and this agent on ${o.nodeName} serves no spdk backend (the kernel nvmet backend has no RAID)`,
  };

  if (v.metadata.deletionTimestamp) {
    if (!hasFinalizer) return { action: "done" };
    const blocked = blockedByAttachments(o.attachments);
    if (blocked) return blocked;
    if (!o.spdk) return { action: "wait", why: spdkWhy };
    const uids = [...new Set((v.status?.replicas ?? []).flatMap((r) => (r.uid ? [r.uid] : [])))];
    return {
      action: "teardown",
      teardown: { nqn, raidBdev, controllers: uids.map(nexusControllerNameFor).sort() },
    };
  }

  // Refused before the finalizer: an agent that cannot serve it leaves nothing to clean.
  if (!o.spdk || (v.spec.backend ?? "spdk") !== "spdk") return { action: "refuse", why: spdkWhy };
  if (!hasFinalizer) return { action: "add-finalizer" };

  const gen = v.status?.dataGeneration;
  if (gen === undefined) {
    return {
      action: "wait",
      why: {
        reason: NEXUS_REASONS.noGeneration,
        message:
          "the manager has not declared the copies current yet (no status.dataGeneration): nothing is served before it has",
      },
    };
  }
  const current = currentCopies(v);
  if (current.length === 0) {
    return {
      action: "wait",
      why: {
        reason: NEXUS_REASONS.noCurrent,
        message: `no copy holds data generation ${gen}: the volume is not served, since any copy left would lose acknowledged writes`,
      },
    };
  }
  // A volume that serves keeps serving on what is left (its raid runs degraded); a new one, or one
  // whose raid is gone, starts only from two current copies.
  if (current.length < 2 && (v.status?.state !== "Exported" || current.length === 0)) {
    return {
      action: "wait",
      why: {
        reason: NEXUS_REASONS.tooFew,
        message: `only ${current.map((c) => c.name).join(", ")} holds data generation ${gen}; the raid1 is built from at least two current copies (a degraded start is not supported yet)`,
      },
    };
  }
  const members: CopyEndpoint[] = [];
  const problems: string[] = [];
  for (const entry of current) {
    const r = endpointOf(entry, o.copies?.get(entry.name), uid);
    if (r.endpoint) members.push(r.endpoint);
    else problems.push(`${entry.name} ${r.problem}`);
  }
  if (problems.length > 0) {
    return {
      action: "wait",
      why: {
        reason: NEXUS_REASONS.notReady,
        message: `waiting for replica(s): ${problems.join("; ")}`.slice(0, 1024),
      },
    };
  }
  return {
    action: "assemble",
    plan: {
      externalId,
      nqn,
      raidBdev,
      raidUuid: nexusRaidUuidFor(uid),
      hostNqn: nexusHostNqnFor(o.nodeName),
      members,
      // One slot more than the volume's copies: the spare a replacement copy joins (a drain
      // rebuilds it while the copy it replaces still serves) before the old one is retired.
      slots: Math.max(2, (v.spec.replicas ?? members.length) + 1, members.length),
      transport: v.spec.targetOptions?.transport ?? "rdma",
      sizeBytes: roundUpToUnit(v.spec.sizeBytes),
      qos: qosLimitsOf(v),
    },
  };
}
