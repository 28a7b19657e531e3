// Failover of a replicated volume whose serving node is lost, as a pure decision over the volume,
// its copies' admissions (NVMeVolumeAttachments) and the storage nodes. The order is the safety:
// 1. choose the new serving node among the nodes of current copies that are alive;
// 2. fence: move the admission of every current copy on a live node to the new node's host, and
//    wait until each copy's agent reports it enforces it (status.observedAttachmentId): from then
//    on the old node's writes cannot reach those copies (the target drops a removed host's
//    connections at once);
// 3. record it: copies that could not be fenced (on the lost node, or on nodes that are down too)
//    stay at the old data generation and become Stale, the fenced ones move to the new generation;
// 4. only then name the new serving node in spec.nodeName, whose agent assembles the volume from
//    the copies at the new generation alone.
// Writes acknowledged by the old node reached every current copy (a copy leaves the set only once
// the API records it), so the fenced copies hold them all; nothing the old node writes afterwards
// lands on them. A crash between steps repeats from the first unfinished one: the generation is
// raised only while an unfenced copy is still recorded current, so never twice.
import type { NVMePartition, NVMeVolumeAttachment, ReplicaStatus } from "../../api/index.ts";
import {
  ACCEPT_DATA_LOSS_ANNOTATION,
  ACCEPT_NEWEST,
  DEFAULT_FAILOVER_AFTER_SECONDS,
  HANDOVER_ANNOTATION,
} from "../../api/index.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { heartbeatMs, nodeHealth } from "../node-health.ts";
import type { ReplicaView } from "./replica-core.ts";

export type FailoverStep =
  /** The serving node is alive (or none serves yet): nothing to do. */
  | { kind: "none" }
  /** Lost, and no current copy on a live node: the volume cannot be served without data loss. */
  | { kind: "stuck"; from: string; message: string }
  /** Move these copies' admissions to `to` (new attachment lifetimes). */
  | { kind: "fence"; from: string; to: string; moves: { attachment: string; copy: string; uid: string }[] }
  /** Admissions moved; waiting for the copies' agents to enforce them. */
  | { kind: "wait-fenced"; from: string; to: string; waiting: string[] }
  /** Every live current copy fenced: write the new generation (then serve from `to`). */
  | { kind: "promote"; from: string; to: string; dataGeneration: number; replicas: ReplicaStatus[] }
  /** The generation already says it: name the new serving node. */
  | { kind: "serve"; from: string; to: string };

export interface FailoverConfig {
  /** What a heartbeat-stale node means for placement; a live node must pass nodeHealth with it. */
  stalenessMs: number;
}

/**
 * A planned handover the serving node has carried out: storage.distort.io/handover-from names it
 * and it recorded status.releasedBy (it takes no more writes). Its proof does not rest on its
 * heartbeat: the agent wrote it after its export turned standby and its raid went.
 */
export function servingReleased(v: NVMePartition): boolean {
  const serving = v.spec.nodeName;
  return (
    serving !== undefined &&
    v.metadata.annotations?.[HANDOVER_ANNOTATION] === serving &&
    v.status?.releasedBy === serving
  );
}

/**
 * When the serving node counts as lost: no heartbeat for the volume's failoverAfterSeconds, or it
 * released the volume in a planned handover (the same fence, promote, serve sequence follows).
 */
export function servingNodeLost(v: NVMePartition, view: ReplicaView, nowMs: number): boolean {
  const serving = v.spec.nodeName;
  if (!serving) return false;
  if (servingReleased(v)) return true;
  const node = view.node(serving);
  const hb = node ? heartbeatMs(node) : undefined;
  const boundMs = (v.spec.failoverAfterSeconds ?? DEFAULT_FAILOVER_AFTER_SECONDS) * 1000;
  return hb === undefined || nowMs - hb > boundMs;
}

/**
 * Milliseconds from `nowMs` until the serving node of `v` would count as lost if no heartbeat
 * came meanwhile (at least 250 ms; a large number when nothing serves `v`).
 */
export function failoverDeadlineMs(v: NVMePartition, view: ReplicaView, nowMs: number): number {
  const serving = v.spec.nodeName;
  if (!serving || v.status?.dataGeneration === undefined) return Number.MAX_SAFE_INTEGER;
  const node = view.node(serving);
  const hb = node ? heartbeatMs(node) : undefined;
  if (hb === undefined) return 250;
  const boundMs = (v.spec.failoverAfterSeconds ?? DEFAULT_FAILOVER_AFTER_SECONDS) * 1000;
  return Math.max(250, hb + boundMs - nowMs + 100);
}

/**
 * The next failover step for `v`. `attachments` holds the copies' admission records as last read
 * (by name); a missing one has not been made (or was deleted).
 */
export function decideFailover(
  v: NVMePartition,
  attachments: ReadonlyMap<string, NVMeVolumeAttachment>,
  view: ReplicaView,
  nowMs: number,
  cfg: FailoverConfig,
): FailoverStep {
  const from = v.spec.nodeName;
  const g = v.status?.dataGeneration;
  if (!from || g === undefined || v.metadata.deletionTimestamp || !servingNodeLost(v, view, nowMs))
    return { kind: "none" };
  const entries = v.status?.replicas ?? [];
  const current = (e: ReplicaStatus) =>
    e.generation === g && (e.state === "Online" || e.state === "Degraded");
  const alive = (n: string | undefined) =>
    n !== undefined && n !== from && nodeHealth(n, view.node(n), nowMs, cfg.stalenessMs).ok;
  const live = entries.filter((e) => current(e) && alive(e.nodeName) && e.uid);
  if (live.length === 0) {
    const held = entries.filter(current).map((e) => `${e.name} on ${e.nodeName ?? "no node"}`);
    const stale = entries
      .filter((e) => !current(e) && e.uid && alive(e.nodeName) && e.generation >= 1)
      .map((e) => `${e.name} on ${e.nodeName} at generation ${e.generation}`);
    const choice =
      stale.length > 0
        ? `; stale copies on live nodes: ${stale.join(", ")}. To serve one and lose the writes it missed, annotate the volume ${ACCEPT_DATA_LOSS_ANNOTATION}=${ACCEPT_NEWEST} (or the copy's name)`
        : "";
    return {
      kind: "stuck",
      from,
      message: `serving node ${from} is lost and no current copy is on a live node (current: ${held.join(", ") || "none"}); the volume waits for one to come back${choice}`,
    };
  }
  // The new serving node: the first live current copy's node in index order, unless a failover
  // already chose one (some admission already names a live current copy's node).
  const hosts = new Map(live.map((e) => [nexusHostNqnFor(e.nodeName as string), e.nodeName as string]));
  const chosen = live
    .map((e) => attachments.get(attachmentNameFor(e.name, e.uid as string))?.spec.hostNQN)
    .map((h) => (h ? hosts.get(h) : undefined))
    .find((n) => n !== undefined);
  const to = chosen ?? (live[0]?.nodeName as string);
  const host = nexusHostNqnFor(to);

  const moves: { attachment: string; copy: string; uid: string }[] = [];
  const waiting: string[] = [];
  for (const e of live) {
    const name = attachmentNameFor(e.name, e.uid as string);
    const a = attachments.get(name);
    if (!a || a.spec.hostNQN !== host) moves.push({ attachment: name, copy: e.name, uid: e.uid as string });
    else if (a.status?.observedAttachmentId !== a.spec.attachmentId || a.metadata.deletionTimestamp)
      waiting.push(e.name);
  }
  if (moves.length > 0) return { kind: "fence", from, to, moves };
  if (waiting.length > 0) return { kind: "wait-fenced", from, to, waiting };

  const fenced = new Set(live.map((e) => e.name));
  const leftOut = entries.filter((e) => current(e) && !fenced.has(e.name));
  if (leftOut.length === 0) return { kind: "serve", from, to };
  const next = g + 1;
  const replicas = entries.map((e): ReplicaStatus => {
    if (fenced.has(e.name)) return { ...e, generation: next, state: "Online", message: undefined };
    if (!current(e)) return e;
    const why =
      e.nodeName === from
        ? `on the lost serving node ${from}, which may still write to it: left out at failover to ${to}`
        : `on node ${e.nodeName ?? "none"}, not reachable to fence at failover to ${to}`;
    return { ...e, state: "Stale", message: why };
  });
  for (const r of replicas) if (r.message === undefined) delete r.message;
  return { kind: "promote", from, to, dataGeneration: next, replicas };
}
