// The pure core of rebuilding a copy of a replicated volume on its serving node: which
// non-current copies start a rebuild (admission, within the node's cap), which running rebuilds
// progressed, finished or were interrupted. No I/O; agent/nexus/rebuild-driver.ts carries it out.
//
// A copy joins the current set only through a rebuild this agent watched from its start to its
// end without the copy ever leaving the raid: a rebuild whose start this agent did not see (it
// restarted) or whose member left the raid or lost its controller counts for nothing, and the
// copy starts again from zero.
//
// With cluster grants (the default), a rebuild also needs one of the cluster's rebuild slots:
// the agent asks for it in the volume's status.rebuildSlot once the copy could start and the
// node has room (requests count against the node's cap), starts only under the manager's grant,
// and gives the slot back when the rebuild finishes or fails.
import type { NVMePartition, RebuildProgress, RebuildSlot, ReplicaStatus } from "../../api/index.ts";
import type { RaidBdev } from "../../lib/spdk/schemas.ts";
import { type CopyEndpoint, currentCopies, endpointOf } from "./decide.ts";
import { nexusControllerNameFor, nexusMemberBdevFor } from "./identity.ts";

/** A rebuild this agent started, kept in memory for as long as it runs. */
export interface RebuildSession {
  copyName: string;
  copyUid: string;
  controller: string;
  /** The copy's namespace bdev, the raid member the rebuild writes. */
  bdev: string;
}

export interface RebuildObserved {
  volume: NVMePartition;
  /** The volume's raid as ensureRaid left it this pass. */
  raid: RaidBdev;
  /** Bytes the raid holds, and its block size. */
  raidBytes: number;
  blockSize: number;
  /** This agent's running rebuilds of this volume, by copy UID. */
  sessions: ReadonlyMap<string, RebuildSession>;
  /** Rebuilds this agent runs for its other volumes (they count against the node's cap). */
  runningElsewhere: number;
  /** Most rebuilds this node runs at once. */
  nodeCap: number;
  /** Controllers of this node that carry I/O now (bdev_nvme state enabled). */
  controllersUp: ReadonlySet<string>;
  /** The partition of each non-current copy, by name (null: not found). */
  copies: ReadonlyMap<string, NVMePartition | null>;
  /**
   * Set when a rebuild needs the manager's cluster-wide grant (status.rebuildSlot); absent: the
   * node's cap alone decides (an agent run without a manager).
   */
  grant?: {
    /** This agent's node: the asker a slot must name. */
    node: string;
    /** Slots this node asked for or holds on its other volumes without a rebuild running yet. */
    requestedElsewhere: number;
    /** Now, as a slot's requestedAt. */
    nowIso: string;
  };
}

/** Why a copy waits until the manager grants a slot it was not told about yet. */
export const WAITS_FOR_GRANT = "waits for the manager's cluster-wide rebuild grant";

export type RebuildStep =
  /** Record the copy Rebuilding, then attach it and add it to the raid. */
  | { kind: "start"; entry: ReplicaStatus; endpoint: CopyEndpoint }
  /** Record how far the running rebuild is. */
  | { kind: "progress"; session: RebuildSession; progress: RebuildProgress }
  /** The rebuild finished with the copy in the raid all along: record it Online, current. */
  | { kind: "complete"; session: RebuildSession }
  /**
   * The rebuild counts for nothing: take the copy out of the raid (detach its controller) and
   * record it Stale with `why`; a later pass starts it again from zero.
   */
  | { kind: "abort"; copyName: string; copyUid: string; controller: string; why: string }
  /**
   * A copy that could rebuild waits (for a slot, for its export): recorded Stale with `why`;
   * `release` also gives back the volume's slot held for it (it was granted, but cannot start).
   */
  | { kind: "wait"; copyName: string; copyUid: string; why: string; release?: boolean }
  /** Ask for a cluster rebuild slot (status.rebuildSlot = `slot`) and wait with `why`. */
  | { kind: "request"; copyName: string; copyUid: string; slot: RebuildSlot; why: string };

/** The slot of `v` when it names `node` as asker and the copy `copyUid`, granted or not. */
export function slotOf(v: NVMePartition, node: string, copyUid: string): RebuildSlot | undefined {
  const s = v.status?.rebuildSlot;
  return s && s.node === node && s.uid === copyUid ? s : undefined;
}

/** States a copy behind the data generation may be in while the serving node watches it. */
const BEHIND: ReadonlySet<ReplicaStatus["state"]> = new Set(["Stale", "Faulted", "Rebuilding"]);

/**
 * The entries of `v` a rebuild is for: they have a UID, are not current, and are Stale, Faulted
 * or Rebuilding (Pending copies are not exported yet; the manager makes an exported one Stale),
 * and are not retiring (a drain removes them).
 */
export function rebuildCandidates(v: NVMePartition): ReplicaStatus[] {
  const current = new Set(currentCopies(v).map((c) => c.name));
  return (v.status?.replicas ?? []).filter(
    // A retiring copy (a drain) is lowered on purpose and deleted next: never rebuilt.
    (r) => r.uid !== undefined && !current.has(r.name) && BEHIND.has(r.state) && !r.retiring,
  );
}

/**
 * Decides, per non-current copy of `o.volume`, what the serving agent does this pass. Pure and
 * total. At most one rebuild runs per raid (SPDK runs one background process per raid) and at
 * most o.nodeCap on the node; a copy that is not Exported at its reported portal waits.
 */
export function decideRebuilds(o: RebuildObserved): RebuildStep[] {
  const v = o.volume;
  const volumeUid = v.metadata.uid as string;
  const steps: RebuildStep[] = [];
  const slots = o.raid.base_bdevs_list;
  const process = o.raid.process;
  let running = o.runningElsewhere + o.sessions.size;
  let raidBusy = process !== undefined;
  const candidates = rebuildCandidates(v);
  // Running sessions first: they free the raid (and slots) for waiting copies.
  const waiting: ReplicaStatus[] = [];
  for (const e of candidates) {
    const uid = e.uid as string;
    const s = o.sessions.get(uid);
    const bdev = s?.bdev;
    const slot = bdev ? slots.find((b) => b.name === bdev) : undefined;
    if (s) {
      if (!slot?.is_configured) {
        steps.push(abort(s, `left raid ${o.raid.name} during its rebuild: it starts again from zero`));
        running--;
      } else if (o.grant && !slotOf(v, o.grant.node, s.copyUid)?.grantedAt) {
        steps.push(
          abort(
            s,
            "lost its cluster rebuild slot during its rebuild (the manager released it): it starts again from zero",
          ),
        );
        running--;
      } else if (!o.controllersUp.has(s.controller)) {
        steps.push(
          abort(s, `lost its controller ${s.controller} during its rebuild: it starts again from zero`),
        );
        running--;
      } else if (process?.target === s.bdev) {
        const blocks = Math.min(process.progress.blocks, o.raidBytes / Math.max(1, o.blockSize));
        steps.push({
          kind: "progress",
          session: s,
          progress: {
            percent: Math.min(100, process.progress.percent),
            bytesDone: blocks * o.blockSize,
            bytesTotal: o.raidBytes,
          },
        });
        raidBusy = true;
      } else {
        steps.push({ kind: "complete", session: s });
        running--;
      }
      continue;
    }
    const controller = nexusControllerOf(e);
    const inRaid = slots.some((b) => b.name === nexusMemberBdevFor(controller));
    if (inRaid) {
      // In the raid without a rebuild this agent watched (it restarted, or examine re-added it).
      steps.push({
        kind: "abort",
        copyName: e.name,
        copyUid: uid,
        controller,
        why: `found in raid ${o.raid.name} without a rebuild this serving node watched from its start: it starts again from zero`,
      });
      continue;
    }
    waiting.push(e);
  }
  for (const e of waiting) {
    const uid = e.uid as string;
    const r = endpointOf(e, o.copies.get(e.name), volumeUid);
    if (!r.endpoint) {
      // A slot asked for or granted to a copy that cannot start any more goes back to the cluster.
      const held = o.grant !== undefined && slotOf(v, o.grant.node, uid) !== undefined;
      steps.push({
        kind: "wait",
        copyName: e.name,
        copyUid: uid,
        why: `waits to rebuild: ${e.name} ${r.problem}`,
        ...(held ? { release: true } : {}),
      });
      continue;
    }
    if (raidBusy) {
      steps.push({
        kind: "wait",
        copyName: e.name,
        copyUid: uid,
        why: `waits to rebuild: raid ${o.raid.name} runs another rebuild (one at a time per raid)`,
      });
      continue;
    }
    const nodeFull = {
      kind: "wait" as const,
      copyName: e.name,
      copyUid: uid,
      why: `waits for a rebuild slot on serving node ${v.spec.nodeName}: ${running} of ${o.nodeCap} running`,
    };
    if (o.grant) {
      const step = underGrant(o, e, running, nodeFull);
      steps.push(step ?? { kind: "start", entry: e, endpoint: r.endpoint });
      if (step === undefined) running++;
      // One slot per volume: whatever this copy got, the volume's other copies come after it.
      raidBusy = true;
      continue;
    }
    if (running >= o.nodeCap) {
      steps.push(nodeFull);
      continue;
    }
    steps.push({ kind: "start", entry: e, endpoint: r.endpoint });
    running++;
    raidBusy = true;
  }
  return steps;
}

/**
 * For copy `e`, ready to start, under cluster grants: undefined when it may start now (the volume's
 * slot is granted to it and this node), else the step that asks for the slot or says why it waits.
 */
function underGrant(
  o: RebuildObserved,
  e: ReplicaStatus,
  running: number,
  nodeFull: Extract<RebuildStep, { kind: "wait" }>,
): RebuildStep | undefined {
  const g = o.grant as NonNullable<RebuildObserved["grant"]>;
  const uid = e.uid as string;
  const wait = (why: string): RebuildStep => ({ kind: "wait", copyName: e.name, copyUid: uid, why });
  const slot = o.volume.status?.rebuildSlot;
  if (slot && slot.node !== g.node)
    return wait(
      `RebuildQueued: the volume's rebuild slot is still held for ${slot.node}; the manager releases it`,
    );
  if (slot && slot.uid !== uid)
    return wait(`RebuildQueued: the volume's rebuild slot is for ${slot.replica} (one rebuild at a time)`);
  if (slot?.grantedAt) return running >= o.nodeCap ? nodeFull : undefined;
  if (slot) return wait(`RebuildQueued: ${slot.message ?? WAITS_FOR_GRANT}`);
  // Asking reserves room on this node: a granted slot never waits for the node's cap.
  if (running + g.requestedElsewhere >= o.nodeCap)
    return g.requestedElsewhere > 0
      ? { ...nodeFull, why: `${nodeFull.why}, ${g.requestedElsewhere} more asked for` }
      : nodeFull;
  return {
    kind: "request",
    copyName: e.name,
    copyUid: uid,
    slot: { replica: e.name, uid, node: g.node, requestedAt: g.nowIso },
    why: `RebuildQueued: ${WAITS_FOR_GRANT}`,
  };
}

/**
 * The volume's rebuildSlot after `step` taken by `node`, or undefined when the step leaves it as
 * it is: a request sets it (only where none is held: never over another's), a completion, an
 * abort or a releasing wait removes it when it names that copy and this node ({ slot: undefined }).
 */
export function applySlotStep(
  current: RebuildSlot | undefined,
  node: string,
  step: RebuildStep,
): { slot: RebuildSlot | undefined } | undefined {
  if (step.kind === "request") return current ? undefined : { slot: step.slot };
  const uid =
    step.kind === "complete"
      ? step.session.copyUid
      : step.kind === "abort" || step.kind === "wait"
        ? step.copyUid
        : undefined;
  const releases =
    step.kind === "complete" || step.kind === "abort" || (step.kind === "wait" && step.release === true);
  if (!releases || !current || current.uid !== uid || current.node !== node) return undefined;
  return { slot: undefined };
}

function abort(s: RebuildSession, why: string): RebuildStep {
  return { kind: "abort", copyName: s.copyName, copyUid: s.copyUid, controller: s.controller, why };
}

function nexusControllerOf(e: ReplicaStatus): string {
  return nexusControllerNameFor(e.uid as string);
}

/**
 * The status a step asks for, applied to the latest `replicas` of a volume at data generation
 * `gen`: undefined when the entry is gone or another incarnation, or when the step no longer
 * applies (a completion is only recorded over a Rebuilding entry). A completion makes the copy
 * current at `gen`, the volume's generation at the time of the write: it was in the raid, taking
 * every write, all along.
 */
export function applyRebuildStep(
  replicas: readonly ReplicaStatus[],
  gen: number,
  step: RebuildStep,
): ReplicaStatus[] | undefined {
  const uid =
    step.kind === "start" ? step.entry.uid : "session" in step ? step.session.copyUid : step.copyUid;
  const i = replicas.findIndex((r) => r.uid === uid);
  const e = replicas[i];
  if (!e || (e.state !== "Stale" && e.state !== "Faulted" && e.state !== "Rebuilding")) return undefined;
  if (e.state !== "Rebuilding" && e.generation === gen) return undefined;
  let next: ReplicaStatus;
  switch (step.kind) {
    case "start":
      next = {
        ...e,
        state: "Rebuilding",
        message: `being rebuilt from a current copy to data generation ${gen}`,
      };
      delete next.rebuild;
      break;
    case "progress":
      if (e.state !== "Rebuilding") return undefined;
      next = { ...e, rebuild: step.progress };
      break;
    case "complete": {
      if (e.state !== "Rebuilding") return undefined;
      const { rebuild: _r, message: _m, ...rest } = e;
      next = { ...rest, state: "Online", generation: gen };
      break;
    }
    case "abort": {
      const { rebuild: _r, ...rest } = e;
      next = { ...rest, state: "Stale", message: step.why.slice(0, 1024) };
      break;
    }
    case "wait":
    case "request": {
      // A Faulted copy stays Faulted (its partition may be gone); a Rebuilding one is Stale again.
      const { rebuild: _r, ...rest } = e;
      next = {
        ...rest,
        state: e.state === "Rebuilding" ? "Stale" : e.state,
        message: step.why.slice(0, 1024),
      };
      break;
    }
  }
  const out = [...replicas];
  out[i] = next;
  return out;
}
