// The imperative shell of rebuilds on a replicated volume's serving node: runs decideRebuilds
// (agent/nexus/rebuild.ts) once per nexus pass, records each step in the volume's status (one
// write per step, guarded by resourceVersion) and carries it out on the target. The running
// rebuilds are kept in memory: a restarted agent finds none and starts its copies again. Under
// cluster grants the same writes ask for, and give back, the volume's status.rebuildSlot.
import type { NVMePartition, NVMePartitionStatus } from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import type { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import type { Counter, Registry, SnapshotFamily } from "../../lib/metrics.ts";
import type { NexusAssembler } from "./assembler.ts";
import type { NexusPlan } from "./decide.ts";
import { nexusMemberBdevFor } from "./identity.ts";
import {
  applyRebuildStep,
  applySlotStep,
  decideRebuilds,
  type RebuildSession,
  type RebuildStep,
  rebuildCandidates,
} from "./rebuild.ts";

/** Default of the node's cap on rebuilds running at once. */
export const DEFAULT_REBUILDS_PER_NODE = 2;

export interface RebuildMetrics {
  bytesDone: SnapshotFamily<"namespace" | "volume">;
  bytesTotal: SnapshotFamily<"namespace" | "volume">;
  completed: Counter<"namespace" | "volume">;
}

/** The rebuild families on `registry` (with reuse). */
export function rebuildMetrics(registry: Registry): RebuildMetrics {
  const labelNames = ["namespace", "volume"] as const;
  return {
    bytesDone: registry.snapshot({
      kind: "gauge",
      name: "distort_rebuild_bytes_done",
      help: "Bytes copied so far by the rebuild running on a replicated volume this node serves (listed only while one runs).",
      labelNames: [...labelNames],
      reuse: true,
    }),
    bytesTotal: registry.snapshot({
      kind: "gauge",
      name: "distort_rebuild_bytes_total",
      help: "Bytes the rebuild running on a replicated volume this node serves copies in all (listed only while one runs).",
      labelNames: [...labelNames],
      reuse: true,
    }),
    completed: registry.counter({
      name: "distort_rebuilds_completed_total",
      help: "Rebuilds this node finished and recorded: the copy joined the current set.",
      labelNames: [...labelNames],
      reuse: true,
    }),
  };
}

export interface RebuildDriverOptions {
  assembler: NexusAssembler;
  partitions: ResourceClient<NVMePartition>;
  logger: Logger;
  /** Most rebuilds running at once on this node. */
  maxPerNode: number;
  /** Bandwidth cap of each rebuild in MB/s (0: none), applied with bdev_raid_set_options. */
  bandwidthMbSec: number;
  /** A rebuild starts only under the manager's grant of a cluster rebuild slot (status.rebuildSlot). */
  needsGrant: boolean;
  /** This agent's node: the asker its slots name. */
  nodeName: string;
  clock: Clock;
  metrics?: RebuildMetrics;
  /** Called after each step is recorded (tests hold or cut passes here). */
  afterStep?(step: RebuildStep["kind"], key: string): void | Promise<void>;
}

export class RebuildDriver {
  /** Volume UID -> copy UID -> the rebuild this agent started. */
  private readonly sessions = new Map<string, Map<string, RebuildSession>>();
  /** Volume UID -> progress row for the metrics. */
  private readonly progress = new Map<string, { ns: string; name: string; done: number; total: number }>();
  /** The bandwidth cap last applied on the target; undefined: not known to be applied. */
  private applied: number | undefined;
  /**
   * Volume UID -> copy UID of the slot this node asked for or holds there with no rebuild running
   * yet, as last seen by a pass: they count against the node's cap, so a grant never waits for it.
   */
  private readonly asked = new Map<string, string>();

  constructor(private readonly o: RebuildDriverOptions) {}

  /**
   * Volume UID -> bdevs of copies whose rebuild was recorded finished, until a pass's plan lists
   * them as current members: a pass that still reads the volume from before that write must not
   * take them out of the raid.
   */
  private readonly joined = new Map<string, Set<string>>();

  /** Bdev names of the members being rebuilt onto in volume `volumeUid` (ensureRaid keeps them). */
  members(volumeUid: string): Set<string> {
    return new Set([
      ...[...(this.sessions.get(volumeUid)?.values() ?? [])].map((s) => s.bdev),
      ...(this.joined.get(volumeUid) ?? []),
    ]);
  }

  /** Forgets the rebuilds of a volume this node no longer serves (its raid is gone). */
  forget(volumeUid: string): void {
    this.sessions.delete(volumeUid);
    this.asked.delete(volumeUid);
    this.joined.delete(volumeUid);
    this.progress.delete(volumeUid);
    this.publish();
  }

  /** Forgets every rebuild: the target restarted, so no raid holds a rebuild this agent started. */
  forgetAll(): void {
    this.sessions.clear();
    this.asked.clear();
    this.joined.clear();
    this.progress.clear();
    this.applied = undefined;
    this.publish();
  }

  /**
   * One pass over served volume `p` whose raid ensureRaid just made or found: admits, follows,
   * completes or aborts rebuilds of its non-current copies. Resolves with a requeue while one
   * runs or waits. Repeatable: each step is recorded before (start) or after (complete, abort)
   * it acts, and a pass that dies between the two leaves what the next pass repairs.
   */
  async pass(key: string, p: NVMePartition, plan: NexusPlan, raidBytes: number, log: Logger) {
    const volumeUid = p.metadata.uid as string;
    const joined = this.joined.get(volumeUid);
    if (joined) {
      for (const m of plan.members) joined.delete(nexusMemberBdevFor(m.controller));
      if (joined.size === 0) this.joined.delete(volumeUid);
    }
    const candidates = rebuildCandidates(p);
    const mine = this.sessions.get(volumeUid) ?? new Map<string, RebuildSession>();
    // Sessions of copies no longer candidates (removed from status) are dropped with their member.
    for (const [uid, s] of mine) {
      if (candidates.some((c) => c.uid === uid)) continue;
      mine.delete(uid);
      await this.o.assembler.detachController(s.controller);
    }
    if (candidates.length === 0) {
      this.forget(volumeUid);
      return undefined;
    }
    const raid = await this.o.assembler.raid(plan.raidBdev);
    if (!raid) return { requeueAfterMs: 1000 };
    const copies = new Map<string, NVMePartition | null>();
    const found = await Promise.all(
      candidates.map((c) => this.o.partitions.get(c.name, p.metadata.namespace as string)),
    );
    for (const [i, c] of candidates.entries()) copies.set(c.name, found[i] ?? null);
    let elsewhere = 0;
    for (const [uid, m] of this.sessions) if (uid !== volumeUid) elsewhere += m.size;
    let askedElsewhere = 0;
    for (const uid of this.asked.keys()) if (uid !== volumeUid) askedElsewhere++;
    const firstSlot = raid.base_bdevs_list.find((b) => b.is_configured);
    const blockSize = firstSlot && firstSlot.data_size > 0 ? raidBytes / firstSlot.data_size : 512;
    const steps = decideRebuilds({
      volume: p,
      raid,
      raidBytes,
      blockSize,
      sessions: mine,
      runningElsewhere: elsewhere,
      nodeCap: this.o.maxPerNode,
      controllersUp: await this.o.assembler.controllersUp(),
      copies,
      ...(this.o.needsGrant
        ? {
            grant: {
              node: this.o.nodeName,
              requestedElsewhere: askedElsewhere,
              nowIso: new Date(this.o.clock.now()).toISOString(),
            },
          }
        : {}),
    });
    if (
      this.applied !== this.o.bandwidthMbSec &&
      steps.some((s) => s.kind === "start" || s.kind === "progress")
    ) {
      await this.o.assembler.setRebuildBandwidth(this.o.bandwidthMbSec);
      this.applied = this.o.bandwidthMbSec;
    }
    for (const step of steps) {
      if (step.kind === "abort" && !mine.has(step.copyUid)) {
        // Found in the raid without a session: a rebuild this agent did not start, or one it
        // finished and recorded Online after `p` was read. Only the API knows which, so the copy
        // leaves the raid only once the latest status says it is not current: taking a copy the
        // API holds current out of the raid would let writes be acknowledged without it.
        const stored = await this.record(p, step);
        if (!stored) {
          log.info("copy found in the raid is current: kept", { copy: step.copyName });
          continue;
        }
        await this.o.assembler.detachController(step.controller);
        log.warn("rebuild interrupted", { copy: step.copyName, why: step.why });
      } else if (step.kind === "abort") {
        // Out of the raid first: the copy must not look like it finished a later pass.
        mine.delete(step.copyUid);
        await this.o.assembler.detachController(step.controller);
        await this.record(p, step);
        log.warn("rebuild interrupted", { copy: step.copyName, why: step.why });
      } else if (step.kind === "start") {
        // Reached first: a copy whose node does not answer (its partition still says Exported) is
        // not admitted, it waits.
        let bdev: string;
        try {
          bdev = await this.o.assembler.attachCopy(step.endpoint, plan.hostNqn);
        } catch (err) {
          const why = `waits to rebuild: ${step.endpoint.name} cannot be reached from ${p.spec.nodeName}: ${(err as Error).message}`;
          await this.o.assembler.detachController(step.endpoint.controller);
          // A granted slot goes back: this copy asks again (behind the queue) once reachable.
          await this.record(p, {
            kind: "wait",
            copyName: step.endpoint.name,
            copyUid: step.endpoint.uid,
            why,
            release: true,
          });
          log.info("copy to rebuild not reachable yet", {
            copy: step.endpoint.name,
            error: (err as Error).message,
          });
          continue;
        }
        const stored = await this.record(p, step);
        if (!stored) continue;
        await this.o.afterStep?.("start", key);
        await this.o.assembler.setRebuildBandwidth(this.o.bandwidthMbSec);
        this.applied = this.o.bandwidthMbSec;
        await this.o.assembler.addMember(plan.raidBdev, bdev);
        mine.set(step.endpoint.uid, {
          copyName: step.endpoint.name,
          copyUid: step.endpoint.uid,
          controller: step.endpoint.controller,
          bdev: nexusMemberBdevFor(step.endpoint.controller),
        });
        log.info("rebuild started", { copy: step.endpoint.name, raid: plan.raidBdev });
      } else if (step.kind === "request") {
        if (await this.record(p, step))
          log.info("cluster rebuild slot asked for", {
            copy: step.copyName,
            requestedAt: step.slot.requestedAt,
          });
      } else if (step.kind === "progress") {
        await this.record(p, step);
        this.progress.set(volumeUid, {
          ns: p.metadata.namespace as string,
          name: p.metadata.name,
          done: step.progress.bytesDone,
          total: step.progress.bytesTotal,
        });
      } else if (step.kind === "complete") {
        const stored = await this.record(p, step);
        if (!stored) continue;
        mine.delete(step.session.copyUid);
        this.progress.delete(volumeUid);
        this.joined.set(volumeUid, (this.joined.get(volumeUid) ?? new Set()).add(step.session.bdev));
        this.o.metrics?.completed.inc({ namespace: p.metadata.namespace as string, volume: p.metadata.name });
        log.info("rebuild finished: copy current again", { copy: step.session.copyName });
      } else {
        await this.record(p, step);
      }
      await this.o.afterStep?.(step.kind, key);
    }
    if (mine.size > 0) this.sessions.set(volumeUid, mine);
    else this.sessions.delete(volumeUid);
    this.noteAsked(volumeUid, p, steps, mine);
    if (mine.size === 0) this.progress.delete(volumeUid);
    this.publish();
    return { requeueAfterMs: 1000 };
  }

  /**
   * Whether this node now asks for or holds the volume's slot with no rebuild running: from the
   * pass's view of the slot, updated by the steps it just took (a request adds, a start or a
   * release takes away).
   */
  private noteAsked(
    volumeUid: string,
    p: NVMePartition,
    steps: readonly RebuildStep[],
    mine: ReadonlyMap<string, RebuildSession>,
  ): void {
    const node = this.o.nodeName;
    const slot = p.status?.rebuildSlot;
    let copy = slot && slot.node === node ? slot.uid : undefined;
    for (const s of steps) {
      if (s.kind === "request") copy = s.copyUid;
      else if (copy !== undefined) {
        const held = { replica: "", uid: copy, node, requestedAt: "" };
        const after = applySlotStep(held, node, s);
        if (after && after.slot === undefined) copy = undefined;
      }
    }
    if (copy !== undefined && !mine.has(copy)) this.asked.set(volumeUid, copy);
    else this.asked.delete(volumeUid);
  }

  /**
   * Writes one step into the volume's status (the copy's entry and, under grants, the volume's
   * slot); resolves whether it was stored (or already was). A start under grants is stored only
   * while the latest slot is still granted to that copy and this node.
   */
  private async record(p: NVMePartition, step: RebuildStep): Promise<boolean> {
    const uid = p.metadata.uid;
    const node = this.o.nodeName;
    let applied = false;
    await updateStatus(this.o.partitions, p.metadata.name, p.metadata.namespace, (latest) => {
      applied = false;
      const s = latest.status;
      if (latest.metadata.uid !== uid || !s || s.dataGeneration === undefined) return undefined;
      const replicas = applyRebuildStep(s.replicas ?? [], s.dataGeneration, step);
      const slot = this.o.needsGrant ? applySlotStep(s.rebuildSlot, node, step) : undefined;
      if (step.kind === "start" || step.kind === "progress" || step.kind === "complete") {
        if (!replicas) return undefined;
        if (step.kind === "start" && this.o.needsGrant) {
          const held = s.rebuildSlot;
          if (!held?.grantedAt || held.node !== node || held.uid !== step.entry.uid) return undefined;
        }
      } else if (!replicas && !slot) return undefined;
      applied = true;
      const next: NVMePartitionStatus = { ...s, replicas: replicas ?? s.replicas ?? [] };
      if (slot) {
        if (slot.slot) next.rebuildSlot = slot.slot;
        else delete next.rebuildSlot;
      }
      return next;
    });
    return applied;
  }

  private publish(): void {
    const m = this.o.metrics;
    if (!m) return;
    const rows = [...this.progress.values()];
    m.bytesDone.replace(rows.map((r) => [{ namespace: r.ns, volume: r.name }, r.done] as const));
    m.bytesTotal.replace(rows.map((r) => [{ namespace: r.ns, volume: r.name }, r.total] as const));
  }
}
