// The replica controller: for every replicated volume (spec.replicas > 1) it keeps one replica
// partition per copy (created here, placed by the placement controller through the device
// ledger, provisioned and exported by their agents), deletes them when the volume goes, and
// writes the volume's status.replicas. Keys are volume keys; replica-core.ts decides.
import { randomUUID } from "node:crypto";
import {
  API_VERSION,
  DEFAULT_FAILOVER_AFTER_SECONDS,
  HANDOVER_ANNOTATION,
  isDraining,
  type NVMePartition,
  type NVMePartitionStatus,
  type NVMeVolumeAttachment,
} from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import { objectKey } from "../../lib/kube/resource.ts";
import type { Reconcile } from "../../lib/kube/runner.ts";
import type { Logger } from "../../lib/log.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import type { ManagerContext, Triggers } from "../context.ts";
import { editFinalizers } from "../finalizers.ts";
import { nodeHealth } from "../node-health.ts";
import { INITIAL_PARTITION_STATUS } from "../placement/placement-core.ts";
import { applyStatusPatch } from "../status-patch.ts";
import { writeStatus } from "../status-write.ts";
import { carryOutDataLoss, dataLossStep } from "./accept-data-loss.ts";
import {
  decideFailover,
  type FailoverStep,
  failoverDeadlineMs,
  servingNodeLost,
  servingReleased,
} from "./failover.ts";
import {
  decideReplicas,
  isReplicated,
  REPLICA_OF_LABEL,
  REPLICAS_FINALIZER,
  type ReplicaOutcome,
  SERVING,
} from "./replica-core.ts";

export const REPLICAS = "replicas";

export function replicaReconciler(ctx: ManagerContext): Reconcile {
  const { inventory, clients } = ctx;
  return async (key, rctx) => {
    let volume = inventory.partition(key);
    if (!volume || !isReplicated(volume)) return;
    const uid = volume.metadata.uid as string;
    const { name, namespace } = volume.metadata;
    if (servingNodeLost(volume, inventory, ctx.clock.now())) {
      const step = await failoverStep(ctx, volume);
      if (step.kind !== "none") return carryOut(ctx, volume, step, rctx.log);
    }
    const out = decideReplicas(volume, inventory.replicasOf(uid), inventory, ctx.clock.now(), {
      stalenessMs: ctx.config.stalenessMs,
    });
    rctx.signal.throwIfAborted();
    if (out.finalizer === true) {
      const stored = await editFinalizers(clients.partitions, name, namespace, uid, (f) =>
        f.includes(REPLICAS_FINALIZER) ? undefined : [...f, REPLICAS_FINALIZER],
      );
      if (!stored) return;
      volume = stored;
    }
    for (const c of out.create) {
      const replica: NVMePartition = {
        apiVersion: API_VERSION,
        kind: "NVMePartition",
        metadata: {
          name: c.name,
          namespace,
          labels: { ...(volume.metadata.labels ?? {}), [REPLICA_OF_LABEL]: uid },
          ownerReferences: [
            {
              apiVersion: API_VERSION,
              kind: "NVMePartition",
              name,
              uid,
              controller: true,
              blockOwnerDeletion: true,
            },
          ],
        },
        spec: c.spec,
      };
      try {
        await clients.partitions.create(replica);
        rctx.log.info("replica created", { volume: key, replica: c.name });
      } catch (err) {
        // Another manager made it first; the watch brings it.
        if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
      }
    }
    for (const u of out.unadmit)
      await clients.attachments?.delete(attachmentNameFor(u.copy, u.uid), namespace);
    for (const d of out.delete) {
      await clients.partitions.delete(d.name, namespace, { uid: d.uid });
      rctx.log.info("replica deleted", { volume: key, replica: d.name, why: d.why });
    }
    for (const e of out.events) {
      ctx.events.emit(volume, e.type, e.reason, "Replicate", e.note);
      if (e.reason === "ReplicaMoved") ctx.metrics.replicasMoved.inc();
    }
    if (out.serve) {
      // Guarded by the resourceVersion the decision saw: two managers never both choose.
      try {
        volume = await clients.partitions.mergePatch(name, namespace, {
          metadata: { uid, resourceVersion: volume.metadata.resourceVersion },
          spec: { nodeName: out.serve },
        });
        rctx.log.info("replicated volume served", { volume: key, node: out.serve });
        ctx.events.emit(volume, "Normal", "Serving", "Replicate", `served from node ${out.serve}`);
      } catch (err) {
        if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")) return {};
        throw err;
      }
    }
    for (const a of out.admit) await admit(ctx, namespace as string, a, rctx.log);
    if (out.handover) {
      try {
        volume = await clients.partitions.mergePatch(name, namespace, {
          metadata: {
            uid,
            resourceVersion: volume.metadata.resourceVersion,
            annotations: { [HANDOVER_ANNOTATION]: out.handover },
          },
        });
        rctx.log.info("planned handover asked", { volume: key, from: out.handover });
      } catch (err) {
        if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")) return {};
        throw err;
      }
    }
    if (out.status) {
      const patch = out.status;
      const now = new Date(ctx.clock.now());
      // The decision rests on the copies' states and generations it read. The serving node may
      // have lowered a copy meanwhile (a raised data generation): then this write is dropped, and
      // the watch brings the volume back to decide on what it says now.
      const basis = generationsOf(volume);
      await writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, volume, (latest) =>
        latest.metadata.uid !== uid || generationsOf(latest) !== basis
          ? undefined
          : applyStatusPatch(latest.status, INITIAL_PARTITION_STATUS, unlessServing(latest, patch), now),
      );
    }
    if (out.finalizer === false) {
      await editFinalizers(clients.partitions, name, namespace, uid, (f) =>
        f.includes(REPLICAS_FINALIZER) ? f.filter((x) => x !== REPLICAS_FINALIZER) : undefined,
      );
    }
    // The serving node lets go of a deleted volume in its own time: look again soon.
    if (volume.metadata.deletionTimestamp && out.finalizer === undefined) return { requeueAfterMs: 2000 };
    if (out.status || out.create.length || out.delete.length || out.serve) return {};
    // Node health changes with time, not only with writes. Look again when the serving node's
    // heartbeat would pass the volume's failover bound (a fresher heartbeat by then moves the
    // deadline), and in any case within the staleness window.
    return {
      requeueAfterMs: Math.min(
        ctx.config.stalenessMs,
        failoverDeadlineMs(volume, inventory, ctx.clock.now()),
      ),
    };
  };
}

/**
 * The NVMeVolumeAttachment that admits serving node `a.node` to copy `a.copy`: the record every
 * agent admits hosts from, under the name the copy's UID derives. Created when missing; one that
 * names another host is left alone (moving it is the failover's fencing step, not this one's).
 */
async function admit(
  ctx: ManagerContext,
  namespace: string,
  a: { copy: string; uid: string; node: string; move?: true },
  log: Logger,
): Promise<void> {
  const client = ctx.clients.attachments;
  if (!client) return;
  const name = attachmentNameFor(a.copy, a.uid);
  const hostNQN = nexusHostNqnFor(a.node);
  const existing = await client.get(name, namespace);
  if (existing) {
    if (existing.spec.hostNQN !== hostNQN && a.move) {
      // A copy behind the generation still admitting an earlier serving node: only the serving
      // node may rebuild it, and the earlier one loses a copy it must not use anyway.
      await client.replace({
        ...existing,
        spec: {
          partitionName: a.copy,
          partitionUID: a.uid,
          nodeId: `${a.node}/${hostNQN}`,
          hostNQN,
          attachmentId: `serve-${randomUUID()}`,
        },
      });
      log.info("serving node admitted to a copy to rebuild", {
        copy: a.copy,
        node: a.node,
        was: existing.spec.hostNQN,
      });
    } else if (existing.spec.hostNQN !== hostNQN)
      log.warn("copy admits another host than its volume's serving node", {
        copy: a.copy,
        admitted: existing.spec.hostNQN,
        serving: a.node,
      });
    return;
  }
  const record: NVMeVolumeAttachment = {
    apiVersion: API_VERSION,
    kind: "NVMeVolumeAttachment",
    metadata: { name, namespace },
    spec: {
      partitionName: a.copy,
      partitionUID: a.uid,
      nodeId: `${a.node}/${hostNQN}`,
      hostNQN,
      attachmentId: `serve-${randomUUID()}`,
    },
  };
  try {
    await client.create(record);
    log.info("serving node admitted to copy", { copy: a.copy, node: a.node });
  } catch (err) {
    if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
  }
}

/**
 * `patch` without its Serving True when `latest` already says True: a failover's own FailedOver
 * (written just now, past the cache the decision read) is not overwritten by a plainer Served.
 */
function unlessServing(
  latest: NVMePartition,
  patch: NonNullable<ReplicaOutcome["status"]>,
): NonNullable<ReplicaOutcome["status"]> {
  const have = latest.status?.conditions?.find((c) => c.type === SERVING);
  if (have?.status !== "True") return patch;
  return { ...patch, conditions: patch.conditions.filter((c) => c.type !== SERVING) };
}

/** What a replica decision depends on that others write: the data generation and each copy's state. */
function generationsOf(v: NVMePartition): string {
  const s = v.status;
  return JSON.stringify([
    s?.dataGeneration ?? null,
    (s?.replicas ?? []).map((e) => [
      e.name,
      e.state === "Faulted" || e.state === "Stale" ? e.state : "",
      e.generation,
    ]),
  ]);
}

/** The volume's next failover step, from the copies' admissions read afresh. */
async function failoverStep(ctx: ManagerContext, v: NVMePartition): Promise<FailoverStep> {
  const attachments = new Map<string, NVMeVolumeAttachment>();
  const client = ctx.clients.attachments;
  if (!client) return { kind: "none" };
  for (const e of v.status?.replicas ?? []) {
    if (!e.uid) continue;
    const name = attachmentNameFor(e.name, e.uid);
    const a = await client.get(name, v.metadata.namespace);
    if (a && a.spec.partitionUID === e.uid) attachments.set(name, a);
  }
  return decideFailover(v, attachments, ctx.inventory, ctx.clock.now(), {
    stalenessMs: ctx.config.stalenessMs,
  });
}

const FAILOVER_POLL_MS = 1000;

async function carryOut(
  ctx: ManagerContext,
  v: NVMePartition,
  step: Exclude<FailoverStep, { kind: "none" }>,
  log: Logger,
): Promise<{ requeueAfterMs?: number }> {
  const { clients } = ctx;
  const { name, namespace } = v.metadata;
  const uid = v.metadata.uid as string;
  const now = new Date(ctx.clock.now());
  ctx.metrics.failoverSteps.inc({ step: step.kind });
  const serving = (status: "True" | "False", reason: string, message: string) =>
    writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, v, (latest) =>
      latest.metadata.uid !== uid
        ? undefined
        : applyStatusPatch(
            latest.status,
            INITIAL_PARTITION_STATUS,
            {
              conditions: [
                { type: SERVING, status, reason, message, observedGeneration: latest.metadata.generation },
              ],
            },
            now,
          ),
    );
  switch (step.kind) {
    case "stuck": {
      // An operator may have chosen to serve a stale copy (storage.distort.io/accept-data-loss).
      const dl = await dataLossStep(ctx, v);
      if (dl?.kind === "fence" || dl?.kind === "wait-fenced") return carryOut(ctx, v, dl, log);
      if (dl) return carryOutDataLoss(ctx, v, dl, log);
      const was = v.status?.conditions?.find((c) => c.type === SERVING);
      if (was?.reason !== "NoLiveCurrentCopy")
        ctx.events.emit(v, "Warning", "FailoverBlocked", "Failover", step.message);
      await serving("False", "NoLiveCurrentCopy", step.message);
      return { requeueAfterMs: FAILOVER_POLL_MS * 5 };
    }
    case "fence": {
      const host = nexusHostNqnFor(step.to);
      for (const m of step.moves) {
        const record = await clients.attachments?.get(m.attachment, namespace);
        const spec = {
          partitionName: m.copy,
          partitionUID: m.uid,
          nodeId: `${step.to}/${host}`,
          hostNQN: host,
          attachmentId: `serve-${randomUUID()}`,
        };
        if (record) await clients.attachments?.replace({ ...record, spec });
        else
          await clients.attachments?.create({
            apiVersion: API_VERSION,
            kind: "NVMeVolumeAttachment",
            metadata: { name: m.attachment, namespace },
            spec,
          });
        log.warn("copy fenced from the lost serving node", { copy: m.copy, from: step.from, to: step.to });
      }
      const planned = servingReleased(v);
      const note = `${planned ? `planned handover: serving node ${step.from} released the volume` : `serving node ${step.from} lost`}: fencing it from ${step.moves.map((m) => m.copy).join(", ")} before ${step.to} serves`;
      ctx.events.emit(v, planned ? "Normal" : "Warning", "Fencing", planned ? "Handover" : "Failover", note);
      await serving("False", "Fencing", note);
      return { requeueAfterMs: FAILOVER_POLL_MS };
    }
    case "wait-fenced":
      await serving(
        "False",
        "Fencing",
        `waiting for ${step.waiting.join(", ")} to drop ${step.from} and admit ${step.to} only`,
      );
      return { requeueAfterMs: FAILOVER_POLL_MS };
    case "promote": {
      const g = v.status?.dataGeneration;
      const stored = await writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, v, (latest) =>
        latest.metadata.uid !== uid || latest.status?.dataGeneration !== g
          ? undefined
          : applyStatusPatch(
              latest.status,
              INITIAL_PARTITION_STATUS,
              {
                set: { dataGeneration: step.dataGeneration, replicas: step.replicas },
              },
              now,
            ),
      );
      if (stored) {
        const stale = step.replicas.filter((r) => r.state === "Stale").map((r) => r.name);
        ctx.events.emit(
          v,
          "Warning",
          "GenerationRaised",
          "Failover",
          `data generation ${step.dataGeneration}: ${stale.join(", ")} left out (stale) at failover from ${step.from} to ${step.to}`,
        );
      }
      return {};
    }
    case "serve": {
      const planned = servingReleased(v);
      let moved: NVMePartition;
      try {
        moved = await clients.partitions.mergePatch(name, namespace, {
          metadata: {
            uid,
            resourceVersion: v.metadata.resourceVersion,
            // The handover is done: the request goes with the move (one write).
            ...(planned ? { annotations: { [HANDOVER_ANNOTATION]: null } } : {}),
          },
          spec: { nodeName: step.to },
        });
      } catch (err) {
        if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")) return {};
        throw err;
      }
      if (planned) {
        // releasedBy speaks for the node it names only while that node serves: cleared now, so a
        // later handover from it needs a fresh release.
        await writeStatus<NVMePartitionStatus, NVMePartition>(clients.partitions, moved, (latest) =>
          latest.metadata.uid !== uid
            ? undefined
            : applyStatusPatch(
                latest.status,
                INITIAL_PARTITION_STATUS,
                { set: { releasedBy: undefined } },
                now,
              ),
        );
        const note = `planned handover: served from ${step.to}; ${step.from} released the volume (no more writes) and is fenced from every current copy`;
        log.info("replicated volume handed over", {
          volume: `${namespace}/${name}`,
          from: step.from,
          to: step.to,
        });
        ctx.events.emit(moved, "Normal", "HandedOver", "Handover", note);
        await serving("True", "HandedOver", note);
        return {};
      }
      const note = `served from ${step.to} after ${step.from} missed heartbeats for ${v.spec.failoverAfterSeconds ?? DEFAULT_FAILOVER_AFTER_SECONDS} s; ${step.from} is fenced from every current copy`;
      log.warn("replicated volume failed over", {
        volume: `${namespace}/${name}`,
        from: step.from,
        to: step.to,
      });
      ctx.events.emit(v, "Warning", "FailedOver", "Failover", note);
      await serving("True", "FailedOver", note);
      return {};
    }
  }
}

/** Volume keys to reconcile when objects change. */
export function replicaTriggers(ctx: ManagerContext): Triggers {
  const { inventory } = ctx;
  return {
    partition: (_old, p) => {
      if (isReplicated(p)) return [objectKey(p.metadata)];
      const of = p.spec.replicaOf;
      return of ? [objectKey({ name: of.name, namespace: p.metadata.namespace })] : [];
    },
    // A storage node's health decides whether its copies are Online or Degraded.
    node: (old, n) => {
      const now = ctx.clock.now();
      const was = old ? nodeHealth(old.spec.nodeName, old, now, ctx.config.stalenessMs).ok : undefined;
      const drainChanged = isDraining(old) !== isDraining(n);
      if (!drainChanged && was === nodeHealth(n.spec.nodeName, n, now, ctx.config.stalenessMs).ok) return [];
      const out: string[] = [];
      for (const key of inventory.replicatedKeys()) {
        const v = inventory.partition(key);
        if (v?.status?.replicas?.some((r) => r.nodeName === n.spec.nodeName)) out.push(key);
      }
      return out;
    },
    // A drive's drain decides whether its copies are replaced and retired.
    device: (old, d) => {
      if (isDraining(old) === isDraining(d)) return [];
      const out: string[] = [];
      for (const key of inventory.replicatedKeys()) {
        const v = inventory.partition(key);
        if (
          v?.status?.replicas?.some((r) => r.nodeName === d.spec.nodeName && r.deviceSerial === d.spec.serial)
        )
          out.push(key);
      }
      return out;
    },
  };
}
