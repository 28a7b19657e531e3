// Accepting data loss on a replicated volume, as a pure decision: when the serving node is lost
// and no current copy is on a live node (failover is stuck), an operator's annotation
// (storage.distort.io/accept-data-loss: a copy's name, or "newest") lets the manager serve a
// stale copy. The order is the failover's: fence every copy on a live node to the chosen copy's
// node (the lost node may still write to them), wait until each enforces it, and only then raise
// the data generation with the chosen copy alone current; the normal failover then serves it.
// Without the annotation, or with a value that names no usable copy, nothing stale is served.
import {
  ACCEPT_NEWEST,
  type NVMePartition,
  type NVMeVolumeAttachment,
  type ReplicaStatus,
} from "../../api/index.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { nodeHealth } from "../node-health.ts";
import type { FailoverConfig, FailoverStep } from "./failover.ts";
import type { ReplicaView } from "./replica-core.ts";

export type DataLossStep =
  /** The annotation names no usable copy: say why, change nothing (the annotation stays). */
  | { kind: "invalid"; message: string }
  /** Fence the copies on live nodes to the chosen copy's node first (the failover's own step). */
  | Extract<FailoverStep, { kind: "fence" | "wait-fenced" }>
  /**
   * Every live copy fenced: write `dataGeneration` with `copy` alone current (`replicas`), and
   * consume the annotation. `lost` names the generations whose writes are given up.
   */
  | {
      kind: "accept";
      from: string;
      to: string;
      copy: string;
      copyGeneration: number;
      dataGeneration: number;
      lost: { from: number; to: number };
      replicas: ReplicaStatus[];
    };

/** Copy states whose data is whole as of their generation (a Rebuilding copy is a mix). */
const WHOLE = new Set(["Stale", "Faulted", "Online", "Degraded"]);

/**
 * The data-loss step for volume `v`, whose failover is stuck, under annotation value `value`.
 * `copies` holds the volume's copy partitions by name as last read (an absent one is gone).
 * Only a copy that held data (generation >= 1), is whole (not Rebuilding), is Exported and not
 * being deleted, and sits on a live node other than the lost one can be chosen; "newest" picks
 * the highest generation among them (the first in index order on a tie).
 */
export function decideDataLoss(
  v: NVMePartition,
  value: string,
  copies: ReadonlyMap<string, NVMePartition>,
  attachments: ReadonlyMap<string, NVMeVolumeAttachment>,
  view: ReplicaView,
  nowMs: number,
  cfg: FailoverConfig,
): DataLossStep {
  const from = v.spec.nodeName ?? "";
  const g = v.status?.dataGeneration ?? 0;
  const entries = v.status?.replicas ?? [];
  const alive = (n: string | undefined) =>
    n !== undefined && n !== from && nodeHealth(n, view.node(n), nowMs, cfg.stalenessMs).ok;
  const why = (e: ReplicaStatus): string | undefined => {
    const p = copies.get(e.name);
    if (!e.uid || !p || p.metadata.uid !== e.uid || p.metadata.deletionTimestamp)
      return "its partition is gone";
    if (!alive(e.nodeName)) return `its node ${e.nodeName ?? "(none)"} is not live`;
    if (e.generation < 1) return "it never held data (generation 0)";
    if (!WHOLE.has(e.state))
      return `it is ${e.state}: a copy cut off during a rebuild holds a mix of old and new blocks`;
    if (p.status?.state !== "Exported")
      return `its partition is ${p.status?.state ?? "Pending"}, not Exported`;
    return undefined;
  };
  const usable = entries.filter((e) => why(e) === undefined);
  let chosen: ReplicaStatus | undefined;
  const v_ = value.trim();
  if (v_ === ACCEPT_NEWEST) {
    for (const e of usable) if (!chosen || e.generation > chosen.generation) chosen = e;
    if (!chosen) {
      const all = entries.map((e) => `${e.name}: ${why(e) ?? "usable"}`).join("; ");
      return {
        kind: "invalid",
        message: `accept-data-loss=newest: no copy can be served (${all || "no copies"})`,
      };
    }
  } else {
    const named = entries.find((e) => e.name === v_);
    if (!named) {
      return {
        kind: "invalid",
        message: `accept-data-loss=${JSON.stringify(value.slice(0, 64))} names no copy of this volume; use "${ACCEPT_NEWEST}" or one of: ${entries.map((e) => e.name).join(", ") || "(none)"}`,
      };
    }
    const bad = why(named);
    if (bad)
      return {
        kind: "invalid",
        message: `accept-data-loss=${named.name}: that copy cannot be served: ${bad}`,
      };
    chosen = named;
  }
  const to = chosen.nodeName as string;
  const host = nexusHostNqnFor(to);

  // Fence: every copy on a live node (stale ones too) admits only the new serving node.
  const moves: { attachment: string; copy: string; uid: string }[] = [];
  const waiting: string[] = [];
  for (const e of entries) {
    if (!e.uid || !alive(e.nodeName)) continue;
    const name = attachmentNameFor(e.name, e.uid);
    const a = attachments.get(name);
    if (!a || a.spec.hostNQN !== host) moves.push({ attachment: name, copy: e.name, uid: e.uid });
    else if (a.status?.observedAttachmentId !== a.spec.attachmentId || a.metadata.deletionTimestamp)
      waiting.push(e.name);
  }
  if (moves.length > 0) return { kind: "fence", from, to, moves };
  if (waiting.length > 0) return { kind: "wait-fenced", from, to, waiting };

  const next = g + 1;
  const replicas = entries.map((e): ReplicaStatus => {
    if (e.name === chosen.name) {
      const { message: _m, rebuild: _r, ...rest } = e;
      return { ...rest, generation: next, state: "Online" };
    }
    if (e.generation === g && (e.state === "Online" || e.state === "Degraded"))
      return {
        ...e,
        state: "Stale",
        message: `left out: data loss accepted, ${chosen.name} serves from generation ${next}`,
      };
    return e;
  });
  return {
    kind: "accept",
    from,
    to,
    copy: chosen.name,
    copyGeneration: chosen.generation,
    dataGeneration: next,
    lost: { from: chosen.generation + 1, to: g },
    replicas,
  };
}
