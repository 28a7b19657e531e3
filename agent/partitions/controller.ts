// The node-local partition reconciler (the imperative shell around decide.ts): reads the agent's
// shared caches of this node's partitions and drives and of the attachments, and drives the
// backend and volume-manager ports through provisioning (13 steps) and deletion (reverse).
// Every step is idempotent; `afterStep` lets tests crash the process between any two of them.
import { createHash } from "node:crypto";
import type {
  NVMeDevice,
  NVMePartition,
  NVMeSnapshot,
  NVMeVolumeAttachment,
  PortalStatus,
} from "../../api/index.ts";
import { HANDOVER_ANNOTATION, kinds } from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import { dropLeftover, markLeftover } from "../../lib/device-ledger.ts";
import { StorageError } from "../../lib/errors.ts";
import type { WatchCache } from "../../lib/kube/cache.ts";
import type { Condition } from "../../lib/kube/conditions.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import type { ControllerManager } from "../../lib/kube/controller-manager.ts";
import type { EventRecorder } from "../../lib/kube/events.ts";
import { WorkQueue } from "../../lib/kube/queue.ts";
import { type KubeObject, objectKey, ResourceClient, splitKey } from "../../lib/kube/resource.ts";
import { TerminalError } from "../../lib/kube/runner.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import { formatQuantity } from "../../lib/units.ts";
import {
  cntlidRangeFor,
  externalIdFor,
  nexusBdevFor,
  nqnFor,
  replicaIndex,
} from "../../lib/volume-identity.ts";
import { isPartitionRecord } from "../attachments/partition-record.ts";
import {
  type BackendName,
  type DeviceRef,
  DRIVE_MISSING,
  type ExportSpec,
  type QosLimits,
  type TargetBackend,
  TLS_UNSUPPORTED,
  type Transport,
  type Volume,
  type VolumeManager,
  type VolumeManagerName,
} from "../backends/types.ts";
import { inReleaseNamespace, onNode } from "../caches.ts";
import { NexusAssembler, type NexusSpdk, UNREACHABLE_COPIES } from "../nexus/assembler.ts";
import {
  currentCopies,
  decideNexus,
  isReplicatedVolume,
  NEXUS_REASONS,
  type NexusPlan,
  type NexusTeardown,
} from "../nexus/decide.ts";
import { nexusControllerNameFor } from "../nexus/identity.ts";
import { DEFAULT_REBUILDS_PER_NODE, RebuildDriver, type RebuildMetrics } from "../nexus/rebuild-driver.ts";
import { selfFenceDue, selfFenceLifted } from "../nexus/self-fence.ts";
import { DRIVE_NOT_BLANK } from "../volumes/spdk-lvol/manager.ts";
import { aclLocks } from "./acl-lock.ts";
import {
  backendOf,
  DATA_ON_LOST_DEVICE,
  DEVICE_STATUS_REASONS,
  decide,
  isUnlimited,
  PARTITION_FINALIZER,
  type ResolvedSource,
  resolveVolumeManager,
  type Target,
  type Why,
} from "./decide.ts";
import { deviceChangeMatters } from "./device-change.ts";
import { addFinalizerOps } from "./finalizer-patch.ts";
import { keyedAclFor, type SecretReader } from "./host-keys.ts";
import { serialNumberFor } from "./identity.ts";
import { type LeftoverPlan, leftoversToClean } from "./leftovers.ts";
import { RestartRepairs, type RestartSummary } from "./restart-repairs.ts";
import { cachedStatusHolds, partitionStatusWrite } from "./status-unchanged.ts";

/** Work-queue keys of drives whose leftover volumes are to be deleted (partition keys hold a "/"). */
const LEFTOVERS_KEY = "leftovers:";

/** How often a partition whose drive is missing for its backend (or not blank) looks again. */
const DRIVE_MISSING_RETRY_MS = 60_000;

/** Steps after which a crash is meaningful (each one changed external or API state). */
export const PROVISION_STEPS = [
  "finalizer",
  "device-lock",
  "prepare-device",
  "layout",
  "volume",
  "export",
  "qos",
  "acl",
  "status",
] as const;
export const DEPROVISION_STEPS = ["unexport", "delete-volume", "finalizer-removed"] as const;
/** Steps of a replicated volume's serving node beyond the shared ones (export, acl, status...). */
export const NEXUS_STEPS = [
  "nexus-raid",
  "nexus-degrade",
  "nexus-retire",
  "nexus-retired",
  "nexus-release",
  "nexus-released",
  "nexus-teardown",
  "standby-export",
  "standby-acl",
  "standby-unexport",
  "rebuild-start",
  "rebuild-progress",
  "rebuild-complete",
  "rebuild-abort",
  "rebuild-wait",
  "rebuild-request",
  "self-fence",
] as const;
export type Step =
  | (typeof PROVISION_STEPS)[number]
  | (typeof DEPROVISION_STEPS)[number]
  | (typeof NEXUS_STEPS)[number];

/** Same paths in the same order (ANA states included); key order does not matter. */
function sameList(a: readonly PortalStatus[] | undefined, b: readonly PortalStatus[]): boolean {
  const key = (l: PortalStatus) => `${l.address}|${l.port}|${l.anaState ?? ""}`;
  return (a ?? []).map(key).join(",") === b.map(key).join(",");
}

export interface Portal {
  address: string;
  port: number;
}

export interface PartitionControllerOptions {
  conn: KubeConnection;
  /** Runs this controller; its caches come from the manager's CacheSet (shared with the others). */
  manager: ControllerManager;
  nodeName: string;
  /**
   * The release namespace: the only one whose partitions, attachments and snapshots this agent
   * watches and acts on (a tenant's look-alike objects in its own namespace are never seen).
   */
  namespace: string;
  backends: Partial<Record<BackendName, TargetBackend>>;
  volumeManagers: Partial<Record<VolumeManagerName, VolumeManager>>;
  /** This node's NVMe-oF endpoint for a transport; undefined while none is usable. */
  portal(transport: Transport): Promise<Portal | undefined>;
  /**
   * Further addresses of this node every export also listens on (same transport and port as the
   * primary portal), for multipath; none by default.
   */
  morePortalAddresses?: readonly string[];
  logger: Logger;
  clock: Clock;
  events?: EventRecorder;
  /**
   * Partitions reconciled at once (default 32). SPDK answers a call two RPC polls (8 ms) after it
   * arrives whatever the load, so one call at a time is 125 calls/s; after a target restart every
   * export's calls go through one connection, and only calls in flight raise that rate.
   */
  workers?: number;
  /**
   * How often every Exported partition is re-verified against the target (default 60 s), all in
   * one sweep answered from one listing of the target (see scheduleSweep).
   */
  verifyPeriodMs?: number;
  /** Reads DH-HMAC-CHAP secrets referenced by partitions; required only when one asks for it. */
  secrets?: SecretReader;
  /** Called after each step; tests kill the process here to prove crash safety. */
  afterStep?(step: Step, key: string): void | Promise<void>;
  /**
   * The object a target restart's summary Event is recorded on (this node's RDMAStorageNode);
   * without it, or while it does not exist, the summary is only logged.
   */
  nodeObject?(): Promise<KubeObject | undefined>;
  /** How long a replay after a target restart may take before it is summarized anyway. */
  restartSummaryDeadlineMs?: number;
  /**
   * The SPDK calls a replicated volume's serving node makes (copies attached over NVMe-oF, the
   * raid1 over them). Without it, or without an spdk backend, a replicated volume placed on this
   * node is refused (ReplicasNeedSpdk).
   */
  nexusSpdk?: NexusSpdk;
  /**
   * How long a copy of a volume this node serves may stay unreachable (its I/O held) before the
   * agent records it Faulted at a raised data generation and drops it from the raid. Default 10 s.
   */
  nexusDegradeAfterMs?: number;
  /**
   * Clock time of the newest heartbeat the API server took from this agent (the reporter's):
   * a volume this node serves with a local copy is fenced by the agent itself when it grows old
   * (agent/nexus/self-fence.ts). Absent: no self-fencing.
   */
  lastHeartbeatMs?: () => number | undefined;
  /**
   * Nexus exports the target watchdog fenced while this agent was away (its fence record,
   * agent/watchdog/lease.ts), by NQN: when. Each stays fenced as a self-fence of that time does:
   * served again only after a newer heartbeat and a fresh read of the volume naming this node.
   */
  fencedAtStart?: ReadonlyMap<string, number>;
  /**
   * Awaited after a nexus is assembled and before its export is set optimized, so the target
   * watchdog's lease names it before consumers can be served through it. Must not throw.
   */
  beforeServing?: () => Promise<void>;
  /** Rebuilds onto copies of volumes this node serves (agent/nexus/rebuild-driver.ts). */
  rebuilds?: {
    maxPerNode: number;
    bandwidthMbSec: number;
    /** Whether a rebuild waits for the manager's cluster-wide grant (default true). */
    needsGrant?: boolean;
    metrics?: RebuildMetrics;
  };
  /**
   * How long a deleted partition's drive must have been lost (Unavailable, or its NVMeDevice
   * removed) before the partition is released without deleting its volume, the room held as a
   * leftover on the drive's ledger. Default DEFAULT_LOST_DRIVE_RELEASE_AFTER_MS (10 min).
   */
  lostDriveReleaseAfterMs?: number;
}

/** Default of ControllerOptions.nexusDegradeAfterMs. */
export const NEXUS_DEGRADE_AFTER_MS = 10_000;

/**
 * Host NQNs a partition's target ACL must hold: that of its live attachment record (the one the
 * CSI controller made, see isPartitionRecord). Other attachments naming the same UID, in any
 * namespace or under any other name, never reach the ACL.
 */
export function desiredHosts(
  partition: Pick<NVMePartition, "metadata"> | undefined,
  attachments: readonly NVMeVolumeAttachment[],
): string[] {
  return [
    ...new Set(
      attachments
        .filter((a) => isPartitionRecord(a, partition) && !a.metadata.deletionTimestamp)
        .map((a) => a.spec.hostNQN),
    ),
  ].sort();
}

export class PartitionController {
  readonly partitions: WatchCache<NVMePartition>;
  readonly devices: WatchCache<NVMeDevice>;
  readonly attachments: WatchCache<NVMeVolumeAttachment>;
  private readonly partClient: ResourceClient<NVMePartition>;
  private readonly devClient: ResourceClient<NVMeDevice>;
  private readonly snapClient: ResourceClient<NVMeSnapshot>;
  private readonly queue: WorkQueue;
  private readonly restarts: RestartRepairs;
  /** A restart reported before the partition cache synced: its window opens once it has. */
  private restartBeforeSync: BackendName | undefined;
  /** The backends' listing the passes queued with it wait for (see prefetch()). */
  private prefetching: Promise<void> | undefined;
  private cancelSweep: (() => void) | undefined;
  /**
   * Per partition key: the resourceVersion of the object the last status write stored (or found
   * already right), and a digest of what that write asked for.
   */
  private readonly statusSeen = new Map<string, { uid: string | undefined; rv: string; asked: string }>();
  private readonly nexus: NexusAssembler | undefined;
  private readonly rebuilds: RebuildDriver | undefined;

  /** Registers with o.manager, which starts and stops it; reconciles begin once every cache synced. */
  constructor(private readonly o: PartitionControllerOptions) {
    this.startedMs = o.clock.now();
    for (const [nqn, at] of o.fencedAtStart ?? []) {
      this.watchdogFenced.set(nqn, at);
      this.watchdogSeenMs = Math.max(this.watchdogSeenMs, at);
    }
    this.partClient = new ResourceClient(o.conn, kinds.NVMePartition);
    this.devClient = new ResourceClient(o.conn, kinds.NVMeDevice);
    this.snapClient = new ResourceClient(o.conn, kinds.NVMeSnapshot);
    const caches = o.manager.caches;
    this.partitions = caches.cache(kinds.NVMePartition, onNode(o.nodeName, o.namespace));
    this.devices = caches.cache(kinds.NVMeDevice, onNode(o.nodeName));
    this.attachments = caches.cache(kinds.NVMeVolumeAttachment, inReleaseNamespace(o.namespace));
    this.queue = new WorkQueue({ name: "partitions", clock: o.clock });
    this.nexus =
      o.nexusSpdk && o.backends.spdk
        ? new NexusAssembler(o.nexusSpdk, o.logger.with({ component: "nexus" }))
        : undefined;
    this.rebuilds = this.nexus
      ? new RebuildDriver({
          assembler: this.nexus,
          partitions: this.partClient,
          logger: o.logger.with({ component: "rebuild" }),
          maxPerNode: o.rebuilds?.maxPerNode ?? DEFAULT_REBUILDS_PER_NODE,
          bandwidthMbSec: o.rebuilds?.bandwidthMbSec ?? 0,
          needsGrant: o.rebuilds?.needsGrant ?? true,
          nodeName: o.nodeName,
          clock: o.clock,
          ...(o.rebuilds?.metrics ? { metrics: o.rebuilds.metrics } : {}),
          afterStep: (step, key) => this.step(`rebuild-${step}`, key),
        })
      : undefined;
    this.restarts = new RestartRepairs({
      clock: o.clock,
      deadlineMs: o.restartSummaryDeadlineMs,
      onSummary: (s) => void this.reportRestart(s),
    });
    const enqueue = (p: NVMePartition) => {
      this.queue.add(objectKey(p.metadata));
      // A copy's changes also reach the standby export of its volume (a key outside the cache).
      const v = volumeKeyOfCopy(p);
      if (v) this.queue.add(v);
    };
    this.partitions.onChange(enqueue);
    // A drive or an attachment change can unblock (or block) the partitions that use it.
    const bySerial = (d: NVMeDevice) => {
      for (const p of this.partitions.list()) if (p.spec.deviceSerial === d.spec.serial) enqueue(p);
      // A drive back with volumes of partitions released while it was lost: delete those.
      if (leftoversToClean(d, o.nodeName)) this.queue.add(`${LEFTOVERS_KEY}${d.metadata.name}`);
    };
    this.devices.on({
      add: bySerial,
      update: (o, n) => {
        // Leftovers are ledger entries, which deviceChangeMatters leaves out on purpose.
        if (leftoversToClean(n, this.o.nodeName)) this.queue.add(`${LEFTOVERS_KEY}${n.metadata.name}`);
        if (!deviceChangeMatters(o, n)) return;
        if (o.spec.serial !== n.spec.serial) bySerial(o);
        bySerial(n);
      },
      delete: bySerial,
    });
    const byUid = (a: NVMeVolumeAttachment) => {
      for (const p of this.partitions.list()) {
        if (p.metadata.uid === a.spec.partitionUID) enqueue(p);
        // A consumer of a replicated volume is admitted on every copy node's standby export too.
        else if (p.spec.replicaOf?.uid === a.spec.partitionUID) this.queue.add(volumeKeyOfCopy(p) as string);
      }
    };
    this.attachments.onChange(byUid);
    o.manager.add({
      name: "partitions",
      queue: this.queue,
      workers: o.workers ?? 32,
      reconcile: (key) => this.reconcile(key),
      onSynced: () => {
        // The initial list queued every partition already: one listing answers their reads.
        this.prefetch();
        this.scheduleSweep();
        void this.adoptNexusLeftovers().catch((err: unknown) =>
          this.o.logger.warn("could not look for nexus raids left from before a restart", {
            error: (err as Error).message,
          }),
        );
        if (!this.restartBeforeSync) return;
        this.restarts.begin(this.restartBeforeSync, this.exportedOn(this.restartBeforeSync));
        this.restartBeforeSync = undefined;
      },
      onStop: () => {
        this.cancelSweep?.();
        this.cancelSweep = undefined;
        this.restarts.close();
      },
    });
  }

  /**
   * Has every backend read the state of all its exports at once; passes started from now on wait
   * for it and are answered from it. Never rejects: a failed listing only means each pass reads
   * for itself.
   */
  private prefetch(): void {
    const all = Object.values(this.o.backends).map((b) =>
      b?.prefetch?.().catch((err: unknown) => this.o.logger.debug("backend listing failed", { err })),
    );
    const p: Promise<void> = Promise.all(all).then(() => {
      if (this.prefetching === p) this.prefetching = undefined;
    });
    this.prefetching = p;
  }

  /**
   * The periodic re-verify, one sweep per verify period for the whole node: one listing of each
   * backend, then a pass over every Exported partition answered from it, so the target sees a
   * fixed number of reads per period instead of several per export.
   */
  private scheduleSweep(): void {
    this.cancelSweep?.();
    this.cancelSweep = this.o.clock.setTimeout(() => {
      this.prefetch();
      for (const p of this.partitions.list())
        if (p.status?.state === "Exported") this.queue.add(objectKey(p.metadata));
      this.scheduleSweep();
    }, this.o.verifyPeriodMs ?? 60_000);
  }

  /** Queues every partition of this node, e.g. after the target restarted and lost its exports. */
  requeueAll(): void {
    for (const p of this.partitions.list()) this.queue.add(objectKey(p.metadata));
  }

  /**
   * The target of `backend` (re)started without the exports it served: queues every partition,
   * and the repairs their next passes make are expected. They are reported once for the restart
   * (one log line, one Event on nodeObject) instead of an ExportRepaired Warning per partition;
   * a repair no known restart explains is drift and is still reported per partition. Callable
   * before the manager starts: a target started with the agent counts from the first list on.
   */
  targetRestarted(backend: BackendName): void {
    if (!this.partitions.hasSynced) {
      this.restartBeforeSync = backend;
      return;
    }
    this.restarts.begin(backend, this.exportedOn(backend));
    this.prefetch();
    this.requeueAll();
  }

  private exportedOn(backend: BackendName): string[] {
    return this.partitions
      .list()
      .filter((p) => p.status?.state === "Exported" && backendOf(p) === backend)
      .map((p) => objectKey(p.metadata));
  }

  /** The one log line and Event of a target restart's replay. Never rejects. */
  private async reportRestart(s: RestartSummary): Promise<void> {
    const note =
      `${s.backend} target restarted and lost its exports: ${s.repaired} of ${s.exports} repaired, ` +
      `${s.verified} verified in ${s.seconds.toFixed(1)} s` +
      (s.unverified > 0 ? `; ${s.unverified} not verified yet (their partitions report why)` : "");
    if (s.unverified > 0) this.o.logger.warn("exports not all restored after a target restart", { ...s });
    else this.o.logger.info("exports restored after a target restart", { ...s });
    try {
      const node = await this.o.nodeObject?.();
      if (node) await this.o.events?.record(node, "Warning", "TargetRestarted", "Verify", note);
    } catch (err) {
      this.o.logger.warn("target restart summary not recorded as an Event", { err });
    }
  }

  private async step(step: Step, key: string): Promise<void> {
    await this.o.afterStep?.(step, key);
  }

  private deviceFor(p: NVMePartition): NVMeDevice | undefined {
    return this.devices
      .list()
      .find((d) => d.spec.serial === p.spec.deviceSerial && d.spec.nodeName === this.o.nodeName);
  }

  private attachmentsFor(p: NVMePartition): NVMeVolumeAttachment[] {
    return this.attachments.list().filter((a) => isPartitionRecord(a, p));
  }

  /**
   * The object p.spec.contentSource names, read by kind and name in p's own namespace from the
   * API server (the cache holds only this node's partitions, and no snapshots of other nodes).
   * Looked up only while it matters: a live partition of this node not Exported yet.
   */
  private async resolveSource(p: NVMePartition): Promise<ResolvedSource | null | undefined> {
    const cs = p.spec.contentSource;
    if (!cs || p.metadata.deletionTimestamp || p.status?.state === "Exported") return undefined;
    if (p.spec.nodeName !== this.o.nodeName) return undefined;
    if (cs.kind === "Partition") {
      const src = await this.partClient.get(cs.name, p.metadata.namespace);
      return src ? { uid: src.metadata.uid as string, deviceSerial: src.spec.deviceSerial } : null;
    }
    const snap = await this.snapClient.get(cs.name, p.metadata.namespace);
    return snap ? { uid: snap.metadata.uid as string, deviceSerial: snap.status?.deviceSerial } : null;
  }

  /** Writes a status derived from the latest object; conditions keep their transition times. */
  private async setStatus(
    p: NVMePartition,
    patch: (s: NonNullable<NVMePartition["status"]>) => void,
    cond: Omit<Condition, "lastTransitionTime">,
  ) {
    const now = new Date(this.o.clock.now());
    const compute = partitionStatusWrite(p.metadata.uid, patch, cond, now);
    // What this write asks for, independent of the object it is applied to.
    const probe = {} as NonNullable<NVMePartition["status"]>;
    patch(probe);
    const asked = createHash("sha1")
      .update(JSON.stringify([probe, cond]))
      .digest("base64");
    const key = objectKey(p.metadata);
    // The cached object already holds this status, Ready condition included: the first pass of a
    // new agent (nothing stored by it yet, e.g. the replay after a rolling update) reads nothing
    // from the API server for an export found as its status says.
    if (cachedStatusHolds(p, compute)) return;
    const last = this.statusSeen.get(key);
    // The object is still the one this agent last stored or read back (same resourceVersion in
    // the cache) and the pass asks for what made no change then: it makes none now either. This
    // is what keeps a verify sweep from reading every partition from the API server.
    if (last && last.uid === p.metadata.uid && last.rv === p.metadata.resourceVersion && last.asked === asked)
      return;
    // Otherwise from a fresh read: the agent's cache drops status.conditions (agentTransform), so
    // only the stored object tells what a write would change, and a write must keep others' conditions.
    const stored = await updateStatus(this.partClient, p.metadata.name, p.metadata.namespace, compute);
    if (stored?.metadata.resourceVersion && stored.metadata.uid === p.metadata.uid)
      this.statusSeen.set(key, { uid: p.metadata.uid, rv: stored.metadata.resourceVersion, asked });
    else this.statusSeen.delete(key);
  }

  private async report(
    p: NVMePartition,
    state: "Pending" | "Provisioning" | "Failed" | "Deleting",
    why: Why,
    ready: "False" | "Unknown" = "False",
  ) {
    await this.setStatus(
      p,
      (s) => {
        s.state = state;
      },
      {
        type: "Ready",
        status: ready,
        reason: why.reason,
        message: why.message,
      },
    );
  }

  private backendOf(t: Target): { backend: TargetBackend; vm: VolumeManager } {
    const backend = this.o.backends[t.backend];
    const vm = this.o.volumeManagers[t.volumeManager];
    if (!backend || !vm) {
      throw new TerminalError(
        new StorageError(
          "unimplemented",
          `this agent serves no ${!backend ? `${t.backend} backend` : `${t.volumeManager} volume manager`}`,
        ),
      );
    }
    return { backend, vm };
  }

  async reconcile(key: string): Promise<{ requeueAfterMs?: number } | undefined> {
    if (this.prefetching) await this.prefetching;
    if (key.startsWith(LEFTOVERS_KEY)) return this.cleanLeftovers(key.slice(LEFTOVERS_KEY.length));
    const p = this.partitions.get(key);
    if (!p) {
      this.restarts.dropped(key);
      this.statusSeen.delete(key);
      // A volume this node served left the cache: its serving node moved (failover), or it is gone.
      const copy = this.localCopyOf(key);
      const served = this.nexusServed.get(key);
      if (served) return this.retireNexus(key, served, copy);
      // A replicated volume served elsewhere that this node holds a copy of: a standby export.
      if (copy) return this.reconcileStandby(key, copy);
      return;
    }
    // A replicated volume has no drive: its serving node builds it from its copies instead.
    if (isReplicatedVolume(p)) return this.reconcileNexus(key, p);
    const observed = {
      partition: p,
      nodeName: this.o.nodeName,
      device: this.deviceFor(p),
      attachments: this.attachmentsFor(p).map((a) => a.metadata.name),
      contentSource: await this.resolveSource(p),
      nowMs: this.o.clock.now(),
      ...(this.o.lostDriveReleaseAfterMs === undefined
        ? {}
        : { lostDriveReleaseAfterMs: this.o.lostDriveReleaseAfterMs }),
    };
    let d = decide(observed);
    if ((d.action === "refuse" || d.action === "release") && DEVICE_STATUS_REASONS.has(d.why.reason)) {
      // The manager stored the ledger entry (and the claim) before it wrote this placement, but
      // the drive's watch may not have delivered it yet: decide again on the drive read afresh.
      const fresh = await this.devClient.get(observed.device?.metadata.name as string);
      d = decide({ ...observed, device: fresh });
    }
    const log = this.o.logger.with({ partition: key });
    switch (d.action) {
      case "ignore":
      case "done":
        return;
      case "release":
        this.restarts.dropped(key);
        await this.dropFinalizer(p);
        await this.step("finalizer-removed", key);
        log.warn("partition released without touching the target: the manager never placed it here", {
          reason: d.why.reason,
        });
        return;
      case "add-finalizer":
        await this.addFinalizer(p, key);
        return;
      case "wait":
        await this.report(p, "Pending", d.why);
        throw new StorageError("unavailable", d.why.message);
      case "refuse":
        await this.report(p, "Failed", d.why);
        await this.o.events?.record(p, "Warning", d.why.reason, "Provision", d.why.message);
        throw new TerminalError(new StorageError("precondition", d.why.message));
      case "block-deletion":
        await this.report(p, "Deleting", d.why);
        return { requeueAfterMs: 30_000 };
      case "provision":
        return this.provision(key, p, d.target, d.lockDevice, log);
      case "deprovision":
        this.restarts.dropped(key);
        await this.deprovision(key, p, d.target, log);
        return;
      case "wait-lost-drive":
        await this.report(p, "Deleting", d.why);
        return { requeueAfterMs: d.retryAfterMs };
      case "abandon":
        this.restarts.dropped(key);
        await this.abandon(key, p, d.why, d.leftover, log);
        return;
    }
  }

  /**
   * Releases deleted partition `p` whose drive has been lost past the bound, without touching the
   * target: first its ledger entry on the drive becomes a leftover (a guarded write; from then on
   * the capacity reconciler keeps that room held, since the drive may come back holding the
   * volume), then Events on the partition and the drive record what was given up, and only then
   * the finalizer goes. A crash in between repeats the pass; marking again is a no-op.
   */
  private async abandon(
    key: string,
    p: NVMePartition,
    why: Why,
    leftover: { since: string; reason: string },
    log: Logger,
  ): Promise<void> {
    const dev = this.deviceFor(p);
    const uid = p.metadata.uid as string;
    let device: NVMeDevice | undefined;
    if (dev) {
      device = await updateStatus(this.devClient, dev.metadata.name, undefined, (latest) =>
        markLeftover(latest, uid, leftover),
      );
    }
    // A copy's standby export of its volume holds no data (no namespace): it goes as usual.
    const volumeKey = volumeKeyOfCopy(p);
    if (volumeKey && p.spec.replicaOf) await this.removeStandby(volumeKey, p.spec.replicaOf.uid);
    const note = why.message.slice(0, 1024);
    await this.o.events?.record(p, "Warning", DATA_ON_LOST_DEVICE, "Deprovision", note);
    if (device) await this.o.events?.record(device, "Warning", DATA_ON_LOST_DEVICE, "Deprovision", note);
    await this.dropFinalizer(p);
    await this.step("finalizer-removed", key);
    log.warn("partition released from a lost drive; its volume is left on the drive", {
      serial: p.spec.deviceSerial,
      device: dev?.metadata.name,
      leftover: leftover.reason,
    });
  }

  /**
   * Deletes, from drive `name` now back on this node, the volumes of partitions released while
   * it was lost (its ledger's leftover entries), each by the identity its UID derives: the export
   * first (it may have come back with the target's replay of nothing, or survived on a node that
   * was only cut off), then the volume, then the entry (a guarded write; the manager's capacity
   * reconciler then frees the room). Idempotent: a volume already gone is done.
   */
  private async cleanLeftovers(name: string): Promise<undefined> {
    const plan: LeftoverPlan | undefined = leftoversToClean(this.devices.get(name), this.o.nodeName);
    if (!plan) return;
    const log = this.o.logger.with({ device: name });
    for (const e of plan.entries) {
      const externalId = externalIdFor(e.uid);
      if (plan.backend) {
        const { backend, vm } = this.backendOf({
          backend: plan.backend,
          volumeManager: resolveVolumeManager(plan.backend, "partition"),
        } as Target);
        await backend.removeExport(nqnFor(externalId));
        const ref = await backend.prepareDevice({
          name,
          serial: plan.device.spec.serial,
          pciAddress: plan.device.spec.pciAddress,
        });
        await vm.deleteVolume({ externalId, sizeBytes: e.bytes, device: ref });
      }
      const stored = await updateStatus(this.devClient, name, undefined, (latest) =>
        dropLeftover(latest, e.uid),
      );
      const note = `deleted volume ${externalId} of partition ${e.namespace}/${e.name} (uid ${e.uid}), released on ${e.leftover?.since} while drive ${plan.device.spec.serial} was lost; its room is free again`;
      if (stored) await this.o.events?.record(stored, "Normal", "LeftoverDeleted", "Cleanup", note);
      log.info("leftover volume deleted from a returned drive", {
        externalId,
        partition: `${e.namespace}/${e.name}`,
      });
    }
    return;
  }

  /** Adds PARTITION_FINALIZER to the live object (a JSON patch testing the finalizers only). */
  private async addFinalizer(p: NVMePartition, key: string): Promise<void> {
    try {
      await this.partClient.jsonPatch(
        p.metadata.name,
        p.metadata.namespace,
        addFinalizerOps(p, PARTITION_FINALIZER),
      );
    } catch (err) {
      if (!(err instanceof StorageError && err.kind === "invalid")) throw err;
      // A failed test op: the cache is behind, most often still missing this very finalizer
      // (our own patch's watch event not in yet, while an older event requeued the key).
      const latest = await this.partClient.get(p.metadata.name, p.metadata.namespace);
      const done =
        latest !== undefined &&
        latest.metadata.uid === p.metadata.uid &&
        (latest.metadata.finalizers ?? []).includes(PARTITION_FINALIZER);
      if (!done) throw new StorageError("conflict", err.message, { cause: err });
    }
    await this.step("finalizer", key);
  }

  /**
   * One pass over replicated volume `p` (agent/nexus/decide.ts): on its serving node, the copies
   * the manager holds current are read from the API server, attached over NVMe-oF, mirrored by a
   * raid1 and exported under the volume's own NQN exactly as a drive's partition is (same
   * export, ACL and status code), so CSI serves it unchanged; deletion reverses it.
   */
  private async reconcileNexus(
    key: string,
    p: NVMePartition,
  ): Promise<{ requeueAfterMs?: number } | undefined> {
    const log = this.o.logger.with({ partition: key, nexus: true });
    const backend = this.o.backends.spdk;
    const nexus = this.nexus;
    const serving = nexus !== undefined && backend !== undefined;
    let copies: Map<string, NVMePartition | null> | undefined;
    const mine = p.spec.nodeName === this.o.nodeName;
    const holds = (p.metadata.finalizers ?? []).includes(PARTITION_FINALIZER);
    if (mine && serving && holds && !p.metadata.deletionTimestamp) {
      // Copies live on other nodes too, outside this node's cache: read each from the server.
      const current = currentCopies(p);
      const found = await Promise.all(
        current.map((c) => this.partClient.get(c.name, p.metadata.namespace as string)),
      );
      copies = new Map(current.map((c, i) => [c.name, found[i] ?? null]));
    }
    const d = decideNexus({
      volume: p,
      nodeName: this.o.nodeName,
      spdk: serving,
      attachments: this.attachmentsFor(p).map((a) => a.metadata.name),
      ...(copies ? { copies } : {}),
    });
    switch (d.action) {
      case "ignore": {
        const served = this.nexusServed.get(key);
        if (served && !mine) return this.retireNexus(key, served, this.localCopyOf(key));
        return;
      }
      case "done":
        return;
      case "add-finalizer":
        await this.addFinalizer(p, key);
        return;
      case "refuse":
        await this.report(p, "Failed", d.why);
        await this.o.events?.record(p, "Warning", d.why.reason, "Provision", d.why.message);
        throw new TerminalError(new StorageError("precondition", d.why.message));
      case "wait": {
        // A served volume keeps serving from the raid it has: only its Ready condition says why
        // this pass could not check it. The copies' changes reach the volume through the
        // manager's status.replicas; the requeue is the backstop.
        const state = p.status?.state === "Exported" ? "Exported" : "Provisioning";
        await this.setStatus(
          p,
          (s) => {
            s.state = state;
          },
          { type: "Ready", status: "False", reason: d.why.reason, message: d.why.message },
        );
        log.debug("replicated volume waits", { reason: d.why.reason, message: d.why.message });
        return { requeueAfterMs: 5_000 };
      }
      case "block-deletion":
        await this.report(p, "Deleting", d.why);
        return { requeueAfterMs: 30_000 };
      case "teardown": {
        const b = backend as TargetBackend;
        await b.removeExport(d.teardown.nqn);
        await this.step("unexport", key);
        const detached = await (nexus as NexusAssembler).teardown(d.teardown);
        await this.step("nexus-teardown", key);
        this.restarts.dropped(key);
        this.nexusServed.delete(key);
        this.selfFenced.delete(key);
        this.rebuilds?.forget(p.metadata.uid as string);
        await this.dropFinalizer(p);
        await this.step("finalizer-removed", key);
        log.info("replicated volume taken down", { nqn: d.teardown.nqn, detached });
        return;
      }
      case "assemble": {
        // A planned handover names this node: it stops taking writes and says so, nothing more.
        if (p.metadata.annotations?.[HANDOVER_ANNOTATION] === this.o.nodeName)
          return this.releaseNexus(key, p, d.plan, log);
        // A release recorded for an earlier request that was withdrawn: cleared before this node
        // serves again, so that it never speaks for a node that takes writes.
        if (p.status?.releasedBy === this.o.nodeName) {
          await updateStatus(this.partClient, p.metadata.name, p.metadata.namespace, (latest) => {
            if (latest.metadata.uid !== p.metadata.uid || latest.status?.releasedBy !== this.o.nodeName)
              return undefined;
            const { releasedBy: _, ...rest } = latest.status;
            return rest;
          });
          return { requeueAfterMs: 200 };
        }
        // Fenced by this agent (its heartbeats stopped going through) or, while it was away, by
        // the target watchdog: serving again needs a newer heartbeat and the volume, read
        // afresh, still naming this node.
        const byWatchdog = this.watchdogFenced.get(d.plan.nqn);
        if (byWatchdog !== undefined && !this.selfFenced.has(key)) {
          this.selfFenced.set(key, byWatchdog);
          log.info(
            "the target watchdog fenced this volume while the agent was away: serving waits for a heartbeat",
            {
              nqn: d.plan.nqn,
              fencedAtMs: byWatchdog,
            },
          );
        }
        this.watchdogFenced.delete(d.plan.nqn);
        const fencedAt = this.selfFenced.get(key);
        if (fencedAt !== undefined) {
          const fresh = selfFenceLifted(this.o.lastHeartbeatMs?.(), fencedAt)
            ? await this.partClient.get(p.metadata.name, p.metadata.namespace)
            : undefined;
          if (!fresh || fresh.metadata.uid !== p.metadata.uid || fresh.spec.nodeName !== this.o.nodeName)
            return { requeueAfterMs: 1000 };
          this.selfFenced.delete(key);
          log.info("self-fence lifted: a heartbeat went through and the volume is still served here");
        }
        const plan = d.plan;
        const names = plan.members.map((m) => m.name).join(", ");
        if (p.status?.state !== "Exported") {
          await this.report(
            p,
            "Provisioning",
            { reason: "Provisioning", message: `building raid1 ${plan.raidBdev} over ${names}` },
            "Unknown",
          );
        }
        // A copy that stopped answering holds every write (see NEXUS_ATTACH_TIMEOUTS). Past the
        // bound, the API learns first that it leaves the current set; only then is it dropped,
        // which lets the held writes complete on the others.
        const look =
          p.status?.state === "Exported"
            ? await (nexus as NexusAssembler).unreachableMembers(plan)
            : { down: new Map<string, string>(), checked: new Set<string>() };
        const unreachable = look.down;
        const degraded = await this.degradeNexus(key, p, plan, unreachable, log, look.checked);
        if (degraded) return degraded;
        if (p.status?.state === "Exported") {
          const retired = await this.retireCopies(key, p, plan, log);
          if (retired) return retired;
        }
        let raid: Awaited<ReturnType<NexusAssembler["ensureRaid"]>>;
        try {
          raid = await (nexus as NexusAssembler).ensureRaid(
            plan,
            this.rebuilds?.members(p.metadata.uid as string),
          );
        } catch (err) {
          if (!(err instanceof StorageError && (err.kind === "unavailable" || err.kind === "precondition")))
            throw err;
          // Copies that cannot even be attached (their node is down, their ACL refuses this
          // node): timed like a copy lost while serving, and past the bound recorded out of the
          // current set first, so the raid can start over the copies that remain.
          const missing = err.details[UNREACHABLE_COPIES] as Record<string, string> | undefined;
          if (missing) {
            const down = new Map(Object.entries(missing));
            const checked = new Set(plan.members.map((m) => m.name));
            const degraded = await this.degradeNexus(key, p, plan, down, log, checked);
            if (degraded) return degraded;
          }
          const state = p.status?.state === "Exported" ? "Exported" : "Provisioning";
          await this.setStatus(
            p,
            (s) => {
              s.state = state;
            },
            {
              type: "Ready",
              status: "False",
              reason: NEXUS_REASONS.notReady,
              message: err.message.slice(0, 1024),
            },
          );
          // Nothing on this node announces the fix (a copy's ACL admitting this host, its
          // target back): look again soon rather than after a backoff grown to minutes.
          log.info("replicated volume not assembled yet", { error: err.message });
          return { requeueAfterMs: err.kind === "unavailable" ? 2_000 : 30_000 };
        }
        if (raid.repaired.length > 0)
          log.info("nexus assembled", { raid: plan.raidBdev, steps: raid.repaired });
        // Remembered before the export: a serving node that moves away takes all of it down.
        this.nexusServed.set(key, {
          nqn: plan.nqn,
          raidBdev: plan.raidBdev,
          // Every member is a status.replicas entry; teardown adds whatever the raid still lists.
          controllers: [
            ...new Set(
              (p.status?.replicas ?? []).flatMap((r) => (r.uid ? [nexusControllerNameFor(r.uid)] : [])),
            ),
          ].sort(),
        });
        await this.step("nexus-raid", key);
        await this.o.beforeServing?.();
        const t: Target = {
          backend: "spdk",
          volumeManager: "spdk-lvol",
          nqn: plan.nqn,
          qos: plan.qos,
          volume: {
            externalId: plan.externalId,
            sizeBytes: plan.sizeBytes,
            device: { name: "", serial: "", pciAddress: "" },
          },
        };
        const volume: Volume = {
          externalId: plan.externalId,
          backendPath: plan.raidBdev,
          sizeBytes: raid.sizeBytes,
        };
        const exported = await this.exportVolume(
          key,
          p,
          t,
          backend as TargetBackend,
          volume,
          log,
          `raid1 over ${names}`,
          {
            cntlidRange: cntlidRangeFor(replicaIndex(this.localCopyOf(key)?.metadata.name ?? "")),
            keepOptimized: true,
          },
        );
        const rebuilding = await this.rebuilds?.pass(key, p, plan, raid.sizeBytes, log);
        // While a copy is unreachable, look again every second: its bound runs on the clock.
        return unreachable.size > 0 || rebuilding ? { requeueAfterMs: 1000 } : exported;
      }
    }
  }

  /**
   * After a restart, the nexus raids on this node's target (`nexus-<externalId>`) whose volume is
   * not served here any more: each is remembered as served and its volume's key queued, so the
   * retire runs as the volume's own pass (it reads the volume again, and never races a failback
   * to this node); a raid whose volume is gone altogether is taken down here with its export.
   */
  private async adoptNexusLeftovers(): Promise<void> {
    const spdk = this.o.nexusSpdk;
    const backend = this.o.backends.spdk;
    if (!spdk || !backend || !this.nexus) return;
    const raids = new Set(
      (await spdk.bdevRaidGetBdevs("all")).map((r) => r.name).filter((n) => n.startsWith(nexusBdevFor(""))),
    );
    if (raids.size === 0) return;
    const volumes = (await this.partClient.list({ namespace: this.o.namespace })).items.filter(
      isReplicatedVolume,
    );
    for (const v of volumes) {
      const externalId = externalIdFor(v.metadata.uid as string);
      const raidBdev = nexusBdevFor(externalId);
      if (!raids.delete(raidBdev)) continue;
      const key = objectKey(v.metadata);
      if (v.spec.nodeName === this.o.nodeName || this.nexusServed.has(key)) continue;
      this.nexusServed.set(key, {
        nqn: nqnFor(externalId),
        raidBdev,
        controllers: [
          ...new Set(
            (v.status?.replicas ?? []).flatMap((r) => (r.uid ? [nexusControllerNameFor(r.uid)] : [])),
          ),
        ].sort(),
      });
      this.o.logger.info("a nexus left from before the restart is retired", {
        partition: key,
        raid: raidBdev,
      });
      this.queue.add(key);
    }
    // No volume names these any more (deleted, or recreated under a new UID).
    for (const raidBdev of raids) {
      const nqn = nqnFor(raidBdev.slice(nexusBdevFor("").length));
      await backend.removeExport(nqn);
      const detached = await this.nexus.teardown({ nqn, raidBdev, controllers: [] });
      this.o.logger.warn("a nexus raid whose volume is gone was taken down", {
        raid: raidBdev,
        nqn,
        detached,
      });
    }
  }

  /** The live copy (replica partition) of volume key `key` this node holds, if any. */
  private localCopyOf(key: string): NVMePartition | undefined {
    return this.partitions
      .list()
      .find(
        (c) =>
          volumeKeyOfCopy(c) === key && !c.metadata.deletionTimestamp && c.spec.nodeName === this.o.nodeName,
      );
  }

  /**
   * One pass over the standby export of replicated volume `key` on this node, which holds its
   * copy `copy` and does not serve it: the volume's subsystem with no namespace and every
   * listener inaccessible, admitting the volume's consumers, so they hold a path here before a
   * failover makes this node the one that serves. A volume gone (or recreated) takes it down.
   */
  private async reconcileStandby(
    key: string,
    copy: NVMePartition,
  ): Promise<{ requeueAfterMs?: number } | undefined> {
    const backend = this.o.backends.spdk;
    const of = copy.spec.replicaOf;
    if (!backend?.ensureStandby || !of) return;
    const { namespace, name } = splitKey(key);
    const volume = await this.partClient.get(name, namespace ?? this.o.namespace);
    if (!volume || volume.metadata.uid !== of.uid || volume.metadata.deletionTimestamp) {
      await this.removeStandby(key, of.uid);
      return;
    }
    // Served here: the volume's own pass (its cache event is on the way) owns the export.
    if (volume.spec.nodeName === this.o.nodeName) return;
    await this.standbyExport(key, copy, volume, backend);
    return;
  }

  private async standbyExport(
    key: string,
    copy: NVMePartition,
    volume: NVMePartition,
    backend: TargetBackend,
  ): Promise<void> {
    if (!backend.ensureStandby) return;
    const externalId = externalIdFor(volume.metadata.uid as string);
    const nqn = nqnFor(externalId);
    const transport = volume.spec.targetOptions?.transport ?? "rdma";
    const portal = await this.o.portal(transport);
    if (!portal)
      throw new StorageError("unavailable", `node ${this.o.nodeName} has no usable ${transport} endpoint`);
    const more = (this.o.morePortalAddresses ?? []).filter((a) => a !== portal.address);
    const repaired = await backend.ensureStandby({
      nqn,
      transport,
      address: portal.address,
      port: volume.spec.targetOptions?.portalPort ?? portal.port,
      ...(more.length > 0 ? { moreAddresses: more } : {}),
      serialNumber: serialNumberFor(externalId),
      cntlidRange: cntlidRangeFor(replicaIndex(copy.metadata.name)),
      ...(volume.spec.targetOptions?.tls ? { tls: true } : {}),
    });
    await this.step("standby-export", key);
    await aclLocks.run(nqn, async () => {
      const hosts = desiredHosts(volume, this.attachmentsFor(volume));
      const acl = await keyedAclFor(volume, hosts, this.o.secrets);
      await backend.setHosts(nqn, acl.hosts, acl.keys, acl.psks);
    });
    await this.step("standby-acl", key);
    if (repaired.length > 0) this.o.logger.info("standby export", { partition: key, nqn, repaired });
  }

  /** Removes the standby export of volume `volumeUid` unless this node serves that volume. */
  private async removeStandby(key: string, volumeUid: string): Promise<void> {
    const backend = this.o.backends.spdk;
    if (!backend?.ensureStandby || this.nexusServed.has(key)) return;
    const served = this.partitions.get(key);
    if (served && served.metadata.uid === volumeUid) return;
    await backend.removeExport(nqnFor(externalIdFor(volumeUid)));
    await this.step("standby-unexport", key);
  }

  /** When this controller started (the reference for self-fencing before the first heartbeat). */
  private readonly startedMs: number;
  /** Volumes this node fenced itself from serving, by key: when. */
  private readonly selfFenced = new Map<string, number>();
  /** The target watchdog's fences found at start, by NQN, not yet taken over by a volume's pass. */
  private readonly watchdogFenced = new Map<string, number>();

  /** The newest target-watchdog fence this controller has taken in (its fencedAtMs). */
  private watchdogSeenMs = 0;

  /**
   * Takes in a fence the target watchdog recorded (agent/watchdog/lease.ts) while this agent
   * runs: its lease went stale (a heartbeat slower than the deadline, a lease write that
   * failed). Each listed volume this node serves counts as self-fenced at that time, so its pass
   * serves it again only after a newer heartbeat and a fresh read naming this node, instead of
   * at the next verify. A record already taken in is ignored. Returns the keys fenced now.
   */
  noteWatchdogFence(record: { fencedAtMs: number; nqns: readonly string[] }): string[] {
    if (record.fencedAtMs <= this.watchdogSeenMs) return [];
    this.watchdogSeenMs = record.fencedAtMs;
    const fenced: string[] = [];
    for (const nqn of record.nqns) {
      const key = [...this.nexusServed].find(([, t]) => t.nqn === nqn)?.[0];
      if (key === undefined) {
        this.watchdogFenced.set(nqn, record.fencedAtMs);
        continue;
      }
      if (this.selfFenced.has(key)) continue;
      this.selfFenced.set(key, record.fencedAtMs);
      fenced.push(key);
      this.queue.add(key);
    }
    if (fenced.length > 0)
      this.o.logger.warn(
        "the target watchdog fenced volumes this node serves: serving waits for a heartbeat",
        {
          partitions: fenced,
          fencedAtMs: record.fencedAtMs,
        },
      );
    return fenced;
  }

  /**
   * The nexus exports this node serves now, not fenced, with their volumes' bounds: what the
   * target watchdog's lease lists. A nexus whose volume moved away is listed until it is
   * retired: if the agent dies first, its listener must not stay optimized.
   */
  servingNexus(): { nqn: string; failoverAfterSeconds: number | undefined }[] {
    const out: { nqn: string; failoverAfterSeconds: number | undefined }[] = [];
    for (const [key, served] of this.nexusServed) {
      if (this.selfFenced.has(key)) continue;
      out.push({
        nqn: served.nqn,
        failoverAfterSeconds: this.partitions.get(key)?.spec.failoverAfterSeconds,
      });
    }
    return out;
  }

  /**
   * Fences this node from the volumes it serves over a local copy once its heartbeats have not
   * gone through for SELF_FENCE_FRACTION of a volume's failoverAfterSeconds: the export turns
   * standby (listeners ANA inaccessible, then the namespace out) with no API call before it, so
   * a node cut off from the API server stops acknowledging writes before the manager moves the
   * volume. Called periodically; the volume's own pass lifts the fence. Returns the keys fenced now.
   */
  async checkSelfFence(): Promise<string[]> {
    const last = this.o.lastHeartbeatMs;
    const backend = this.o.backends.spdk;
    if (!last || !backend?.ensureStandby) return [];
    const fenced: string[] = [];
    for (const [key, served] of this.nexusServed) {
      if (this.selfFenced.has(key)) continue;
      const p = this.partitions.get(key);
      const copy = this.localCopyOf(key);
      if (!p || !copy || p.spec.nodeName !== this.o.nodeName) continue;
      const nowMs = this.o.clock.now();
      const due = selfFenceDue({
        lastHeartbeatMs: last(),
        startedMs: this.startedMs,
        failoverAfterSeconds: p.spec.failoverAfterSeconds,
        nowMs,
      });
      if (!due) continue;
      this.selfFenced.set(key, nowMs);
      const externalId = externalIdFor(p.metadata.uid as string);
      const transport = p.spec.targetOptions?.transport ?? "rdma";
      const portal = await this.o.portal(transport);
      if (!portal) {
        // No endpoint: nothing listens to acknowledge writes either; the export goes entirely.
        await backend.removeExport(served.nqn);
      } else {
        const more = (this.o.morePortalAddresses ?? []).filter((a) => a !== portal.address);
        await backend.ensureStandby({
          nqn: served.nqn,
          transport,
          address: portal.address,
          port: p.spec.targetOptions?.portalPort ?? portal.port,
          ...(more.length > 0 ? { moreAddresses: more } : {}),
          serialNumber: serialNumberFor(externalId),
          cntlidRange: cntlidRangeFor(replicaIndex(copy.metadata.name)),
          ...(p.spec.targetOptions?.tls ? { tls: true } : {}),
        });
      }
      await this.step("self-fence", key);
      fenced.push(key);
      this.o.logger.warn(
        "self-fenced: no heartbeat went through for most of the failover bound; the volume's export here is standby until one does",
        {
          partition: key,
          nqn: served.nqn,
          failoverAfterSeconds: p.spec.failoverAfterSeconds,
        },
      );
      // Best effort: the API server is what this node cannot reach.
      void this.o.events
        ?.record(
          p,
          "Warning",
          "SelfFenced",
          "Serve",
          `node ${this.o.nodeName} stopped serving: its heartbeats are not going through`,
        )
        .catch(() => {});
      this.queue.add(key);
    }
    return fenced;
  }

  /**
   * Replicated volumes this agent assembled a nexus for, by key, and what serving them made on
   * this node's target. Kept in memory only: see retireNexus.
   */
  private readonly nexusServed = new Map<string, NexusTeardown>();

  /**
   * Takes down the nexus of a volume this node served and serves no more: its spec.nodeName moved
   * to another node (a failover; the manager fenced this node from every copy before it moved
   * it) or it is gone. The volume's subsystem goes first, so no consumer keeps a path to a raid
   * that can no longer reach its copies; then the raid and the copies' controllers. Read afresh
   * from the API server first: a volume that is still (or again) served here is left alone.
   */
  private async retireNexus(
    key: string,
    t: NexusTeardown,
    copy: NVMePartition | undefined,
  ): Promise<{ requeueAfterMs?: number } | undefined> {
    const { namespace, name } = splitKey(key);
    const now = await this.partClient.get(name, namespace ?? this.o.namespace);
    if (now && now.spec.nodeName === this.o.nodeName && !now.metadata.deletionTimestamp) return;
    const backend = this.o.backends.spdk;
    if (!backend || !this.nexus) return;
    if (copy && now && !now.metadata.deletionTimestamp && backend.ensureStandby) {
      // This node still holds a copy: its export stays as a standby (listeners inaccessible,
      // then the raid's namespace out), so its consumers keep a path for a failback.
      await this.standbyExport(key, copy, now, backend);
    } else {
      await backend.removeExport(t.nqn);
      await this.step("unexport", key);
    }
    const detached = await this.nexus.teardown(t);
    await this.step("nexus-teardown", key);
    this.nexusServed.delete(key);
    this.selfFenced.delete(key);
    const note = now
      ? `served by ${now.spec.nodeName ?? "(none yet)"} now: this node's nexus is taken down (export ${t.nqn}, raid ${t.raidBdev}, ${detached.length} controller(s))`
      : `volume gone: this node's nexus is taken down (export ${t.nqn}, raid ${t.raidBdev})`;
    this.o.logger.info("nexus retired", { partition: key, nqn: t.nqn, detached });
    if (now) await this.o.events?.record(now, "Normal", "NexusRetired", "Serve", note);
    return;
  }

  /**
   * Planned handover (HANDOVER_ANNOTATION names this node): stop taking writes FIRST (the
   * export turns standby: listeners ANA inaccessible, then the raid's namespace out; without a
   * local copy the export goes), then tear the raid down (so nothing on this node can write to a
   * copy, local or remote), and only then record status.releasedBy, guarded by the volume still
   * being served here and the request still naming this node. The manager fences, promotes and
   * serves elsewhere on that record. Repeatable: every step treats done as done.
   */
  private async releaseNexus(
    key: string,
    p: NVMePartition,
    plan: NexusPlan,
    log: Logger,
  ): Promise<{ requeueAfterMs: number }> {
    const backend = this.o.backends.spdk as TargetBackend;
    const nexus = this.nexus as NexusAssembler;
    const me = this.o.nodeName;
    if (p.status?.releasedBy === me && this.released.has(key)) return { requeueAfterMs: 2000 };
    await this.step("nexus-release", key);
    const copy = this.localCopyOf(key);
    if (copy && backend.ensureStandby) await this.standbyExport(key, copy, p, backend);
    else {
      await backend.removeExport(plan.nqn);
      await this.step("unexport", key);
    }
    const t: NexusTeardown = this.nexusServed.get(key) ?? {
      nqn: plan.nqn,
      raidBdev: plan.raidBdev,
      controllers: plan.members.map((m) => m.controller),
    };
    const detached = await nexus.teardown(t);
    // Kept as served: once the volume is served elsewhere the usual retire removes what is left.
    this.nexusServed.set(key, t);
    this.rebuilds?.forget(p.metadata.uid as string);
    const uid = p.metadata.uid;
    const stored = await updateStatus(this.partClient, p.metadata.name, p.metadata.namespace, (latest) => {
      if (
        latest.metadata.uid !== uid ||
        latest.spec.nodeName !== me ||
        latest.metadata.annotations?.[HANDOVER_ANNOTATION] !== me ||
        !latest.status
      )
        return undefined;
      if (latest.status.releasedBy === me) return undefined;
      return { ...latest.status, releasedBy: me };
    });
    if (stored?.status?.releasedBy !== me) return { requeueAfterMs: 500 };
    this.released.add(key);
    await this.step("nexus-released", key);
    const note = `planned handover: this node released the volume (export ${copy ? "standby" : "removed"}, raid ${t.raidBdev} torn down, ${detached.length} controller(s) detached); it takes no more writes`;
    log.info("nexus released for a handover", { raid: t.raidBdev, detached });
    await this.o.events?.record(p, "Normal", "Released", "Handover", note);
    return { requeueAfterMs: 2000 };
  }

  /** Volumes this node released in a planned handover (in memory; the API record is the proof). */
  private readonly released = new Set<string>();

  /** Copy key -> when this agent first found it unreachable from the volume it serves. */
  private readonly memberDown = new Map<string, number>();

  /**
   * Copies of `p` the manager marked retiring (a drain, once their replacement is current): the
   * serving node is the one that lowers a copy, so it records them Stale ("retired: <why>") at a
   * raised data generation over the copies that go on (a status write guarded by the generation
   * it read), and only then takes them out of its raid (bdev_raid_remove_base_bdev) and detaches
   * them: until the record is stored the copy still receives every write, so a crash between the
   * steps leaves nothing current that missed writes. Never the last current copy. Returns the
   * requeue when it acted; undefined when nothing retires.
   */
  private async retireCopies(
    key: string,
    p: NVMePartition,
    plan: NexusPlan,
    log: Logger,
  ): Promise<{ requeueAfterMs: number } | undefined> {
    const g = p.status?.dataGeneration;
    if (g === undefined) return undefined;
    const current = currentCopies(p);
    const retiring = current.filter((e) => e.retiring !== undefined);
    if (retiring.length === 0) return undefined;
    if (retiring.length >= current.length) {
      log.warn("every current copy is marked retiring: none is retired (one must go on)", {
        copies: retiring.map((e) => e.name),
      });
      return undefined;
    }
    const uid = p.metadata.uid as string;
    const names = new Set(retiring.map((e) => e.name));
    await this.step("nexus-retire", key);
    const stored = await updateStatus(this.partClient, p.metadata.name, p.metadata.namespace, (latest) => {
      const s = latest.status;
      if (latest.metadata.uid !== uid || !s || s.dataGeneration !== g) return undefined;
      const entries = s.replicas ?? [];
      const isCurrent = (e: (typeof entries)[number]) =>
        e.generation === g && (e.state === "Online" || e.state === "Degraded");
      const still = entries.filter((e) => names.has(e.name) && isCurrent(e) && e.retiring !== undefined);
      if (still.length !== names.size) return undefined;
      if (!entries.some((e) => isCurrent(e) && !names.has(e.name))) return undefined;
      return {
        ...s,
        dataGeneration: g + 1,
        replicas: entries.map((e) => {
          if (names.has(e.name))
            return { ...e, state: "Stale" as const, message: `retired: ${e.retiring}`.slice(0, 1024) };
          return isCurrent(e) ? { ...e, generation: g + 1 } : e;
        }),
      };
    });
    if (stored?.status?.dataGeneration !== g + 1) return { requeueAfterMs: 500 };
    for (const m of plan.members)
      if (names.has(m.name)) await (this.nexus as NexusAssembler).retireMember(plan.raidBdev, m);
    await this.step("nexus-retired", key);
    const note = `copies ${[...names].join(", ")} retired (${retiring.map((e) => e.retiring).join("; ")}): recorded Stale at data generation ${g + 1}, then taken out of raid ${plan.raidBdev}; writes go on on the others`;
    log.info("copies retired", { copies: [...names], generation: g + 1 });
    await this.o.events?.record(p, "Normal", "CopyRetired", "Serve", note);
    return { requeueAfterMs: 500 };
  }

  /**
   * Records copies of `p` unreachable past the bound as Faulted at a raised data generation (a
   * status write guarded by the generation it read), then detaches them. Returns the requeue
   * when it acted; undefined when nothing is overdue (or every copy is: nothing to go on with).
   */
  private async degradeNexus(
    key: string,
    p: NVMePartition,
    plan: NexusPlan,
    unreachable: ReadonlyMap<string, string>,
    log: Logger,
    checked?: ReadonlySet<string>,
  ): Promise<{ requeueAfterMs: number } | undefined> {
    const uid = p.metadata.uid as string;
    const now = this.o.clock.now();
    // A copy seen reachable starts its clock again; one this look did not check keeps it.
    for (const m of plan.members)
      if (!unreachable.has(m.name) && (checked?.has(m.name) ?? true))
        this.memberDown.delete(`${uid}/${m.name}`);
    const bound = this.o.nexusDegradeAfterMs ?? NEXUS_DEGRADE_AFTER_MS;
    const overdue: string[] = [];
    for (const name of unreachable.keys()) {
      const k = `${uid}/${name}`;
      const since = this.memberDown.get(k) ?? now;
      this.memberDown.set(k, since);
      if (now - since >= bound) overdue.push(name);
    }
    if (overdue.length === 0) return undefined;
    if (overdue.length >= plan.members.length) {
      log.warn("every copy of a served volume is unreachable: its I/O stays held", {
        copies: [...unreachable].map(([n, st]) => `${n}: ${st}`),
      });
      return undefined;
    }
    const g = p.status?.dataGeneration as number;
    const lost = new Set(overdue);
    const at = new Date(now).toISOString();
    await this.step("nexus-degrade", key);
    const stored = await updateStatus(this.partClient, p.metadata.name, p.metadata.namespace, (latest) => {
      const s = latest.status;
      if (latest.metadata.uid !== uid || !s || s.dataGeneration !== g) return undefined;
      const entries = s.replicas ?? [];
      const isCurrent = (e: (typeof entries)[number]) =>
        e.generation === g && (e.state === "Online" || e.state === "Degraded");
      if (!overdue.every((n) => entries.some((e) => e.name === n && isCurrent(e)))) return undefined;
      return {
        ...s,
        dataGeneration: g + 1,
        replicas: entries.map((e) => {
          if (lost.has(e.name))
            return {
              ...e,
              state: "Faulted" as const,
              message: `unreachable from serving node ${this.o.nodeName} (${unreachable.get(e.name)}) since ${at}; writes go on without it`,
            };
          return isCurrent(e) ? { ...e, generation: g + 1 } : e;
        }),
      };
    });
    if (stored?.status?.dataGeneration !== g + 1) return { requeueAfterMs: 500 };
    for (const m of plan.members) {
      if (!lost.has(m.name)) continue;
      await (this.nexus as NexusAssembler).dropMember(m);
      this.memberDown.delete(`${uid}/${m.name}`);
    }
    const note = `copies ${overdue.join(", ")} unreachable for ${Math.round(bound / 1000)} s: recorded Faulted at data generation ${g + 1}, then dropped from the raid; writes go on on the others`;
    log.warn("replicated volume degraded", { copies: overdue, generation: g + 1 });
    await this.o.events?.record(p, "Warning", "CopyFaulted", "Serve", note);
    return { requeueAfterMs: 500 };
  }

  private async lockDevice(p: NVMePartition, backend: BackendName): Promise<void> {
    const dev = this.deviceFor(p) as NVMeDevice;
    let conflict: string | undefined;
    await updateStatus(this.devClient, dev.metadata.name, undefined, (latest) => {
      const active = latest.status?.activeBackend;
      if (active === backend) return undefined;
      if (active) {
        conflict = active;
        return undefined;
      }
      return {
        ...(latest.status ?? { phase: "Available", conditions: [] }),
        activeBackend: backend,
      } as NonNullable<NVMeDevice["status"]>;
    });
    if (conflict) {
      const why = {
        reason: "BackendConflict",
        message: `device ${dev.metadata.name} was just locked to the ${conflict} backend; a ${backend} partition cannot share it`,
      };
      await this.report(p, "Failed", why);
      throw new TerminalError(new StorageError("precondition", why.message));
    }
  }

  private async provision(key: string, p: NVMePartition, t: Target, lock: boolean, log: Logger) {
    const { backend, vm } = this.backendOf(t);
    if (lock) {
      await this.lockDevice(p, t.backend);
      await this.step("device-lock", key);
    }
    if (p.status?.state !== "Exported") {
      await this.report(
        p,
        "Provisioning",
        { reason: "Provisioning", message: `carving ${t.volume.sizeBytes} bytes on ${t.volume.device.name}` },
        "Unknown",
      );
    }
    let device: DeviceRef;
    try {
      device = await backend.prepareDevice(t.volume.device);
    } catch (err) {
      if (!(err instanceof StorageError && err.details.reason === DRIVE_MISSING)) throw err;
      // Not a fault that backing off cures: say so on the partition and look again now and then.
      await this.report(p, "Pending", { reason: DRIVE_MISSING, message: err.message });
      log.warn("drive missing for its backend; retrying slowly", { error: err.message });
      return { requeueAfterMs: DRIVE_MISSING_RETRY_MS };
    }
    await this.step("prepare-device", key);
    try {
      await vm.prepareLayout(device);
    } catch (err) {
      if (!(err instanceof StorageError && err.details.reason === DRIVE_NOT_BLANK)) throw err;
      // Someone's data may be on the drive: nothing is written until an operator wipes it.
      const why = { reason: DRIVE_NOT_BLANK, message: err.message };
      await this.report(p, "Pending", why);
      await this.o.events?.record(p, "Warning", DRIVE_NOT_BLANK, "Provision", err.message);
      log.warn("drive not blank; not creating an lvstore on it", { error: err.message });
      return { requeueAfterMs: DRIVE_MISSING_RETRY_MS };
    }
    await this.step("layout", key);
    const volume = await vm.ensureVolume({ ...t.volume, device });
    await this.step("volume", key);
    return this.exportVolume(key, p, t, backend, volume, log);
  }

  /**
   * Exports `volume` as partition `p` (subsystem, namespace, listeners, rate limits, host ACL from
   * its attachment record) and writes status Exported: the second half of provisioning, shared
   * by a drive's partitions and replicated volumes (whose volume is the nexus raid). `note` is
   * appended to the Ready message.
   */
  private async exportVolume(
    key: string,
    p: NVMePartition,
    t: Target,
    backend: TargetBackend,
    volume: Volume,
    log: Logger,
    note?: string,
    served?: Pick<ExportSpec, "cntlidRange" | "keepOptimized">,
  ): Promise<{ requeueAfterMs?: number } | undefined> {
    const transport = p.spec.targetOptions?.transport ?? "rdma";
    const portal = await this.o.portal(transport);
    if (!portal) {
      const why = {
        reason: "NoPortal",
        message: `node ${this.o.nodeName} has no usable ${transport} endpoint`,
      };
      await this.report(p, "Pending", why);
      throw new StorageError("unavailable", why.message);
    }
    const port = p.spec.targetOptions?.portalPort ?? portal.port;
    // Only a backend that reports its listeners serves further portals (the kernel's does not).
    const more = backend.listening
      ? (this.o.morePortalAddresses ?? []).filter((a) => a !== portal.address)
      : [];
    let repaired: string[];
    try {
      repaired = await backend.ensureExport({
        nqn: t.nqn,
        volume,
        transport,
        address: portal.address,
        port,
        ...(more.length > 0 ? { moreAddresses: more } : {}),
        serialNumber: serialNumberFor(t.volume.externalId),
        ...(t.namespaceUuid ? { namespaceUuid: t.namespaceUuid } : {}),
        ...(p.spec.targetOptions?.tls ? { tls: true } : {}),
        ...served,
      });
    } catch (err) {
      if (!(err instanceof StorageError && err.details.reason === TLS_UNSUPPORTED)) throw err;
      // The target cannot serve TLS (an SPDK without the HKDF salt fix): nothing but another
      // target image fixes it, so say why on the partition and look again now and then.
      const why = { reason: TLS_UNSUPPORTED, message: err.message };
      await this.report(p, "Pending", why);
      log.warn("TLS export refused by the backend", { error: err.message });
      return { requeueAfterMs: DRIVE_MISSING_RETRY_MS };
    }
    // What really listens, not what was asked: a backend without multipath serves the primary only.
    const listening: PortalStatus[] = (
      backend.listening?.(t.nqn) ?? [{ transport, address: portal.address, port }]
    ).map((l) => ({ address: l.address, port: l.port, ...(l.anaState ? { anaState: l.anaState } : {}) }));
    const missing = more.filter((a) => !listening.some((l) => l.address === a));
    await this.step("export", key);
    // Limits before the ACL: after a target restart no host is back before its limits are.
    let applied: QosLimits | undefined;
    if (backend.applyQos) {
      const r = await backend.applyQos(volume, t.qos);
      applied = r.applied;
      if (r.changed && p.status?.state === "Exported") log.info("rate limits applied", { ...applied });
    } else if (!isUnlimited(t.qos)) {
      // decide() refuses this for the kernel backend; any other backend without QoS lands here.
      throw new TerminalError(
        new StorageError("unimplemented", `the ${t.backend} backend cannot enforce spec.qos rate limits`),
      );
    }
    await this.step("qos", key);
    // The hosts are read from the attachment cache under the NQN's ACL lock, never before it.
    await aclLocks.run(t.nqn, async () => {
      const hosts = desiredHosts(p, this.attachmentsFor(p));
      const acl = await keyedAclFor(p, hosts, this.o.secrets);
      await backend.setHosts(t.nqn, acl.hosts, acl.keys, acl.psks);
    });
    await this.step("acl", key);
    const wasExported = p.status?.state === "Exported";
    const expected = this.restarts.verified(key, t.backend, repaired.length > 0);
    if (wasExported && repaired.length > 0 && expected) {
      log.debug("export repaired after the target restart", { repaired });
    } else if (wasExported && repaired.length > 0) {
      log.warn("export was incomplete and has been repaired", { repaired });
      await this.o.events?.record(
        p,
        "Warning",
        "ExportRepaired",
        "Verify",
        `repaired: ${repaired.join(", ")}`,
      );
    }
    // Exported/Ready=True is only ever written here, after a pass verified the export, and is
    // deliberately not withdrawn while a target restart has the export down: the replay restores
    // it within seconds without anyone acting on the partition, and flipping every partition's
    // status would add two writes per partition competing with that replay. The restart is
    // reported once for the node instead (reportRestart); a repair that keeps failing leaves
    // this status as it was and shows as the partition's failing reconciles.
    await this.setStatus(
      p,
      (s) => {
        s.state = "Exported";
        s.externalId = t.volume.externalId;
        s.backendPath = volume.backendPath;
        s.nqn = t.nqn;
        s.portalIP = portal.address;
        s.portalPort = port;
        s.portals = listening;
        s.transport = transport;
        s.allocatedBytes = volume.sizeBytes;
        s.capacity = formatQuantity(volume.sizeBytes);
        if (applied) s.qos = applied;
        else delete s.qos;
      },
      {
        type: "Ready",
        status: "True",
        reason: "Exported",
        message:
          `${t.nqn} on ${listening.map((l) => `${transport}://${l.address}:${l.port}`).join(", ")}` +
          (missing.length > 0 ? `; not listening on ${missing.map((a) => `${a}:${port}`).join(", ")}` : "") +
          (note ? `; ${note}` : ""),
      },
    );
    if (missing.length > 0 && !sameList(p.status?.portals, listening)) {
      // Once per change of the listening set, not on every verify pass.
      await this.o.events?.record(
        p,
        "Warning",
        "PortalUnavailable",
        "Export",
        `${t.nqn} does not listen on ${missing.map((a) => `${a}:${port}`).join(", ")}: the address is in use or not configured on ${this.o.nodeName}`,
      );
    }
    await this.step("status", key);
    if (!wasExported) {
      log.info("partition exported", { nqn: t.nqn, bytes: volume.sizeBytes });
      await this.o.events?.record(
        p,
        "Normal",
        "Exported",
        "Provision",
        `${t.nqn} on ${portal.address}:${port}`,
      );
    }
    // Verified again by the next sweep (scheduleSweep), with every other export.
    return undefined;
  }

  private async deprovision(key: string, p: NVMePartition, t: Target, log: Logger) {
    const dev = this.deviceFor(p);
    // Provisioning only starts once the drive is locked to the partition's backend: when the
    // drive serves another backend, nothing of this partition can exist on it.
    if (dev && dev.status?.activeBackend !== t.backend && p.status?.state !== "Exported") {
      await this.dropFinalizer(p);
      await this.step("finalizer-removed", key);
      log.info("partition released; it never reached its backend", { backend: t.backend });
      return;
    }
    const { backend, vm } = this.backendOf(t);
    if (!dev || dev.status?.phase === "Unavailable") {
      // The volume lives on that drive: dropping the finalizer now would leak it for good.
      const why = {
        reason: "DeviceUnavailable",
        message: `cleanup waits for device ${p.spec.deviceSerial} to be present on ${this.o.nodeName}`,
      };
      await this.report(p, "Deleting", why);
      throw new StorageError("unavailable", why.message);
    }
    await backend.removeExport(t.nqn);
    await this.step("unexport", key);
    const volumeKey = volumeKeyOfCopy(p);
    if (volumeKey && p.spec.replicaOf) await this.removeStandby(volumeKey, p.spec.replicaOf.uid);
    const device = await backend.prepareDevice(t.volume.device);
    await vm.deleteVolume({ ...t.volume, device });
    await this.step("delete-volume", key);
    await this.dropFinalizer(p);
    await this.step("finalizer-removed", key);
    log.info("partition cleaned up", { nqn: t.nqn });
  }

  /** Removes our finalizer from the live object of this exact UID (a replacement is left alone). */
  private async dropFinalizer(p: NVMePartition): Promise<void> {
    const latest = await this.partClient.get(p.metadata.name, p.metadata.namespace);
    if (latest && latest.metadata.uid === p.metadata.uid) {
      await this.partClient.replace({
        ...latest,
        metadata: {
          ...latest.metadata,
          finalizers: (latest.metadata.finalizers ?? []).filter((f) => f !== PARTITION_FINALIZER),
        },
      });
    }
  }
}

/** The work-queue key of the volume a copy (replica partition) belongs to, or undefined. */
export function volumeKeyOfCopy(p: NVMePartition): string | undefined {
  const of = p.spec.replicaOf;
  return of ? objectKey({ name: of.name, namespace: p.metadata.namespace }) : undefined;
}
