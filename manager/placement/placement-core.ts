// The placement decision for one NVMePartition, as a pure function of the partition and what the
// manager observes: which claimed device on a healthy node gets it, or why none can. The
// controller carries out the decision (reserve in the device ledger, then write the spec).
import {
  type ClaimRef,
  isCordoned,
  type NVMeDevice,
  type NVMeDeviceClaim,
  type NVMePartition,
  type NVMePartitionStatus,
  type RDMAStorageNode,
} from "../../api/index.ts";
import { type DeviceUsage, lvstoreFullness, overcommitRatioOf, roomFor } from "../../lib/device-ledger.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { formatBytes, roundUpToUnit } from "../../lib/units.ts";
import { nodeHealth } from "../node-health.ts";
import { claimKeyOf, verifyOwner } from "../ownership.ts";
import type { StatusPatch } from "../status-patch.ts";
import { ConditionTypes } from "../vocabulary.ts";
import { topologyRank } from "./topology.ts";

/**
 * Order among devices that satisfy everything (after topology preference):
 * most-free-device packs by free bytes; least-loaded-node spreads partitions across nodes first.
 */
export type SpreadPolicy = "most-free-device" | "least-loaded-node";

export interface PlacementConfig {
  /** A node whose last heartbeat is older than this is not used. */
  stalenessMs: number;
  policy: SpreadPolicy;
  /** Requeue delay while unschedulable: grows with time spent unschedulable, within [initial, max]. */
  backoff: { initialMs: number; maxMs: number };
  /**
   * A thin partition is not placed on a drive whose lvstore the agent reported fuller than this
   * percentage (status.lvstore); absent: 85. Thick partitions own their clusters from creation.
   */
  thinLvstoreFullPercent?: number;
}

/** Default of PlacementConfig.thinLvstoreFullPercent (and the chart's lvstore alert). */
export const DEFAULT_THIN_LVSTORE_FULL_PERCENT = 85;

/** What placement reads. The inventory implements it over watch caches; tests over arrays. */
export interface PlacementView {
  devices(): Iterable<NVMeDevice>;
  /** A claim by "namespace/name". */
  claim(key: string): NVMeDeviceClaim | undefined;
  /** The RDMAStorageNode describing Kubernetes node `nodeName`. */
  node(nodeName: string): RDMAStorageNode | undefined;
  /** Ledger plus placed partitions of a device. */
  usage(device: NVMeDevice): DeviceUsage;
}

/** Condition reasons for Scheduled=False, from "nothing to place on" to "almost fits". */
export type UnschedulableReason =
  | "NoClaimedDevice"
  | "NodeStale"
  | "NodeNotReady"
  /** The drive or its storage node is cordoned (spec.unschedulable) or draining (spec.drain). */
  | "Cordoned"
  | "BackendLocked"
  | "TopologyMismatch"
  | "InsufficientCapacity"
  /** Only for thin partitions: every drive with room has an lvstore above the fullness limit. */
  | "LvstoreFull"
  /** A replica: every usable node already holds a copy of its volume (or shares its spread value). */
  | "ReplicaAntiAffinity"
  /** A clone or restore whose source's drive is unknown, or whose source drive is unusable. */
  | "SourceUnavailable";

/**
 * Where a replica must not go: the storage nodes of its volume's other copies (placed, or held
 * in a device ledger), and, with the volume's spec.replicaTopologyKey, any node whose value of
 * that label another copy's node already has (nodes without the label are left out too).
 */
export interface ReplicaSpread {
  /** Storage node -> the sibling replica there. */
  avoidNodes: ReadonlyMap<string, string>;
  key?: string;
  /** Label value of `key` -> the sibling replica holding it. */
  avoidValues: ReadonlyMap<string, string>;
}

/**
 * Where a partition with spec.contentSource must go: the drive (lvstore) holding its source. The
 * shell resolves it; `serial` undefined means the source could not be found (with `why`).
 */
export interface SourcePin {
  serial?: string;
  why: string;
}

export interface Reserve {
  type: "reserve";
  device: string;
  nodeName: string;
  serial: string;
  claimRef: ClaimRef;
  /** Rounded size to promise in the ledger. */
  bytes: number;
  /** The partition already holds a ledger entry on this device (an earlier attempt got that far). */
  reuse: boolean;
}

export type PlacementAction =
  | Reserve
  /** Write spec.nodeName/deviceSerial/claimRef; only after the reserve before it succeeded. */
  | { type: "assign"; nodeName: string; serial: string; claimRef: ClaimRef }
  | { type: "event"; eventType: "Normal" | "Warning"; reason: string; note: string };

export interface PlacementOutcome {
  /**
   * Run in order; a reserve that fails ends the sequence (the controller decides again). After a
   * successful assign, the controller decides again on the returned object to get its status.
   */
  actions: PlacementAction[];
  status?: StatusPatch<NVMePartitionStatus>;
  requeueAfterMs?: number;
  /** For metrics: what this decision amounts to. */
  result: "placed" | "unschedulable" | "already-placed" | "ignored";
  /**
   * Unschedulable only: devices left out because the device names a claim the view does not
   * show as its bound owner (missing, or not yet Bound). That is what a view looks like while
   * its caches catch up with each other (a new leader's claim list older than its device list,
   * a bind half-way), so such a refusal may be transient; the controller may wait before
   * writing it.
   */
  settling?: number;
}

/** Initial status of a partition the manager writes first. */
export const INITIAL_PARTITION_STATUS: NVMePartitionStatus = { state: "Pending", conditions: [] };

interface Candidate {
  device: NVMeDevice;
  claimRef: ClaimRef;
  freeBytes: number;
  rank: number;
  load: number;
  reuse: boolean;
}

const STAGE: Record<UnschedulableReason, number> = {
  NoClaimedDevice: 0,
  NodeStale: 1,
  NodeNotReady: 1,
  Cordoned: 1,
  BackendLocked: 2,
  TopologyMismatch: 3,
  ReplicaAntiAffinity: 3,
  InsufficientCapacity: 4,
  LvstoreFull: 4,
  SourceUnavailable: 5,
};

/**
 * Decides placement of `p`. Pure: everything comes from `view`, `nowMs` and `cfg`.
 * - Deleting and unplaced: nothing to do. Already placed: make sure Scheduled=True says so.
 * - Otherwise the candidates are devices owned by a live bound claim, on a healthy node, not
 *   locked to another backend, inside the requisite topology, with room for the rounded size
 *   (or already holding this partition's ledger entry, which wins outright). The best candidate by
 *   topology preference then `cfg.policy` gets reserve + assign; with none, Scheduled=False names
 *   the reason that got furthest and the partition is requeued with backoff.
 */
export function decidePlacement(
  p: NVMePartition,
  view: PlacementView,
  nowMs: number,
  cfg: PlacementConfig,
  pin?: SourcePin,
  spread?: ReplicaSpread,
): PlacementOutcome {
  const generation = p.metadata.generation;
  // A replicated volume lives in its replicas, each placed on its own; the volume itself is not.
  if ((p.spec.replicas ?? 1) > 1) return { actions: [], result: "ignored" };
  const scheduled = findCondition(p.status?.conditions ?? [], ConditionTypes.Scheduled);
  if (p.spec.nodeName && p.spec.deviceSerial) {
    const current =
      scheduled?.status === "True" &&
      scheduled.observedGeneration === generation &&
      (p.status?.state ?? "Pending") !== "Pending";
    if (current) return { actions: [], result: "already-placed" };
    const msg = `placed on node ${p.spec.nodeName}, device serial ${p.spec.deviceSerial}`;
    return { actions: [], status: placedStatus(p, generation, msg), result: "already-placed" };
  }
  if (p.metadata.deletionTimestamp || !p.metadata.uid) return { actions: [], result: "ignored" };

  const bytes = roundUpToUnit(p.spec.sizeBytes);
  const uid = p.metadata.uid;
  const rejected: Record<UnschedulableReason, string[]> = {
    NoClaimedDevice: [],
    NodeStale: [],
    NodeNotReady: [],
    Cordoned: [],
    BackendLocked: [],
    TopologyMismatch: [],
    InsufficientCapacity: [],
    LvstoreFull: [],
    ReplicaAntiAffinity: [],
    SourceUnavailable: [],
  };
  let unlabelled = 0;
  const thin = p.spec.thinProvisioning === true;
  const fullLimit = (cfg.thinLvstoreFullPercent ?? DEFAULT_THIN_LVSTORE_FULL_PERCENT) / 100;
  let fullest = 0;
  // A clone shares its source's lvstore: only that drive can hold it (no most-free choice).
  if (pin && pin.serial === undefined)
    return unschedulable(p, scheduled, nowMs, cfg, "SourceUnavailable", pin.why);
  const nodeDetail = new Map<string, string>();
  const lockedTo = new Set<string>();
  const cordoned = new Set<string>();
  let mostFree = Number.NEGATIVE_INFINITY;
  let total = 0;
  let settling = 0;
  const loads = new Map<string, number>();
  const candidates: Candidate[] = [];

  for (const d of view.devices()) {
    if (pin && d.spec.serial !== pin.serial) continue;
    total++;
    const key = claimKeyOf(d);
    const own = verifyOwner(d, key ? view.claim(key) : undefined);
    if (!own.ok) {
      rejected.NoClaimedDevice.push(d.metadata.name);
      if (own.problem === "ClaimMissing" || own.problem === "ClaimNotBound") settling++;
      continue;
    }
    const usage = view.usage(d);
    const nodeName = d.spec.nodeName;
    loads.set(nodeName, (loads.get(nodeName) ?? 0) + usage.holders.size);
    const node = view.node(nodeName);
    const health = nodeHealth(nodeName, node, nowMs, cfg.stalenessMs);
    if (!health.ok) {
      const stale = health.reason === "HeartbeatStale" || health.reason === "NoHeartbeat";
      rejected[stale ? "NodeStale" : "NodeNotReady"].push(d.metadata.name);
      nodeDetail.set(nodeName, health.reason);
      continue;
    }
    // Cordoned or draining (the node, or this drive): nothing new goes there.
    if (isCordoned(node) || isCordoned(d)) {
      rejected.Cordoned.push(d.metadata.name);
      const what = isCordoned(node) ? `node ${nodeName}` : `device ${d.metadata.name}`;
      const how = (isCordoned(node) ? node?.spec.drain : d.spec.drain) ? "draining" : "cordoned";
      cordoned.add(`${what} ${how}`);
      continue;
    }
    const locked = d.status?.activeBackend;
    if (locked && locked !== p.spec.backend) {
      rejected.BackendLocked.push(d.metadata.name);
      lockedTo.add(locked);
      continue;
    }
    const rank = topologyRank(p.spec.topology, node?.metadata.labels ?? {});
    if (rank === undefined) {
      rejected.TopologyMismatch.push(d.metadata.name);
      continue;
    }
    if (spread) {
      const value = spread.key === undefined ? undefined : node?.metadata.labels?.[spread.key];
      if (spread.key !== undefined && value === undefined) unlabelled++;
      if (
        spread.avoidNodes.has(nodeName) ||
        (spread.key !== undefined && (value === undefined || spread.avoidValues.has(value)))
      ) {
        rejected.ReplicaAntiAffinity.push(d.metadata.name);
        continue;
      }
    }
    const reuse = usage.holders.get(uid)?.inLedger === true;
    // Thin: all holders within allocatable x the claim's ratio; thick: also physically.
    const room = roomFor(d, usage, overcommitRatioOf(key ? view.claim(key) : undefined), thin);
    if (!reuse && room < bytes) {
      rejected.InsufficientCapacity.push(d.metadata.name);
      mostFree = Math.max(mostFree, room);
      continue;
    }
    const full = thin ? lvstoreFullness(d) : undefined;
    if (!reuse && full !== undefined && full > fullLimit) {
      rejected.LvstoreFull.push(d.metadata.name);
      fullest = Math.max(fullest, full);
      continue;
    }
    candidates.push({ device: d, claimRef: own.claimRef, freeBytes: room, rank, load: 0, reuse });
  }

  if (candidates.length > 0) {
    for (const c of candidates) c.load = loads.get(c.device.spec.nodeName) ?? 0;
    const best = candidates.find((c) => c.reuse) ?? candidates.sort(compareFor(cfg.policy))[0]!;
    const d = best.device;
    const where = `node ${d.spec.nodeName}, device ${d.metadata.name} (serial ${d.spec.serial})`;
    return {
      actions: [
        {
          type: "reserve",
          device: d.metadata.name,
          nodeName: d.spec.nodeName,
          serial: d.spec.serial,
          claimRef: best.claimRef,
          bytes,
          reuse: best.reuse,
        },
        { type: "assign", nodeName: d.spec.nodeName, serial: d.spec.serial, claimRef: best.claimRef },
        {
          type: "event",
          eventType: "Normal",
          reason: "Placed",
          note: `placed on ${where}; ${formatBytes(bytes)} reserved`,
        },
      ],
      // No status here: the assign bumps metadata.generation, so the controller decides again on
      // the object the assign returned, which takes the already-placed branch with the right one.
      result: "placed",
    };
  }

  const reason = pickReason(rejected);
  const parts: string[] = [];
  const n = (r: UnschedulableReason) => rejected[r].length;
  if (n("InsufficientCapacity"))
    parts.push(
      `${n("InsufficientCapacity")} without room${thin ? " within the overcommit ratio" : ""} (most free ${formatBytes(Math.max(0, mostFree))})`,
    );
  if (n("LvstoreFull"))
    parts.push(
      `${n("LvstoreFull")} with an lvstore above ${Math.round(fullLimit * 100)}% full, too full for new thin volumes (fullest ${Math.round(fullest * 100)}%)`,
    );
  if (n("TopologyMismatch")) parts.push(`${n("TopologyMismatch")} outside the requested topology`);
  if (n("ReplicaAntiAffinity")) {
    const others = [...new Set(spread?.avoidNodes.keys() ?? [])].sort();
    const key = spread?.key;
    parts.push(
      `${n("ReplicaAntiAffinity")} on nodes that ${key ? `share a ${key} value with` : "already hold"} another replica of this volume (${listed(others)})${key && unlabelled ? `, ${unlabelled} of them on nodes without the label ${key}` : ""}`,
    );
  }
  if (n("BackendLocked"))
    parts.push(`${n("BackendLocked")} locked to backend ${[...lockedTo].sort().join(", ")}`);
  const nodesWith = (pred: (r: string) => boolean) =>
    [...nodeDetail]
      .filter(([, r]) => pred(r))
      .map(([node, r]) => `${node}: ${r}`)
      .sort();
  if (n("NodeStale"))
    parts.push(
      `${n("NodeStale")} on stale nodes (${listed(nodesWith((r) => r === "HeartbeatStale" || r === "NoHeartbeat"))})`,
    );
  if (n("NodeNotReady"))
    parts.push(
      `${n("NodeNotReady")} on unusable nodes (${listed(nodesWith((r) => r !== "HeartbeatStale" && r !== "NoHeartbeat"))})`,
    );
  if (n("Cordoned")) parts.push(`${n("Cordoned")} cordoned or draining (${listed([...cordoned].sort())})`);
  if (n("NoClaimedDevice")) parts.push(`${n("NoClaimedDevice")} not owned by a live bound claim`);
  if (pin && total === 0)
    return unschedulable(
      p,
      scheduled,
      nowMs,
      cfg,
      "SourceUnavailable",
      `${pin.why}: no NVMeDevice with serial ${pin.serial}`,
    );
  const message =
    total === 0
      ? `no NVMeDevice exists to hold ${formatBytes(bytes)}`
      : `0/${total} devices can hold ${formatBytes(bytes)} (${p.spec.backend}${thin ? ", thin" : ""}): ${parts.join("; ")}${pin ? ` (${pin.why})` : ""}`;
  const out = unschedulable(p, scheduled, nowMs, cfg, reason, message);
  return settling > 0 ? { ...out, settling } : out;
}

function unschedulable(
  p: NVMePartition,
  scheduled: ReturnType<typeof findCondition>,
  nowMs: number,
  cfg: PlacementConfig,
  reason: UnschedulableReason,
  message: string,
): PlacementOutcome {
  const generation = p.metadata.generation;
  return {
    actions: [{ type: "event", eventType: "Warning", reason: "FailedPlacement", note: message }],
    status: {
      set: p.status?.state ? {} : { state: "Pending" },
      conditions: [
        { type: ConditionTypes.Scheduled, status: "False", reason, message, observedGeneration: generation },
      ],
    },
    requeueAfterMs: backoffMs(
      scheduled?.status === "False" ? scheduled.lastTransitionTime : undefined,
      nowMs,
      cfg,
    ),
    result: "unschedulable",
  };
}

function placedStatus(
  p: NVMePartition,
  generation: number | undefined,
  message: string,
): StatusPatch<NVMePartitionStatus> {
  const state = p.status?.state;
  return {
    set: !state || state === "Pending" ? { state: "Placed" } : {},
    conditions: [
      {
        type: ConditionTypes.Scheduled,
        status: "True",
        reason: "Placed",
        message,
        observedGeneration: generation,
      },
    ],
  };
}

function listed(items: string[], max = 5): string {
  return items.length > max
    ? `${items.slice(0, max).join(", ")} and ${items.length - max} more`
    : items.join(", ");
}

/** The reason at the furthest stage any device reached; among node problems, the commoner one. */
function pickReason(rejected: Record<UnschedulableReason, string[]>): UnschedulableReason {
  let best: UnschedulableReason = "NoClaimedDevice";
  for (const r of Object.keys(rejected) as UnschedulableReason[]) {
    const n = rejected[r].length;
    if (n === 0) continue;
    const better = STAGE[r] > STAGE[best] || (STAGE[r] === STAGE[best] && n > rejected[best].length);
    if (better || rejected[best].length === 0) best = r;
  }
  return best;
}

/**
 * Delay before the next attempt: as long as the partition has already been unschedulable
 * (doubling the wait on each retry, level-triggered from the condition's lastTransitionTime), at
 * least initialMs and at most maxMs. Changes that can add room also requeue it at once.
 */
export function backoffMs(
  unschedulableSince: string | undefined,
  nowMs: number,
  cfg: PlacementConfig,
): number {
  const since = unschedulableSince ? Date.parse(unschedulableSince) : Number.NaN;
  const elapsed = Number.isNaN(since) ? 0 : nowMs - since;
  return Math.min(cfg.backoff.maxMs, Math.max(cfg.backoff.initialMs, elapsed));
}

function compareFor(policy: SpreadPolicy): (a: Candidate, b: Candidate) => number {
  const byName = (a: Candidate, b: Candidate) =>
    a.device.metadata.name < b.device.metadata.name
      ? -1
      : a.device.metadata.name > b.device.metadata.name
        ? 1
        : 0;
  if (policy === "least-loaded-node") {
    return (a, b) => a.rank - b.rank || a.load - b.load || b.freeBytes - a.freeBytes || byName(a, b);
  }
  return (a, b) => a.rank - b.rank || b.freeBytes - a.freeBytes || a.load - b.load || byName(a, b);
}
