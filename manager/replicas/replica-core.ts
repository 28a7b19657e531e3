// The replica set of one replicated volume (an NVMePartition with spec.replicas > 1), as a pure
// function of the volume, its replica partitions and the storage nodes: which replicas to create
// or delete, and what the volume's status.replicas says. The controller carries it out.
//
// A replica is an ordinary NVMePartition with spec.replicaOf naming the volume, so placement puts
// it on a drive through the device ledger exactly as it places any partition, and its agent
// provisions and exports it. What this core adds:
// - one replica per copy, each named <volume>-r<index>, created by the manager;
// - copies on distinct storage nodes (and distinct values of spec.replicaTopologyKey): placement
//   avoids siblings' nodes; when two managers still put two copies on one node, the newer copy
//   of a volume that has never served is deleted and made again elsewhere;
// - the copies' state and generation. A volume that has never served starts at data generation 1
//   with every copy Online once every copy is exported (fresh, all-empty copies are equal). From
//   then on only the node serving the volume lowers a copy (Faulted, Stale: it stops receiving
//   writes) by raising status.dataGeneration over the copies that go on. The manager never raises
//   a copy's generation: a copy that is behind stays behind until a rebuild says otherwise.
import { createHash } from "node:crypto";
import {
  HANDOVER_ANNOTATION,
  isDraining,
  type NVMePartition,
  type NVMePartitionSpec,
  type NVMePartitionStatus,
  type RDMAStorageNode,
  type ReplicaState,
  type ReplicaStatus,
} from "../../api/index.ts";
import { replicaIndex } from "../../lib/volume-identity.ts";
import { copyDrain } from "../drain/drain-core.ts";
import { nodeHealth } from "../node-health.ts";
import type { ConditionInput } from "../status-patch.ts";
import { servingNodeLost } from "./failover.ts";

/** What SPDK's raid1 with a superblock keeps at the start of each member (data_offset). */
export const RAID_SUPERBLOCK_BYTES = 1024 * 1024;

/** Finalizer the manager keeps on a replicated volume until every replica partition is gone. */
export const REPLICAS_FINALIZER = "storage.distort.io/replicas";
/** Label on every replica partition: the UID of the volume it holds a copy of. */
export const REPLICA_OF_LABEL = "storage.distort.io/replica-of";
/** Condition type on a replicated volume: every copy exported and current. */
export const REPLICAS_READY = "ReplicasReady";
/** Condition type on a replicated volume: whether its serving node serves (False during a failover). */
export const SERVING = "Serving";
/** Serving reason once a volume that was not served (a failover, a stuck one) is served again. */
export const SERVED = "Served";

/** A volume holds copies in spec.replicas > 1; a replica names its volume in spec.replicaOf. */
export function isReplicated(p: NVMePartition): boolean {
  return (p.spec.replicas ?? 1) > 1;
}

/** Name of replica `index` of volume `volume` (bounded: a long volume name is cut and hashed). */
export function replicaName(volume: string, index: number): string {
  const suffix = `-r${index}`;
  if (volume.length + suffix.length <= 253) return `${volume}${suffix}`;
  const h = createHash("sha256").update(volume).digest("hex").slice(0, 10);
  return `${volume.slice(0, 253 - suffix.length - h.length - 1).replace(/[-.]+$/, "")}-${h}${suffix}`;
}

export { replicaIndex };

/** The spec of a new replica of `volume`: its size, backend, carving and topology, one copy. */
export function replicaSpec(volume: NVMePartition): NVMePartitionSpec {
  const s = volume.spec;
  const to = s.targetOptions;
  return {
    // Each copy also holds the raid1 superblock area (1 MiB at its start), so the volume serves
    // the size it asked for.
    sizeBytes: s.sizeBytes + RAID_SUPERBLOCK_BYTES,
    backend: s.backend,
    volumeManager: s.volumeManager,
    // The copies are reached by the serving node over the storage fabric, on the volume's
    // transport and port; host authentication between storage nodes is not configured yet.
    targetOptions: {
      transport: to?.transport ?? "rdma",
      ...(to?.portalPort === undefined ? {} : { portalPort: to.portalPort }),
    },
    ...(s.topology ? { topology: s.topology } : {}),
    ...(s.thinProvisioning ? { thinProvisioning: true } : {}),
    replicaOf: { name: volume.metadata.name, uid: volume.metadata.uid as string },
  };
}

export interface ReplicaView {
  node(nodeName: string): RDMAStorageNode | undefined;
  /** Devices with this serial (for a drive's spec.drain); absent: no drive drains. */
  devicesWithSerial?(serial: string): import("../../api/index.ts").NVMeDevice[];
}

export interface ReplicaConfig {
  stalenessMs: number;
}

export interface ReplicaOutcome {
  /** Replica partitions to create (name, spec), in index order. */
  create: { name: string; spec: NVMePartitionSpec }[];
  /** Replica partitions to delete, with the reason (each by name and UID). */
  delete: { name: string; uid: string; why: string }[];
  /** The volume's status fields the manager owns, when they differ from what it holds. */
  status?: { set: Partial<NVMePartitionStatus>; conditions: ConditionInput[] };
  /** Add (true) or remove (false) REPLICAS_FINALIZER; undefined: leave it. */
  finalizer?: boolean;
  /** Events to record on the volume. */
  events: { type: "Normal" | "Warning"; reason: string; note: string }[];
  /** The storage node to serve the volume from (spec.nodeName), when none does yet. */
  serve?: string;
  /**
   * Copies the serving node must be admitted to (one NVMeVolumeAttachment each). `move`: a copy
   * behind the data generation whose admission may still name an earlier serving node (a
   * failover fences and moves only the current copies); moved to this one so that it can
   * rebuild the copy. Never asked while the serving node counts as lost (a failover runs).
   */
  admit: { copy: string; uid: string; node: string; move?: true }[];
  /** Copies whose admission of a serving node is withdrawn (their NVMeVolumeAttachment deleted). */
  unadmit: { copy: string; uid: string }[];
  /**
   * Ask the serving node named here for a planned handover (HANDOVER_ANNOTATION): its node drains,
   * it holds no current copy any more, and spec.replicas current copies are on other nodes.
   */
  handover?: string;
}

/** What a replica partition's own status says, before the volume's generation is considered. */
function observed(r: NVMePartition, view: ReplicaView, nowMs: number, cfg: ReplicaConfig) {
  const st = r.status?.state ?? "Pending";
  if (r.metadata.deletionTimestamp)
    return { kind: "gone" as const, why: "replica partition is being deleted" };
  if (st === "Failed") {
    const ready = r.status?.conditions?.find((c) => c.type === "Ready");
    return { kind: "failed" as const, why: ready?.message ?? "replica partition failed" };
  }
  if (st !== "Exported") return { kind: "pending" as const, why: `replica partition is ${st}` };
  const nodeName = r.spec.nodeName as string;
  const health = nodeHealth(nodeName, view.node(nodeName), nowMs, cfg.stalenessMs);
  if (!health.ok) return { kind: "unreachable" as const, why: `storage node ${nodeName}: ${health.reason}` };
  return { kind: "exported" as const, why: "exported" };
}

/**
 * Decides the replica set of `volume` from its replica partitions `replicas` (every partition
 * whose spec.replicaOf names this volume's UID). Pure.
 */
export function decideReplicas(
  volume: NVMePartition,
  replicas: readonly NVMePartition[],
  view: ReplicaView,
  nowMs: number,
  cfg: ReplicaConfig,
): ReplicaOutcome {
  const out: ReplicaOutcome = { create: [], delete: [], events: [], admit: [], unadmit: [] };
  const uid = volume.metadata.uid as string;
  const mine = replicas
    .filter((r) => r.spec.replicaOf?.uid === uid)
    .sort((a, b) => (replicaIndex(a.metadata.name) ?? 0) - (replicaIndex(b.metadata.name) ?? 0));
  const finalizers = volume.metadata.finalizers ?? [];
  const holds = finalizers.includes(REPLICAS_FINALIZER);

  if (volume.metadata.deletionTimestamp) {
    // The serving node lets go first (its finalizer): only then are the copies' admissions of it
    // withdrawn and the copies deleted, so nothing is cut from under a raid still assembled.
    if (finalizers.some((f) => f !== REPLICAS_FINALIZER)) return out;
    for (const r of mine) {
      const ruid = r.metadata.uid as string;
      out.unadmit.push({ copy: r.metadata.name, uid: ruid });
      if (!r.metadata.deletionTimestamp)
        out.delete.push({ name: r.metadata.name, uid: ruid, why: "volume deleted" });
    }
    if (mine.length === 0 && holds) out.finalizer = false;
    return out;
  }
  if (!holds) out.finalizer = true;

  const want = volume.spec.replicas ?? 1;
  const prior = new Map((volume.status?.replicas ?? []).map((e) => [e.name, e]));
  const served = volume.status?.dataGeneration !== undefined;

  // Two copies on one storage node (or one spread value) protect nothing: placement avoids it,
  // but two managers placing siblings at the same moment can still do it. Before the volume has
  // served, the newer copy is simply made again; after, it has to be rebuilt elsewhere first.
  const spreadKey = volume.spec.replicaTopologyKey;
  const domainOf = (r: NVMePartition): string | undefined => {
    const n = r.spec.nodeName;
    if (!n) return undefined;
    if (!spreadKey) return `node:${n}`;
    const value = view.node(n)?.metadata.labels?.[spreadKey];
    return value === undefined ? `node:${n}` : `${spreadKey}=${value}`;
  };
  const seen = new Map<string, NVMePartition>();
  const duplicate = new Set<string>();
  for (const r of mine) {
    if (r.metadata.deletionTimestamp) continue;
    const d = domainOf(r);
    if (d === undefined) continue;
    const first = seen.get(d);
    if (!first) {
      seen.set(d, r);
      continue;
    }
    duplicate.add(r.metadata.name);
    if (!served) {
      out.delete.push({
        name: r.metadata.name,
        uid: r.metadata.uid as string,
        why: `shares ${d} with replica ${first.metadata.name}; made again elsewhere`,
      });
      out.events.push({
        type: "Warning",
        reason: "ReplicaCoLocated",
        note: `replica ${r.metadata.name} was placed beside ${first.metadata.name} (${d}); it is made again elsewhere`,
      });
    }
  }

  // Drain (of the copy's node or drive). A draining copy that is not current holds nothing the
  // volume needs: it is deleted (its admission withdrawn first). A current one stays until a
  // replacement elsewhere is current too; then it is retired (below) and, once the serving node
  // has lowered it, deleted here.
  const drainOf = new Map<string, string>();
  for (const r of mine) {
    const why = r.metadata.deletionTimestamp ? undefined : copyDrain(r, view);
    if (why) drainOf.set(r.metadata.name, why);
  }
  const dataGen0 = volume.status?.dataGeneration;
  const currentPrev = (name: string) => {
    const e = prior.get(name);
    return (
      e !== undefined &&
      dataGen0 !== undefined &&
      e.generation === dataGen0 &&
      (e.state === "Online" || e.state === "Degraded")
    );
  };
  // A drain stopped after its replacement was made leaves one copy more than spec.replicas. The
  // surplus goes as a drained copy does (one that is not current at once, a current one retired
  // by the serving node first): the raid's spare slot is then free for the next drain. It is the
  // newest copy that is not current, else the newest not on the serving node.
  if (drainOf.size === 0 && duplicate.size === 0) {
    const alive = mine.filter(
      (r) =>
        !r.metadata.deletionTimestamp &&
        r.status?.state !== "Failed" &&
        !out.delete.some((d) => d.name === r.metadata.name),
    );
    if (alive.length > want) {
      const newest = [...alive].sort(
        (a, b) => (replicaIndex(b.metadata.name) ?? 0) - (replicaIndex(a.metadata.name) ?? 0),
      );
      const pick =
        newest.find((r) => !currentPrev(r.metadata.name)) ??
        newest.find((r) => r.spec.nodeName !== volume.spec.nodeName);
      if (pick) drainOf.set(pick.metadata.name, `surplus: ${alive.length} copies for spec.replicas ${want}`);
    }
  }
  for (const r of mine) {
    const why = drainOf.get(r.metadata.name);
    if (!why || out.delete.some((d) => d.name === r.metadata.name) || currentPrev(r.metadata.name)) continue;
    const ruid = r.metadata.uid as string;
    const retired = prior.get(r.metadata.name)?.retiring !== undefined;
    out.unadmit.push({ copy: r.metadata.name, uid: ruid });
    out.delete.push({
      name: r.metadata.name,
      uid: ruid,
      why: retired ? `retired (${why})` : `not current (${why}): holds nothing the volume needs`,
    });
    out.events.push({
      type: "Normal",
      reason: "ReplicaMoved",
      note: `replica ${r.metadata.name} on node ${r.spec.nodeName} removed for ${why}${retired ? " after its replacement became current and the serving node retired it" : " (it was not current)"}`,
    });
  }

  // Live copies: not being deleted and not failed. Missing ones are created at free indices;
  // while copies drain, one more than the volume has (the raid's spare slot), so the copies that
  // stay reach spec.replicas before a draining one is retired.
  const live = mine.filter(
    (r) =>
      !r.metadata.deletionTimestamp &&
      r.status?.state !== "Failed" &&
      !out.delete.some((d) => d.name === r.metadata.name),
  );
  const used = new Set(mine.map((r) => replicaIndex(r.metadata.name)));
  const staying = live.filter((r) => !drainOf.has(r.metadata.name)).length;
  const draining = live.length - staying;
  const missing0 = draining > 0 ? Math.min(want - staying, want + 1 - live.length) : want - live.length;
  if (draining > 0 && missing0 > 0)
    out.events.push({
      type: "Normal",
      reason: "ReplicaReplacing",
      note: `a replacement copy is created for ${[...new Set([...drainOf.values()])].join(", ")}; the draining copy stays until it is current`,
    });
  for (let i = 0, missing = missing0; missing > 0 && i < 2 * want + 8; i++) {
    if (used.has(i)) continue;
    out.create.push({ name: replicaName(volume.metadata.name, i), spec: replicaSpec(volume) });
    used.add(i);
    missing--;
  }

  // The copies' entries.
  const facts = mine.map((r) => ({ r, o: observed(r, view, nowMs, cfg), prev: prior.get(r.metadata.name) }));
  const allExported = facts.filter((f) => f.o.kind === "exported").length >= want && duplicate.size === 0;
  const startGeneration = !served && allExported ? 1 : undefined;
  const dataGeneration = volume.status?.dataGeneration ?? startGeneration;
  const entries: ReplicaStatus[] = [];
  for (const { r, o, prev } of facts) {
    if (o.kind === "gone" && !prev) continue;
    let state: ReplicaState;
    let generation = prev?.generation ?? 0;
    let message: string | undefined = o.why;
    if (startGeneration !== undefined && o.kind === "exported") {
      state = "Online";
      generation = startGeneration;
      message = undefined;
    } else if (o.kind === "failed" || o.kind === "gone") {
      state = "Faulted";
    } else if (prev && (prev.state === "Faulted" || prev.state === "Stale" || prev.state === "Rebuilding")) {
      // Only the serving node (a rebuild) brings a lowered copy back.
      state = prev.state;
      message = prev.message;
    } else if (dataGeneration !== undefined && generation === dataGeneration) {
      state = o.kind === "exported" ? "Online" : "Degraded";
      if (o.kind === "exported") message = undefined;
    } else if (dataGeneration !== undefined) {
      // Exported but behind (a new copy of a volume that has served): a rebuild must fill it.
      state = o.kind === "pending" ? "Pending" : "Stale";
      message =
        o.kind === "pending"
          ? o.why
          : `holds generation ${generation} of ${dataGeneration}; joins through a rebuild`;
    } else {
      state = "Pending";
    }
    entries.push({
      name: r.metadata.name,
      ...(r.metadata.uid ? { uid: r.metadata.uid } : {}),
      ...(r.spec.nodeName ? { nodeName: r.spec.nodeName } : {}),
      ...(r.spec.deviceSerial ? { deviceSerial: r.spec.deviceSerial } : {}),
      state,
      generation,
      ...(message ? { message: message.slice(0, 1024) } : {}),
      // The serving node's progress of a running rebuild is its to write, not to be dropped here.
      ...(state === "Rebuilding" && prev?.rebuild ? { rebuild: prev.rebuild } : {}),
      // Kept only while the copy still drains (a drain stopped before the serving node acted
      // leaves the copy in place).
      ...(prev?.retiring && drainOf.has(r.metadata.name) ? { retiring: prev.retiring } : {}),
    });
  }
  for (const c of out.create)
    entries.push({ name: c.name, state: "Pending", generation: 0, message: "being created" });

  // The serving node: chosen once, among the nodes of copies that are online and current (its own
  // copy then needs no other node to be up); it reaches every current copy over the fabric.
  const isCurrent = (e: ReplicaStatus) =>
    dataGeneration !== undefined &&
    e.generation === dataGeneration &&
    (e.state === "Online" || e.state === "Degraded");
  // Retire one draining current copy at a time, and only while the copies that go on without it
  // (current, not retiring) are at least spec.replicas: redundancy never drops during a drain.
  const deleting = new Set(out.delete.map((d) => d.name));
  if (
    dataGeneration !== undefined &&
    !entries.some((e) => e.retiring && isCurrent(e)) &&
    (volume.status?.replicas ?? []).length > 0
  ) {
    for (const e of entries) {
      const why = drainOf.get(e.name);
      if (!why || !isCurrent(e) || deleting.has(e.name)) continue;
      const others = entries.filter((x) => x !== e && isCurrent(x) && !x.retiring && !deleting.has(x.name));
      if (others.length < want) break;
      e.retiring = why;
      out.events.push({
        type: "Normal",
        reason: "ReplicaRetiring",
        note: `replica ${e.name} on node ${e.nodeName} is retired for ${why}: ${others.map((x) => x.name).join(", ")} current; the serving node takes it out of its raid`,
      });
      break;
    }
  }
  if (dataGeneration !== undefined && !volume.spec.nodeName) {
    const first =
      entries.find(
        (e) => e.state === "Online" && e.generation === dataGeneration && e.nodeName && !drainOf.has(e.name),
      ) ?? entries.find((e) => e.state === "Online" && e.generation === dataGeneration && e.nodeName);
    if (first?.nodeName) out.serve = first.nodeName;
  }
  // A copy being deleted (or deleted now) is admitted to nobody: its deletion waits for its
  // admission to go, so the withdrawal is repeated until it is gone.
  const goingAway = new Set([
    ...mine.filter((r) => r.metadata.deletionTimestamp && served).map((r) => r.metadata.name),
    ...out.delete.map((d) => d.name),
  ]);
  for (const r of mine)
    if (r.metadata.deletionTimestamp && served && !out.unadmit.some((u) => u.copy === r.metadata.name))
      out.unadmit.push({ copy: r.metadata.name, uid: r.metadata.uid as string });
  const serving = out.serve ?? volume.spec.nodeName;
  if (serving) {
    const settled = !servingNodeLost({ ...volume, spec: { ...volume.spec, nodeName: serving } }, view, nowMs);
    for (const e of entries) {
      if (goingAway.has(e.name)) continue;
      if (isCurrent(e) && e.uid) out.admit.push({ copy: e.name, uid: e.uid, node: serving });
      else if (
        settled &&
        e.uid &&
        dataGeneration !== undefined &&
        (e.state === "Stale" || e.state === "Faulted") &&
        !drainOf.has(e.name)
      )
        out.admit.push({ copy: e.name, uid: e.uid, node: serving, move: true });
    }
  }

  // A serving node that drains hands the volume over, once its own copy is replaced and retired
  // (so the copies that go on are spec.replicas without it): a planned failover, see failover.ts.
  const sv = volume.spec.nodeName;
  if (
    sv &&
    dataGeneration !== undefined &&
    isDraining(view.node(sv)) &&
    volume.metadata.annotations?.[HANDOVER_ANNOTATION] !== sv
  ) {
    const localCurrent = entries.some((e) => e.nodeName === sv && isCurrent(e));
    const elsewhere = entries.filter(
      (e) => isCurrent(e) && !e.retiring && e.nodeName !== sv && !drainOf.has(e.name),
    );
    if (!localCurrent && elsewhere.length >= want) {
      out.handover = sv;
      out.events.push({
        type: "Normal",
        reason: "HandoverRequested",
        note: `serving node ${sv} drains: asked to release the volume so that ${elsewhere[0]?.nodeName} serves it`,
      });
    }
  }

  const online = entries.filter((e) => e.state === "Online").length;
  const current = entries.filter(
    (e) =>
      dataGeneration !== undefined &&
      e.generation === dataGeneration &&
      (e.state === "Online" || e.state === "Degraded"),
  ).length;
  let cond: ConditionInput;
  if (online >= want) {
    cond = {
      type: REPLICAS_READY,
      status: "True",
      reason: "AllReplicasOnline",
      message: `${online}/${want} replicas online`,
    };
  } else if (dataGeneration === undefined) {
    const placed = mine.filter((r) => r.spec.nodeName).length;
    cond = {
      type: REPLICAS_READY,
      status: "False",
      reason: "ReplicasPending",
      message: `${placed}/${want} replicas placed, ${facts.filter((f) => f.o.kind === "exported").length}/${want} exported`,
    };
  } else if (current === 0) {
    cond = {
      type: REPLICAS_READY,
      status: "False",
      reason: "NoCurrentReplica",
      message: `no replica holds generation ${dataGeneration}: the volume cannot serve without losing acknowledged writes`,
    };
  } else {
    cond = {
      type: REPLICAS_READY,
      status: "False",
      reason: "Degraded",
      message: `${online}/${want} replicas online, ${current} current at generation ${dataGeneration}`,
    };
  }
  cond.observedGeneration = volume.metadata.generation;

  const set: Partial<NVMePartitionStatus> = { replicas: entries };
  if (startGeneration !== undefined && !served) set.dataGeneration = startGeneration;
  const placedAll = entries.length >= want && entries.every((e) => e.nodeName);
  const state = volume.status?.state ?? "Pending";
  if (state === "Pending" && placedAll) set.state = "Placed";
  const conditions = [cond];
  const servingNow = servingCondition(volume, view, nowMs, cfg);
  if (servingNow) conditions.push(servingNow);
  const changed =
    JSON.stringify(volume.status?.replicas ?? []) !== JSON.stringify(entries) ||
    (set.dataGeneration !== undefined && set.dataGeneration !== volume.status?.dataGeneration) ||
    (set.state !== undefined && set.state !== state) ||
    !sameCondition(volume, cond) ||
    servingNow !== undefined;
  if (changed) out.status = { set, conditions };
  if (startGeneration !== undefined && !served)
    out.events.push({
      type: "Normal",
      reason: "ReplicasOnline",
      note: `${want} replicas exported on ${entries.map((e) => e.nodeName).join(", ")}; data generation 1`,
    });
  return out;
}

/**
 * The Serving condition to write once volume `volume` is served again, or undefined when there is
 * nothing to change. Every path that says Serving False (a failover fencing, a stuck failover, a
 * refused accept-data-loss) writes it while the serving node counts as lost; when that node is
 * back (its heartbeat within the volume's failover bound and healthy), or another node was named
 * and is, the volume serves and a False left behind is stale: it becomes True (Served, naming the
 * node). Only a False is replaced: a True (Served, FailedOver) or no condition at all is left as
 * it is, so this never writes twice. Pure.
 */
export function servingCondition(
  volume: NVMePartition,
  view: ReplicaView,
  nowMs: number,
  cfg: ReplicaConfig,
): ConditionInput | undefined {
  const have = volume.status?.conditions?.find((c) => c.type === SERVING);
  const node = volume.spec.nodeName;
  if (have?.status !== "False" || !node || volume.metadata.deletionTimestamp) return undefined;
  if (volume.status?.dataGeneration === undefined) return undefined;
  if (servingNodeLost(volume, view, nowMs)) return undefined;
  if (!nodeHealth(node, view.node(node), nowMs, cfg.stalenessMs).ok) return undefined;
  return {
    type: SERVING,
    status: "True",
    reason: SERVED,
    message: `served from node ${node}`,
    observedGeneration: volume.metadata.generation,
  };
}

function sameCondition(volume: NVMePartition, c: ConditionInput): boolean {
  const have = volume.status?.conditions?.find((x) => x.type === c.type);
  return (
    have !== undefined &&
    have.status === c.status &&
    have.reason === c.reason &&
    have.message === c.message &&
    have.observedGeneration === c.observedGeneration
  );
}
