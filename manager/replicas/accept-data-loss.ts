// The shell of accepting data loss (data-loss.ts decides): reads the volume's annotation afresh
// (the manager's cache drops annotations), and carries out a refusal or the acceptance. The
// fencing steps it shares with failover are carried out by the replica controller's own code.
import {
  ACCEPT_DATA_LOSS_ANNOTATION,
  type NVMePartition,
  type NVMePartitionStatus,
  type NVMeVolumeAttachment,
} from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import { attachmentNameFor } from "../../lib/volume-identity.ts";
import type { ManagerContext } from "../context.ts";
import { INITIAL_PARTITION_STATUS } from "../placement/placement-core.ts";
import { applyStatusPatch } from "../status-patch.ts";
import { writeStatus } from "../status-write.ts";
import { type DataLossStep, decideDataLoss } from "./data-loss.ts";
import { SERVING } from "./replica-core.ts";

/** Serving condition reason while the annotation names no usable copy. */
export const ACCEPT_DATA_LOSS_INVALID = "AcceptDataLossInvalid";

/**
 * The data-loss step of stuck volume `v`, or undefined when it carries no accept-data-loss
 * annotation (read from the API server; a recreated volume of the same name is not this one).
 */
export async function dataLossStep(ctx: ManagerContext, v: NVMePartition): Promise<DataLossStep | undefined> {
  const fresh = await ctx.clients.partitions.get(v.metadata.name, v.metadata.namespace);
  if (!fresh || fresh.metadata.uid !== v.metadata.uid) return undefined;
  const value = fresh.metadata.annotations?.[ACCEPT_DATA_LOSS_ANNOTATION];
  if (value === undefined) return undefined;
  const copies = new Map<string, NVMePartition>();
  for (const c of ctx.inventory.replicasOf(v.metadata.uid as string)) copies.set(c.metadata.name, c);
  const attachments = new Map<string, NVMeVolumeAttachment>();
  for (const e of fresh.status?.replicas ?? []) {
    if (!e.uid) continue;
    const name = attachmentNameFor(e.name, e.uid);
    const a = await ctx.clients.attachments?.get(name, v.metadata.namespace);
    if (a && a.spec.partitionUID === e.uid) attachments.set(name, a);
  }
  return decideDataLoss(fresh, value, copies, attachments, ctx.inventory, ctx.clock.now(), {
    stalenessMs: ctx.config.stalenessMs,
  });
}

/**
 * Carries out an `invalid` or `accept` step. Accepting first removes the annotation (a merge
 * patch guarded by the resourceVersion it was read at), then raises the data generation with the
 * chosen copy alone current (guarded by the generation it read), then records DataLossAccepted.
 * A crash between the two writes leaves the annotation gone and the volume stuck: nothing stale
 * is served without a choice still standing, and the annotation can never act twice.
 */
export async function carryOutDataLoss(
  ctx: ManagerContext,
  v: NVMePartition,
  step: Extract<DataLossStep, { kind: "invalid" | "accept" }>,
  log: Logger,
): Promise<{ requeueAfterMs?: number }> {
  const { clients } = ctx;
  const { name, namespace } = v.metadata;
  const uid = v.metadata.uid as string;
  const now = new Date(ctx.clock.now());
  if (step.kind === "invalid") {
    const was = v.status?.conditions?.find((c) => c.type === SERVING);
    if (was?.reason !== ACCEPT_DATA_LOSS_INVALID || was.message !== step.message)
      ctx.events.emit(v, "Warning", "AcceptDataLossRefused", "Failover", step.message);
    await writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, v, (latest) =>
      latest.metadata.uid !== uid
        ? undefined
        : applyStatusPatch(
            latest.status,
            INITIAL_PARTITION_STATUS,
            {
              conditions: [
                {
                  type: SERVING,
                  status: "False",
                  reason: ACCEPT_DATA_LOSS_INVALID,
                  message: step.message,
                  observedGeneration: latest.metadata.generation,
                },
              ],
            },
            now,
          ),
    );
    return { requeueAfterMs: 5000 };
  }
  const fresh = await clients.partitions.get(name, namespace);
  if (
    !fresh ||
    fresh.metadata.uid !== uid ||
    fresh.metadata.annotations?.[ACCEPT_DATA_LOSS_ANNOTATION] === undefined
  )
    return {};
  try {
    await clients.partitions.mergePatch(name, namespace, {
      metadata: {
        uid,
        resourceVersion: fresh.metadata.resourceVersion,
        annotations: { [ACCEPT_DATA_LOSS_ANNOTATION]: null },
      },
    });
  } catch (err) {
    if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")) return {};
    throw err;
  }
  const g = v.status?.dataGeneration;
  const stored = await writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, v, (latest) =>
    latest.metadata.uid !== uid || latest.status?.dataGeneration !== g
      ? undefined
      : applyStatusPatch(
          latest.status,
          INITIAL_PARTITION_STATUS,
          { set: { dataGeneration: step.dataGeneration, replicas: step.replicas } },
          now,
        ),
  );
  if (!stored || stored.status?.dataGeneration !== step.dataGeneration) {
    log.warn("data loss not accepted: the volume changed meanwhile; the annotation is consumed", {
      volume: `${namespace}/${name}`,
    });
    return {};
  }
  const lost =
    step.lost.from > step.lost.to
      ? "no generation"
      : step.lost.from === step.lost.to
        ? `generation ${step.lost.from}`
        : `generations ${step.lost.from}-${step.lost.to}`;
  const note = `data loss accepted: copy ${step.copy} on ${step.to} (generation ${step.copyGeneration}) is current at data generation ${step.dataGeneration}; writes of ${lost} are lost; serving node ${step.from} was lost`;
  log.warn("data loss accepted on a replicated volume", {
    volume: `${namespace}/${name}`,
    copy: step.copy,
    node: step.to,
    lost,
  });
  ctx.events.emit(v, "Warning", "DataLossAccepted", "Failover", note);
  return {};
}
