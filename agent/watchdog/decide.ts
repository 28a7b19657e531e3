// The target watchdog's decision, pure: from what the lease file read gave, the last lease it
// validly read and the clock, which subsystems must be fenced now; and from a subsystem's
// listeners, which of them still need their ANA state set inaccessible. It never decides to set
// anything optimized: only the agent lifts a fence.
import type { Lease, LeaseRead } from "./lease.ts";

export interface WatchdogDecision {
  /** The lease to remember for the next poll (the last valid one). */
  remembered: Lease | undefined;
  /** Subsystems to fence now; empty: nothing to do. */
  fence: string[];
  /** The lease the fence is for (its heartbeat and deadline), when `fence` is not empty. */
  expired?: Lease;
  /** A line for the log when the file was malformed (then `remembered` is what was acted on). */
  malformed?: string;
}

/**
 * One poll. A missing file: nothing to do (no agent has served here, or it never wrote one). A
 * malformed file: the last valid lease stands. A valid one replaces it. Past the standing lease's
 * fenceAtMs, every subsystem it lists is to be fenced.
 */
export function decideWatchdog(o: {
  read: LeaseRead;
  remembered: Lease | undefined;
  nowMs: number;
}): WatchdogDecision {
  if (o.read.kind === "missing") return { remembered: o.remembered, fence: [] };
  const lease = o.read.kind === "valid" ? o.read.lease : o.remembered;
  const malformed = o.read.kind === "malformed" ? o.read.why : undefined;
  const base = { remembered: lease, ...(malformed !== undefined ? { malformed } : {}) };
  if (!lease || lease.fenceAtMs === undefined || lease.nqns.length === 0 || o.nowMs <= lease.fenceAtMs)
    return { ...base, fence: [] };
  return { ...base, fence: [...lease.nqns], expired: lease };
}

/** A listener as nvmf_subsystem_get_listeners lists it (the fields this needs). */
export interface ListenerAna {
  address: { trtype: string; adrfam?: string; traddr: string; trsvcid?: string };
  ana_states?: readonly { ana_group: number; ana_state: string }[];
}

/**
 * The listeners of a subsystem to set inaccessible: those with any ANA group in another state.
 * `noAna` lists listeners that report no ANA state (a subsystem made without ana_reporting),
 * which ANA cannot fence.
 */
export function listenersToFence(listeners: readonly ListenerAna[]): {
  set: ListenerAna["address"][];
  noAna: ListenerAna["address"][];
} {
  const set: ListenerAna["address"][] = [];
  const noAna: ListenerAna["address"][] = [];
  for (const l of listeners) {
    if (!l.ana_states || l.ana_states.length === 0) noAna.push(l.address);
    else if (l.ana_states.some((g) => g.ana_state !== "inaccessible")) set.push(l.address);
  }
  return { set, noAna };
}
