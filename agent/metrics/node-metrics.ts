// Every metric family the agent binary exports, registered in one place (main.ts calls it at start,
// the metric-coverage test calls it to learn what the agent can show), and the periodic loop that
// fills the agent's own: SPDK statistics and attachments not yet ready on this node.
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import { controllerMetrics } from "../../lib/kube/runner.ts";
import type { Registry, SnapshotFamily } from "../../lib/metrics.ts";
import { nvmfTgtMetrics } from "../../lib/spdk/supervisor.ts";
import { type RebuildMetrics, rebuildMetrics } from "../nexus/rebuild-driver.ts";
import type { SpdkStatsCollector } from "./spdk-stats.ts";
import { spdkStatsMetrics } from "./spdk-stats.ts";

export interface AgentMetrics {
  spdk: ReturnType<typeof spdkStatsMetrics>;
  /** Seconds each attachment of this node's partitions has waited for AccessReady (only those waiting). */
  attachmentUnready: SnapshotFamily<"namespace" | "partition">;
  /** Rebuilds onto copies of volumes this node serves. */
  rebuild: RebuildMetrics;
}

/**
 * Registers the agent's families on `registry`: the controllers' work queues and reconciles, the
 * nvmf_tgt supervisor's, and the node statistics. All with reuse, so the components that register
 * their own later get the same families.
 */
export function registerAgentMetrics(registry: Registry): AgentMetrics {
  controllerMetrics(registry);
  nvmfTgtMetrics(registry);
  return {
    spdk: spdkStatsMetrics(registry),
    rebuild: rebuildMetrics(registry),
    attachmentUnready: registry.snapshot({
      kind: "gauge",
      name: "distort_attachment_unready_seconds",
      help: "Seconds since an NVMeVolumeAttachment of a partition on this node last had AccessReady True for its current attachment id (listed only while not ready).",
      labelNames: ["namespace", "partition"],
      reuse: true,
    }),
  };
}

/**
 * The attachments of `partitions` (this node's) whose AccessReady is not True for the current
 * attachment id, with how long they have waited: since the condition's last transition, or since
 * the attachment was created when it has no condition yet.
 */
export function unreadyAttachments(
  attachments: readonly NVMeVolumeAttachment[],
  partitions: readonly NVMePartition[],
  nowMs: number,
): [{ namespace: string; partition: string }, number][] {
  const mine = new Set(partitions.map((p) => `${p.metadata.namespace}/${p.metadata.name}/${p.metadata.uid}`));
  const rows = new Map<string, [{ namespace: string; partition: string }, number]>();
  for (const a of attachments) {
    const ns = a.metadata.namespace ?? "";
    if (a.metadata.deletionTimestamp) continue;
    if (!mine.has(`${ns}/${a.spec.partitionName}/${a.spec.partitionUID}`)) continue;
    const cond = a.status?.conditions?.find((c) => c.type === "AccessReady");
    const ready = cond?.status === "True" && a.status?.observedAttachmentId === a.spec.attachmentId;
    if (ready) continue;
    const since = Date.parse(cond?.lastTransitionTime ?? a.metadata.creationTimestamp ?? "");
    const waited = Number.isFinite(since) ? Math.max(0, (nowMs - since) / 1000) : 0;
    const key = `${ns}/${a.spec.partitionName}`;
    const prev = rows.get(key);
    if (!prev || prev[1] < waited)
      rows.set(key, [{ namespace: ns, partition: a.spec.partitionName }, waited]);
  }
  return [...rows.values()];
}

export interface NodeMetricsLoop {
  metrics: AgentMetrics;
  /** Undefined on a node without the SPDK backend. */
  spdk: SpdkStatsCollector | undefined;
  attachments: () => readonly NVMeVolumeAttachment[];
  partitions: () => readonly NVMePartition[];
  clock: Clock;
  periodMs: number;
}

/** One pass of everything the loop fills. */
export async function collectNodeMetrics(o: NodeMetricsLoop): Promise<void> {
  await o.spdk?.round();
  o.metrics.attachmentUnready.replace(unreadyAttachments(o.attachments(), o.partitions(), o.clock.now()));
}

/**
 * Collects every `periodMs` until `signal` aborts. The period, not the scrape rate, bounds the RPC
 * load on the target: scrapes render the last pass.
 */
export async function runNodeMetrics(o: NodeMetricsLoop, signal: AbortSignal): Promise<void> {
  while (!signal.aborted) {
    await collectNodeMetrics(o);
    await o.clock.sleep(o.periodMs, signal).catch(() => {});
  }
}
