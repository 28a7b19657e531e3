// The CSI Controller service: volumes are NVMePartitions in the driver namespace, publications their
// one NVMeVolumeAttachment each. RPCs validate before any API call, run one at a time per volume,
// and wait for the manager and agent on watch caches within the caller's deadline.
import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import * as k8s from "@kubernetes/client-node";
import {
  API_VERSION,
  type ContentSource,
  kinds,
  type NVMeDevice,
  type NVMePartition,
  type NVMeSnapshot,
  type NVMeVolumeAttachment,
  type RDMAStorageNode,
} from "../api/index.ts";
import {
  ControllerServiceCapability_RPC_Type as Cap,
  type Controller,
  type ControllerExpandVolumeRequest,
  type ControllerGetVolumeHealthRequest,
  type ControllerGetVolumeRequest,
  type ControllerListVolumeHealthRequest,
  type ControllerPublishVolumeRequest,
  type ControllerUnpublishVolumeRequest,
  type CreateSnapshotRequest,
  type CreateVolumeRequest,
  type DeleteSnapshotRequest,
  type DeleteVolumeRequest,
  type GetCapacityRequest,
  type ListSnapshotsRequest,
  type ListVolumesRequest,
  type SnapshotSchema,
  type ValidateVolumeCapabilitiesRequest,
  VolumeHealthErrorType,
  type VolumeSchema,
} from "../gen/csi/v1/csi_pb.ts";
import type { Clock } from "../lib/clock.ts";
import { errorMessage, StorageError } from "../lib/errors.ts";
import type { WatchCache } from "../lib/kube/cache.ts";
import { CacheSet } from "../lib/kube/cache-set.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import type { EventRecorder } from "../lib/kube/events.ts";
import {
  HOST_NQN_ANNOTATION,
  kubeNodeDirectory,
  type NodeDirectory,
} from "../lib/kube/host-nqn-annotation.ts";
import { type KubeObject, kubeError, objectKey, ResourceClient } from "../lib/kube/resource.ts";
import type { Logger } from "../lib/log.ts";
import { ALLOCATION_UNIT } from "../lib/units.ts";
import { PublishContextKeys } from "../lib/volume-context.ts";
import {
  capabilityKey,
  malformedReason,
  type NormalizedCapability,
  requireSupported,
  unsupportedReason,
} from "./controller/capabilities.ts";
import { resolveCapacity } from "./controller/capacity.ts";
import { availableCapacity } from "./controller/capacity-report.ts";
import { buildPartition, type CreatePlan, planCreateVolume } from "./controller/create-request.ts";
import {
  ACCESS_ANNOTATION,
  accessPending,
  accessReady,
  decidePublish,
  decideUnpublish,
  FENCED_ANNOTATION,
  PREVIOUS_NODE_ANNOTATION,
  type PublishIntent,
  READONLY_ANNOTATION,
} from "./controller/fencing.ts";
import {
  Annotations,
  canonicalJson,
  compareFingerprints,
  PROVISIONED_BY,
  PROVISIONED_BY_LABEL,
  readRecord,
  type VolumeRecord,
} from "./controller/fingerprint.ts";
import { InFlight } from "./controller/in-flight.ts";
import {
  type ClaimState,
  claimOf,
  decideOrphan,
  preliminaryVerdict,
  pvNameOf,
} from "./controller/orphans.ts";
import { paginate } from "./controller/pagination.ts";
import { parseParameters } from "./controller/parameters.ts";
import { accessibleTopology } from "./controller/topology.ts";
import {
  attachmentNameFor,
  formatVolumeId,
  MAX_REQUEST_NAME_LENGTH,
  parseVolumeId,
  partitionNameFor,
  type VolumeRef,
} from "./controller/volume-id.ts";
import {
  capacityOf,
  createVerdict,
  progressOf,
  volumeContextOf,
  volumeHealth,
} from "./controller/volume-view.ts";
import { CacheWaiter, type CallContext, withBudget } from "./controller/waiter.ts";
import { aborted, alreadyExists, csiError, failedPrecondition, invalidArgument, notFound } from "./errors.ts";

/**
 * What ControllerGetCapabilities advertises, and nothing else: every entry is backed by a handler
 * below. Snapshots and clones are SPDK lvol snapshots and clones (spdk backend only). Read-only
 * publication (the target ACL is per host, not per mode) and ModifyVolume (no mutable parameters)
 * are absent.
 */
export const CONTROLLER_CAPABILITIES: readonly Cap[] = [
  Cap.CREATE_DELETE_VOLUME,
  Cap.PUBLISH_UNPUBLISH_VOLUME,
  Cap.LIST_VOLUMES,
  Cap.LIST_VOLUMES_PUBLISHED_NODES,
  Cap.GET_CAPACITY,
  Cap.GET_VOLUME,
  Cap.GET_VOLUME_HEALTH,
  Cap.LIST_VOLUME_HEALTH,
  Cap.EXPAND_VOLUME,
  Cap.SINGLE_NODE_MULTI_WRITER,
  Cap.CREATE_DELETE_SNAPSHOT,
  Cap.LIST_SNAPSHOTS,
  Cap.CLONE_VOLUME,
];

/** Annotations CreateSnapshot records on an NVMeSnapshot for idempotency checks. */
export const SnapshotAnnotations = {
  requestName: "storage.distort.io/snapshot-request-name",
  sourceVolumeId: "storage.distort.io/source-volume-id",
} as const;

export interface ControllerOptions {
  conn: KubeConnection;
  /** The process's watch caches, one per kind (csi/main.ts); a private set when omitted. */
  caches?: CacheSet;
  /** Where NVMePartitions and NVMeVolumeAttachments live (csi/config.ts keeps it short enough for ids). */
  namespace: string;
  logger: Logger;
  clock: Clock;
  /** How long a call without a deadline may wait for the manager and agent. */
  defaultTimeoutMs: number;
  /** Size of a volume whose CreateVolume carries no capacity range. */
  defaultVolumeBytes: number;
  /** Node id -> registered host NQN; Kubernetes Node objects by default. */
  nodes?: NodeDirectory;
  /** Attachment lifetime ids; random UUIDs by default. */
  newAttachmentId?: () => string;
  events?: EventRecorder;
  /**
   * Periodic collection of partitions whose claim vanished before a PV existed (see
   * collectOrphans). Absent: no background collection (tests that own their partitions).
   */
  orphans?: { graceMs: number; intervalMs: number };
}

type Impl = Partial<ServiceImpl<typeof Controller>>;
type VolumeInit = MessageInitShape<typeof VolumeSchema>;
type SnapshotInit = MessageInitShape<typeof SnapshotSchema>;

/**
 * The controller side of the driver. start() begins the list/watch caches (calls made before
 * they sync answer UNAVAILABLE); stop() ends them. One instance per process; its in-flight set
 * makes concurrent calls on one volume answer ABORTED.
 */
export class CsiController {
  readonly partitions: WatchCache<NVMePartition>;
  readonly attachments: WatchCache<NVMeVolumeAttachment>;
  readonly devices: WatchCache<NVMeDevice>;
  readonly storageNodes: WatchCache<RDMAStorageNode>;
  readonly snapshots: WatchCache<NVMeSnapshot>;
  readonly inFlight = new InFlight();
  private readonly partClient: ResourceClient<NVMePartition>;
  private readonly attClient: ResourceClient<NVMeVolumeAttachment>;
  private readonly snapClient: ResourceClient<NVMeSnapshot>;
  private readonly snapshotWaiter: CacheWaiter<NVMeSnapshot>;
  private readonly partitionWaiter: CacheWaiter<NVMePartition>;
  private readonly attachmentWaiter: CacheWaiter<NVMeVolumeAttachment>;
  private readonly nodes: NodeDirectory;
  private readonly newAttachmentId: () => string;
  private readonly ns: string;
  private readonly log: Logger;

  constructor(private readonly o: ControllerOptions) {
    this.ns = o.namespace;
    this.log = o.logger;
    this.partClient = new ResourceClient(o.conn, kinds.NVMePartition);
    this.attClient = new ResourceClient(o.conn, kinds.NVMeVolumeAttachment);
    const caches = o.caches ?? new CacheSet(o.conn, { logger: o.logger });
    this.partitions = caches.cache(kinds.NVMePartition, { namespace: o.namespace });
    this.attachments = caches.cache(kinds.NVMeVolumeAttachment, { namespace: o.namespace });
    this.devices = caches.cache(kinds.NVMeDevice);
    // Placement considers storage nodes in every namespace; so does GetCapacity.
    this.storageNodes = caches.cache(kinds.RDMAStorageNode);
    this.snapClient = new ResourceClient(o.conn, kinds.NVMeSnapshot);
    this.snapshots = caches.cache(kinds.NVMeSnapshot, { namespace: o.namespace });
    this.snapshotWaiter = new CacheWaiter(this.snapshots);
    this.partitionWaiter = new CacheWaiter(this.partitions);
    this.attachmentWaiter = new CacheWaiter(this.attachments);
    this.nodes = o.nodes ?? kubeNodeDirectory(o.conn);
    this.newAttachmentId = o.newAttachmentId ?? randomUUID;
  }

  private caches() {
    return [this.partitions, this.attachments, this.devices, this.storageNodes, this.snapshots] as const;
  }

  /**
   * Starts the caches; resolves once all five have listed. With `orphans` configured, then runs
   * an orphan sweep at once and every `intervalMs` until stop().
   */
  async start(): Promise<void> {
    await Promise.all(this.caches().map((c) => c.start()));
    if (this.o.orphans && !this.stopped) this.scheduleSweep(0);
  }

  /** Stops the orphan sweeps (waiting for one in progress) and the caches. Idempotent. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.cancelSweep?.();
    await this.sweeping;
    await Promise.all(this.caches().map((c) => c.stop()));
  }

  private stopped = false;
  private cancelSweep: (() => void) | undefined;
  private sweeping: Promise<unknown> | undefined;

  private scheduleSweep(ms: number): void {
    const orphans = this.o.orphans;
    if (!orphans || this.stopped) return;
    this.cancelSweep = this.o.clock.setTimeout(() => {
      this.sweeping = this.collectOrphans(orphans.graceMs)
        .catch((err) => this.log.warn("orphan sweep failed", { err: errorMessage(err) }))
        .finally(() => this.scheduleSweep(orphans.intervalMs));
    }, ms);
  }

  /**
   * One orphan sweep: deletes every cached partition decideOrphan condemns (claim annotations,
   * older than `graceMs`, no PV, no attachment, claim gone or replaced) through the normal
   * deletion path (finalizers let the manager and agent release storage) and records an
   * "OrphanCollected" Event on it. Returns the names it deleted. Idempotent and safe across
   * replicas: each deletion re-reads the partition and carries its uid as a precondition, and a
   * partition with an operation in flight in this process is left for the next sweep. Throws
   * when the PersistentVolumes cannot be listed; a failed claim lookup or deletion only skips
   * that partition (logged).
   */
  async collectOrphans(graceMs: number): Promise<string[]> {
    if (!this.synced) return [];
    const now = this.o.clock.now();
    const candidates = this.partitions.list().filter((p) => !preliminaryVerdict(p, now, graceMs));
    if (candidates.length === 0) return [];
    const core = this.o.conn.api(k8s.CoreV1Api);
    const pvs = await core.listPersistentVolume().catch((err) => {
      throw kubeError(err, "list PersistentVolumes");
    });
    const pvNames = new Set<string>();
    const handled = new Set<string>();
    for (const pv of pvs.items) {
      if (pv.metadata?.name) pvNames.add(pv.metadata.name);
      const ref = parseVolumeId(pv.spec?.csi?.volumeHandle ?? "");
      // Any incarnation of the name counts: doubt keeps the partition.
      if (ref?.namespace === this.ns) handled.add(ref.name);
    }
    const deleted: string[] = [];
    for (const cached of candidates) {
      const name = cached.metadata.name;
      try {
        const gone = await this.inFlight.run(this.key(name), "orphan collection", async () => {
          // The cache may lag: judge the partition as the API server has it now.
          const p = await this.partClient.get(name, this.ns);
          if (!p || p.metadata.uid !== cached.metadata.uid) return false;
          const claim = claimOf(p);
          if (!claim) return false;
          const pvName = pvNameOf(p);
          const verdict = decideOrphan(p, {
            claim: await this.claimState(core, claim.namespace, claim.name),
            hasPersistentVolume: handled.has(name) || (pvName !== undefined && pvNames.has(pvName)),
            attached: this.attachments.list().some((a) => a.spec.partitionUID === p.metadata.uid),
            now: this.o.clock.now(),
            graceMs,
          });
          if (verdict.action === "keep") return false;
          try {
            if (!(await this.partClient.delete(name, this.ns, { uid: p.metadata.uid as string })))
              return false;
          } catch (err) {
            // The uid precondition failed: this incarnation is already gone.
            if (err instanceof StorageError && err.kind === "conflict") return false;
            throw err;
          }
          this.log.info("orphaned volume deleted", { partition: this.key(name), reason: verdict.reason });
          await this.o.events?.record(
            p,
            "Normal",
            "OrphanCollected",
            "Delete",
            `deleted: ${verdict.reason} and no PersistentVolume was ever created for it`,
          );
          return true;
        });
        if (gone) deleted.push(name);
      } catch (err) {
        this.log.warn("orphan check skipped", { partition: this.key(name), err: errorMessage(err) });
      }
    }
    return deleted;
  }

  /** The claim as the API server has it now; throws (skipping the partition) on anything but 404. */
  private async claimState(core: k8s.CoreV1Api, namespace: string, name: string): Promise<ClaimState> {
    try {
      const c = await core.readNamespacedPersistentVolumeClaim({ name, namespace });
      return { exists: true, uid: c.metadata?.uid ?? "", deleting: !!c.metadata?.deletionTimestamp };
    } catch (err) {
      const e = kubeError(err, `get PersistentVolumeClaim ${namespace}/${name}`);
      if (e.kind === "not-found") return { exists: false };
      throw e;
    }
  }

  get synced(): boolean {
    return this.caches().every((c) => c.hasSynced);
  }

  /**
   * Readiness for Identity.Probe and /readyz: undefined when ready, else why not. Asks the API
   * server for /version (bounded by `timeoutMs`), so an unreachable API server shows up even while
   * the caches still hold their last contents.
   */
  async notReadyReason(timeoutMs = 2000): Promise<string | undefined> {
    if (!this.synced) return "controller caches have not synced with the API server yet";
    try {
      const res = await this.o.conn.request("/version", { signal: AbortSignal.timeout(timeoutMs) });
      await res.body?.cancel();
      return res.ok ? undefined : `API server answered /version with HTTP ${res.status}`;
    } catch (err) {
      return `API server unreachable: ${errorMessage(err)}`;
    }
  }

  /** The Controller service implementation to register with serveGrpc. */
  service(): Impl {
    return {
      createVolume: (r, ctx) => this.createVolume(r, ctx),
      deleteVolume: (r, ctx) => this.deleteVolume(r, ctx),
      controllerPublishVolume: (r, ctx) => this.publish(r, ctx),
      controllerUnpublishVolume: (r, ctx) => this.unpublish(r, ctx),
      validateVolumeCapabilities: (r) => this.validateVolumeCapabilities(r),
      listVolumes: (r) => this.listVolumes(r),
      getCapacity: (r) => this.getCapacity(r),
      controllerGetCapabilities: () => ({
        capabilities: CONTROLLER_CAPABILITIES.map((type) => ({ type: { case: "rpc", value: { type } } })),
      }),
      controllerGetVolume: (r) => this.getVolume(r),
      controllerGetVolumeHealth: (r) => this.getVolumeHealth(r),
      controllerListVolumeHealth: (r) => this.listVolumeHealth(r),
      controllerExpandVolume: (r, ctx) => this.expandVolume(r, ctx),
      createSnapshot: (r, ctx) => this.createSnapshot(r, ctx),
      deleteSnapshot: (r, ctx) => this.deleteSnapshot(r, ctx),
      listSnapshots: (r) => this.listSnapshots(r),
    };
  }

  // ---- helpers ------------------------------------------------------------------------------

  private requireSynced(): void {
    if (!this.synced)
      throw new StorageError(
        "unavailable",
        "the CSI controller is still syncing its caches with the API server",
      );
  }

  private key(name: string): string {
    return objectKey({ namespace: this.ns, name });
  }

  /** The volume an id designates, or undefined when the id is not one of this driver's. */
  private ref(volumeId: string): VolumeRef | undefined {
    const ref = parseVolumeId(volumeId);
    // Only the configured namespace is watched (and authorized); ids elsewhere are not ours.
    return ref && ref.namespace === this.ns ? ref : undefined;
  }

  /** The partition of exactly this incarnation, read from the API server; undefined when gone. */
  private async partitionOf(ref: VolumeRef): Promise<NVMePartition | undefined> {
    const p = await this.partClient.get(ref.name, ref.namespace);
    return p && p.metadata.uid === ref.uid ? p : undefined;
  }

  private budget<R>(ctx: CallContext, wait: (signal: AbortSignal) => Promise<R>, onTimeout: () => string) {
    return withBudget(ctx, this.o.clock, this.o.defaultTimeoutMs, wait, onTimeout);
  }

  /**
   * Waits until the object `uid` under `name` is gone, judged from the cache and confirmed by the
   * API server: the cache may not even have seen it yet, and "absent from the cache" must never
   * become an early OK. A replacement with another UID counts as gone.
   */
  private async waitGone<T extends KubeObject>(
    waiter: CacheWaiter<T>,
    client: ResourceClient<T>,
    name: string,
    uid: string,
    signal: AbortSignal,
    seen: (o: T) => void,
  ): Promise<void> {
    let mustSee = false;
    for (;;) {
      let sawIt = false;
      await waiter.waitFor(
        this.key(name),
        (o) => {
          if (o && o.metadata.uid === uid) {
            sawIt = true;
            seen(o);
            return undefined;
          }
          return sawIt || !mustSee ? true : undefined;
        },
        signal,
      );
      const again = await client.get(name, this.ns);
      if (!again || again.metadata.uid !== uid) return;
      seen(again);
      // The cache had not caught up with the object: wait to see it, then to see it go.
      mustSee = true;
    }
  }

  private storageNodeLabels(nodeName: string | undefined): Record<string, string> {
    if (!nodeName) return {};
    let best: RDMAStorageNode | undefined;
    for (const n of this.storageNodes.list()) {
      if (n.spec.nodeName !== nodeName) continue;
      if (!best || (n.status?.lastHeartbeatTime ?? "") > (best.status?.lastHeartbeatTime ?? "")) best = n;
    }
    return best?.metadata.labels ?? {};
  }

  private volumeOf(p: NVMePartition): VolumeInit {
    const record = readRecord(p.metadata.annotations);
    return {
      volumeId: formatVolumeId({ namespace: this.ns, name: p.metadata.name, uid: p.metadata.uid as string }),
      capacityBytes: BigInt(capacityOf(p)),
      volumeContext: volumeContextOf(p, record) ?? {},
      accessibleTopology: accessibleTopology(p.spec.topology, this.storageNodeLabels(p.spec.nodeName)),
    };
  }

  /**
   * Cached partitions a volume id can name. A partition made by hand with a name longer than ids
   * allow is skipped rather than failing the whole listing.
   */
  private addressable(): NVMePartition[] {
    return this.partitions.list().filter((p) => {
      const uid = p.metadata.uid;
      return uid !== undefined && parseVolumeId(`${this.ns}/${p.metadata.name}/${uid}`) !== undefined;
    });
  }

  /** Node ids of live attachments per partition UID. */
  private publishedNodes(): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const a of this.attachments.list()) {
      if (a.metadata.deletionTimestamp) continue;
      const list = out.get(a.spec.partitionUID) ?? [];
      list.push(a.spec.nodeId);
      out.set(a.spec.partitionUID, list);
    }
    return out;
  }

  // ---- CreateVolume -------------------------------------------------------------------------

  private async createVolume(req: CreateVolumeRequest, ctx: HandlerContext) {
    const plan = planCreateVolume(req, { namespace: this.ns, defaultVolumeBytes: this.o.defaultVolumeBytes });
    this.requireSynced();
    const source = plan.record.source
      ? await this.resolveContentSource(plan.record.source, plan.record.sizeBytes)
      : undefined;
    const key = this.key(plan.partitionName);
    return this.inFlight.run(key, `CreateVolume ${req.name}`, async () => {
      const p = await this.ensurePartition(plan, source);
      const uid = p.metadata.uid as string;
      let last: NVMePartition | undefined = p;
      const exported = await this.budget(
        ctx,
        (signal) =>
          this.partitionWaiter.waitFor(
            key,
            (o) => {
              if (o) last = o;
              return createVerdict(o, uid);
            },
            signal,
          ),
        () => `volume ${req.name} (NVMePartition ${key}) is not exported yet: ${progressOf(last)}`,
      );
      const volume = this.volumeOf(exported);
      if (req.volumeContentSource) volume.contentSource = req.volumeContentSource;
      return { volume };
    });
  }

  /**
   * The exact object a clone or restore copies from (the planner already refused the kernel
   * backend for the new volume). NOT_FOUND for a missing source, FAILED_PRECONDITION for a
   * kernel-backend or unready source, OUT_OF_RANGE when the new volume would be smaller.
   */
  private async resolveContentSource(
    source: NonNullable<VolumeRecord["source"]>,
    sizeBytes: number,
  ): Promise<ContentSource> {
    const ref = this.ref(source.id);
    let sourceBytes: number;
    let out: ContentSource;
    if (source.kind === "snapshot") {
      const s = ref && (await this.snapshotOf(ref));
      if (!s || s.metadata.deletionTimestamp) throw notFound(`snapshot ${source.id} does not exist`);
      if (!s.status?.readyToUse) throw failedPrecondition(`snapshot ${source.id} is not ready to use yet`);
      sourceBytes = s.status.sizeBytes ?? 0;
      out = { kind: "Snapshot", name: s.metadata.name, uid: s.metadata.uid as string };
    } else {
      const p = ref && (await this.partitionOf(ref));
      if (!p || p.metadata.deletionTimestamp) throw notFound(`source volume ${source.id} does not exist`);
      if ((p.spec.backend ?? "spdk") !== "spdk")
        throw invalidArgument(
          `source volume ${source.id} uses the kernel backend, whose partitions cannot be cloned`,
        );
      sourceBytes = p.spec.sizeBytes;
      out = { kind: "Partition", name: p.metadata.name, uid: p.metadata.uid as string };
    }
    if (sizeBytes < sourceBytes)
      throw csiError(
        "out-of-range",
        `the new volume (${sizeBytes} bytes) would be smaller than its source ${source.id} (${sourceBytes} bytes)`,
      );
    return out;
  }

  /** The snapshot of exactly this incarnation, read from the API server; undefined when gone. */
  private async snapshotOf(ref: VolumeRef): Promise<NVMeSnapshot | undefined> {
    const s = await this.snapClient.get(ref.name, ref.namespace);
    return s && s.metadata.uid === ref.uid ? s : undefined;
  }

  /** Creates the plan's partition, or finds the one an earlier attempt created and checks it. */
  private async ensurePartition(plan: CreatePlan, source?: ContentSource): Promise<NVMePartition> {
    for (let attempt = 0; attempt < 4; attempt++) {
      const existing = await this.partClient.get(plan.partitionName, this.ns);
      if (!existing) {
        try {
          const created = await this.partClient.create(buildPartition(plan, this.ns, source));
          this.log.info("volume requested", {
            volume: plan.requestName,
            partition: this.key(plan.partitionName),
            bytes: plan.record.sizeBytes,
            backend: plan.record.params.backend,
          });
          return created;
        } catch (err) {
          if (err instanceof StorageError && err.kind === "already-exists") continue;
          throw err;
        }
      }
      const ann = existing.metadata.annotations ?? {};
      const owner = ann[Annotations.requestName];
      if (owner !== plan.requestName) {
        throw alreadyExists(
          `NVMePartition ${this.key(plan.partitionName)} belongs to ${owner === undefined ? "a volume made outside CSI" : `volume ${JSON.stringify(owner)}`}, not ${JSON.stringify(plan.requestName)}`,
        );
      }
      if (existing.metadata.deletionTimestamp)
        throw aborted(`volume ${plan.requestName} is being deleted; retry once it is gone`);
      switch (compareFingerprints(ann[Annotations.fingerprint], plan.fingerprint)) {
        case "same":
          return existing;
        case "different":
          throw alreadyExists(
            `volume ${plan.requestName} already exists with ${differences(readRecord(ann), plan.record)}`,
          );
        case "topology-differs": {
          if (existing.spec.nodeName) {
            throw alreadyExists(
              `volume ${plan.requestName} is already placed on ${existing.spec.nodeName} for other accessibility requirements`,
            );
          }
          // Not placed yet: the claim was rescheduled (WaitForFirstConsumer); follow its new node.
          const spec = { ...existing.spec };
          if (plan.topology) spec.topology = plan.topology;
          else delete spec.topology;
          try {
            return await this.partClient.replace({
              ...existing,
              metadata: {
                ...existing.metadata,
                annotations: { ...ann, [Annotations.fingerprint]: plan.fingerprint },
              },
              spec,
            });
          } catch (err) {
            if (err instanceof StorageError && err.kind === "conflict") continue;
            throw err;
          }
        }
      }
    }
    throw aborted(
      `NVMePartition ${this.key(plan.partitionName)} kept changing while CreateVolume read it; retry`,
    );
  }

  // ---- DeleteVolume -------------------------------------------------------------------------

  private async deleteVolume(req: DeleteVolumeRequest, ctx: HandlerContext) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    const ref = this.ref(req.volumeId);
    if (!ref) return {}; // never one of ours: already deleted as far as CSI is concerned
    this.requireSynced();
    const key = this.key(ref.name);
    return this.inFlight.run(key, "DeleteVolume", async () => {
      const p = await this.partitionOf(ref);
      if (!p) return {};
      const holders = await this.attachmentsOf(ref);
      if (holders.length > 0) {
        throw failedPrecondition(
          `volume is published to ${holders.map((a) => `node ${a.spec.nodeId} (NVMeVolumeAttachment ${a.metadata.name})`).join(", ")}; ControllerUnpublishVolume must run first`,
        );
      }
      if (!p.metadata.deletionTimestamp) {
        try {
          await this.partClient.delete(ref.name, this.ns, { uid: ref.uid });
        } catch (err) {
          // The uid precondition failed: the name now belongs to another object, ours is gone.
          if (err instanceof StorageError && err.kind === "conflict") return {};
          throw err;
        }
      }
      let last: NVMePartition | undefined = p;
      await this.budget(
        ctx,
        (signal) =>
          this.waitGone(this.partitionWaiter, this.partClient, ref.name, ref.uid, signal, (o) => {
            last = o;
          }),
        () => `cleanup of volume ${key} is not finished: ${progressOf(last)}`,
      );
      this.log.info("volume deleted", { partition: key, uid: ref.uid });
      return {};
    });
  }

  /** Attachments of this partition incarnation: the deterministic one, plus any the cache shows. */
  private async attachmentsOf(ref: VolumeRef): Promise<NVMeVolumeAttachment[]> {
    const byName = await this.attClient.get(attachmentNameFor(ref.name, ref.uid), this.ns);
    const found = new Map<string, NVMeVolumeAttachment>();
    if (byName && byName.spec.partitionUID === ref.uid) found.set(byName.metadata.name, byName);
    for (const a of this.attachments.list())
      if (a.spec.partitionUID === ref.uid && !found.has(a.metadata.name)) found.set(a.metadata.name, a);
    return [...found.values()];
  }

  // ---- ControllerPublishVolume / ControllerUnpublishVolume ----------------------------------

  private async publish(req: ControllerPublishVolumeRequest, ctx: HandlerContext) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    if (!req.nodeId) throw invalidArgument("node_id is required");
    if (!req.volumeCapability) throw invalidArgument("volume_capability is required");
    const [cap] = requireSupported([req.volumeCapability], "volume_capability") as [NormalizedCapability];
    const ref = this.ref(req.volumeId);
    if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
    this.requireSynced();
    const key = this.key(ref.name);
    return this.inFlight.run(key, `ControllerPublishVolume ${req.nodeId}`, async () => {
      const p = await this.partitionOf(ref);
      if (!p || p.metadata.deletionTimestamp) throw notFound(`volume ${req.volumeId} does not exist`);
      const node = await this.nodes.get(req.nodeId);
      if (!node) throw notFound(`node ${req.nodeId} does not exist`);
      const hostNQN = node.hostNQN;
      if (!hostNQN) {
        throw failedPrecondition(
          `node ${req.nodeId} has not registered its NVMe host NQN (Node annotation ${HOST_NQN_ANNOTATION}); the DISTORT node plugin writes it from /etc/nvme/hostnqn when it starts there`,
        );
      }
      const intent: PublishIntent = {
        nodeId: req.nodeId,
        hostNQN,
        access: capabilityKey(cap),
        readonly: req.readonly,
      };
      let last: NVMeVolumeAttachment | undefined;
      const a = await this.budget(
        ctx,
        (signal) =>
          this.authorize(p, ref, intent, signal, (o) => {
            last = o;
          }),
        () => `node ${req.nodeId} is not authorized on volume ${key} yet: ${accessPending(last)}`,
      );
      return {
        publishContext: {
          [PublishContextKeys.hostNQN]: a.spec.hostNQN,
          [PublishContextKeys.attachmentId]: a.spec.attachmentId,
        },
      };
    });
  }

  /** Brings the partition's attachment to `intent` (section 3.8) and waits for AccessReady. */
  private async authorize(
    p: NVMePartition,
    ref: VolumeRef,
    intent: PublishIntent,
    signal: AbortSignal,
    seen: (a: NVMeVolumeAttachment) => void,
  ): Promise<NVMeVolumeAttachment> {
    const name = attachmentNameFor(ref.name, ref.uid);
    const annotations = {
      [READONLY_ANNOTATION]: String(intent.readonly),
      [ACCESS_ANNOTATION]: intent.access,
    };
    for (;;) {
      const cur = await this.attClient.get(name, this.ns);
      if (cur) seen(cur);
      if (cur && cur.spec.partitionUID !== ref.uid)
        throw new StorageError(
          "internal",
          `NVMeVolumeAttachment ${name} belongs to partition UID ${cur.spec.partitionUID}`,
        );
      const d = decidePublish(cur, intent);
      switch (d.action) {
        case "create": {
          let created: NVMeVolumeAttachment;
          try {
            created = await this.attClient.create({
              apiVersion: API_VERSION,
              kind: "NVMeVolumeAttachment",
              metadata: {
                name,
                namespace: this.ns,
                labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
                annotations,
              },
              spec: {
                partitionName: ref.name,
                partitionUID: ref.uid,
                nodeId: intent.nodeId,
                hostNQN: intent.hostNQN,
                attachmentId: this.newAttachmentId(),
              },
            });
          } catch (err) {
            if (err instanceof StorageError && err.kind === "already-exists") continue;
            throw err;
          }
          this.log.info("volume publication requested", {
            partition: this.key(ref.name),
            node: intent.nodeId,
          });
          return this.awaitReady(created, signal, seen);
        }
        case "wait-gone":
          await this.waitGone(
            this.attachmentWaiter,
            this.attClient,
            name,
            (cur as NVMeVolumeAttachment).metadata.uid as string,
            signal,
            seen,
          );
          continue;
        case "await-ready":
          return this.awaitReady(cur as NVMeVolumeAttachment, signal, seen);
        case "renew":
        case "takeover": {
          const c = cur as NVMeVolumeAttachment;
          const ann: Record<string, string> = { ...(c.metadata.annotations ?? {}), ...annotations };
          delete ann[FENCED_ANNOTATION];
          if (d.action === "takeover") ann[PREVIOUS_NODE_ANNOTATION] = d.from;
          let switched: NVMeVolumeAttachment;
          try {
            // resourceVersion-guarded: an unpublish or another takeover in between wins, we re-read.
            switched = await this.attClient.replace({
              ...c,
              metadata: { ...c.metadata, annotations: ann },
              spec: {
                ...c.spec,
                nodeId: intent.nodeId,
                hostNQN: intent.hostNQN,
                attachmentId: this.newAttachmentId(),
              },
            });
          } catch (err) {
            if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found"))
              continue;
            throw err;
          }
          const what = d.action === "takeover" ? `taken over from fenced node ${d.from}` : d.reason;
          this.log.warn("volume publication switched", {
            partition: this.key(ref.name),
            node: intent.nodeId,
            why: what,
          });
          void this.o.events?.record(
            p,
            "Warning",
            d.action === "takeover" ? "TakenOver" : "HostNQNChanged",
            "Publish",
            `publication for node ${intent.nodeId}: ${what}`,
          );
          return this.awaitReady(switched, signal, seen);
        }
        case "refuse":
          throw failedPrecondition(d.message, { holder: d.holder });
        case "incompatible":
          throw alreadyExists(d.message);
      }
    }
  }

  /**
   * Waits until the agent enforces exactly `a`'s lifetime. A cached copy older than `a` (lower
   * generation) is "not yet"; a newer one with another lifetime, or being deleted, means someone
   * else changed the publication meanwhile: ABORTED, and the CO's retry decides afresh.
   */
  private awaitReady(
    a: NVMeVolumeAttachment,
    signal: AbortSignal,
    seen: (a: NVMeVolumeAttachment) => void,
  ): Promise<NVMeVolumeAttachment> {
    const id = a.spec.attachmentId;
    const generation = a.metadata.generation ?? 0;
    return this.attachmentWaiter.waitFor(
      this.key(a.metadata.name),
      (o) => {
        // Another incarnation in the cache is either one it has not dropped yet or a replacement
        // made after ours was removed; either way not ours to judge, and the budget bounds it.
        if (!o || o.metadata.uid !== a.metadata.uid || (o.metadata.generation ?? 0) < generation)
          return undefined;
        seen(o);
        if (o.metadata.deletionTimestamp)
          throw aborted(`the publication is being removed by a concurrent unpublish`);
        if (o.spec.attachmentId !== id)
          throw aborted(`the publication changed to node ${o.spec.nodeId} meanwhile`);
        return accessReady(o, id) ? o : undefined;
      },
      signal,
    );
  }

  private async unpublish(req: ControllerUnpublishVolumeRequest, ctx: HandlerContext) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    const ref = this.ref(req.volumeId);
    if (!ref) return {}; // no such volume: nothing is published
    this.requireSynced();
    const key = this.key(ref.name);
    const name = attachmentNameFor(ref.name, ref.uid);
    return this.inFlight.run(key, `ControllerUnpublishVolume ${req.nodeId}`, async () => {
      let last: NVMeVolumeAttachment | undefined;
      await this.budget(
        ctx,
        async (signal) => {
          const cur = await this.attClient.get(name, this.ns);
          if (cur) last = cur;
          const d = decideUnpublish(cur?.spec.partitionUID === ref.uid ? cur : undefined, req.nodeId);
          if (d.action === "done") return;
          const c = cur as NVMeVolumeAttachment;
          if (d.action === "delete") await this.attClient.delete(name, this.ns, { uid: c.metadata.uid });
          await this.waitGone(
            this.attachmentWaiter,
            this.attClient,
            name,
            c.metadata.uid as string,
            signal,
            (o) => {
              last = o;
            },
          );
          this.log.info("volume unpublished", { partition: key, node: c.spec.nodeId });
        },
        () =>
          `revoking access of ${last?.spec.nodeId ?? req.nodeId} to volume ${key} is not finished: the agent holds the attachment until the target ACL is revoked`,
      ).catch((err) => {
        // The uid precondition failed: the attachment we read is gone already.
        if (err instanceof StorageError && err.kind === "conflict") return;
        throw err;
      });
      return {};
    });
  }

  // ---- ValidateVolumeCapabilities -----------------------------------------------------------

  private async validateVolumeCapabilities(req: ValidateVolumeCapabilitiesRequest) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    if (req.volumeCapabilities.length === 0) throw invalidArgument("volume_capabilities is required");
    req.volumeCapabilities.forEach((c, i) => {
      const why = malformedReason(c);
      if (why) throw invalidArgument(`volume_capabilities[${i}]: ${why}`);
    });
    const ref = this.ref(req.volumeId);
    if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
    const p = await this.partitionOf(ref);
    if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
    const unconfirmed = (message: string) => ({ message });
    for (const c of req.volumeCapabilities) {
      const why = unsupportedReason(c);
      if (why) return unconfirmed(why);
    }
    const record = readRecord(p.metadata.annotations);
    const caps = requireSupported(req.volumeCapabilities, "volume_capabilities");
    const fsType = record?.params.fsType;
    const clash = fsType && caps.find((c) => c.access === "mount" && c.fsType && c.fsType !== fsType);
    if (clash) return unconfirmed(`the volume was created for ${fsType}, not ${clash.fsType}`);
    if (Object.keys(req.volumeContext).length > 0) {
      const ours = volumeContextOf(p, record);
      if (!ours) return unconfirmed(`the volume is not exported (${progressOf(p)})`);
      if (canonicalJson(ours) !== canonicalJson(req.volumeContext))
        return unconfirmed("volume_context does not match the volume's current context");
    }
    if (Object.keys(req.parameters).length > 0) {
      let params: VolumeRecord["params"];
      try {
        params = parseParameters(req.parameters, this.ns).params;
      } catch (err) {
        return unconfirmed(errorMessage(err));
      }
      const have: VolumeRecord["params"] = record?.params ?? {
        backend: p.spec.backend ?? "spdk",
        volumeManager: p.spec.volumeManager ?? "partition",
        transport: p.spec.targetOptions?.transport ?? "rdma",
      };
      if (canonicalJson(params) !== canonicalJson(have))
        return unconfirmed(`parameters differ from the volume's: it was created with ${canonicalJson(have)}`);
    }
    if (Object.keys(req.mutableParameters).length > 0)
      return unconfirmed("mutable_parameters are not supported");
    return {
      confirmed: {
        volumeContext: req.volumeContext,
        volumeCapabilities: req.volumeCapabilities,
        parameters: req.parameters,
      },
    };
  }

  // ---- ListVolumes / ControllerGetVolume / GetCapacity --------------------------------------

  private listVolumes(req: ListVolumesRequest) {
    this.requireSynced();
    const published = this.publishedNodes();
    const page = paginate(this.addressable(), (p) => p.metadata.name, req.maxEntries, req.startingToken);
    return {
      entries: page.entries.map((p) => ({
        volume: this.volumeOf(p),
        status: { publishedNodeIds: published.get(p.metadata.uid as string) ?? [] },
      })),
      nextToken: page.nextToken,
    };
  }

  private async getVolume(req: ControllerGetVolumeRequest) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    const ref = this.ref(req.volumeId);
    const p = ref && (await this.partitionOf(ref));
    if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
    this.requireSynced();
    return {
      volume: this.volumeOf(p),
      status: { publishedNodeIds: this.publishedNodes().get(p.metadata.uid as string) ?? [] },
    };
  }

  private async getVolumeHealth(req: ControllerGetVolumeHealthRequest) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    const ref = this.ref(req.volumeId);
    const p = ref && (await this.partitionOf(ref));
    if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
    return { volumeHealth: this.healthOf(p) };
  }

  /** Abnormal volumes only, as CSI asks; same keyset pagination as ListVolumes. */
  private listVolumeHealth(req: ControllerListVolumeHealthRequest) {
    this.requireSynced();
    const abnormal = this.addressable().filter((p) => volumeHealth(p).length > 0);
    const page = paginate(abnormal, (p) => p.metadata.name, req.maxEntries, req.startingToken);
    return { entries: page.entries.map((p) => this.healthOf(p)), nextToken: page.nextToken };
  }

  private healthOf(p: NVMePartition) {
    return {
      volumeId: formatVolumeId({ namespace: this.ns, name: p.metadata.name, uid: p.metadata.uid as string }),
      healthStatuses: volumeHealth(p).map((h) => ({
        status: VolumeHealthErrorType[h.status],
        reason: h.reason,
        message: h.message,
      })),
    };
  }

  private getCapacity(req: GetCapacityRequest) {
    const { params } = parseParameters(req.parameters, this.ns);
    for (const [i, c] of req.volumeCapabilities.entries()) {
      const why = malformedReason(c);
      if (why) throw invalidArgument(`volume_capabilities[${i}]: ${why}`);
      // Capacity for volumes DISTORT cannot make is none at all.
      if (unsupportedReason(c)) return { availableCapacity: 0n };
    }
    this.requireSynced();
    const answer = availableCapacity(this.devices.list(), this.storageNodes.list(), {
      backend: params.backend,
      ...(req.accessibleTopology ? { segments: req.accessibleTopology.segments } : {}),
    });
    return {
      availableCapacity: BigInt(answer.availableBytes),
      maximumVolumeSize: BigInt(answer.maximumVolumeBytes),
      minimumVolumeSize: BigInt(ALLOCATION_UNIT),
    };
  }

  // ---- CreateSnapshot / DeleteSnapshot / ListSnapshots --------------------------------------
  // Snapshots are NVMeSnapshots in the driver namespace; ids have the volume id shape
  // "<namespace>/<snapshot name>/<uid>". The in-flight key is prefixed so a snapshot and a volume
  // of the same name never serialise against each other.

  private snapshotInfo(s: NVMeSnapshot): SnapshotInit {
    const created = s.status?.creationTime ?? s.metadata.creationTimestamp;
    let sourceVolumeId = s.metadata.annotations?.[SnapshotAnnotations.sourceVolumeId] ?? "";
    if (!sourceVolumeId) {
      const src = { namespace: this.ns, name: s.spec.sourcePartitionName, uid: s.spec.sourcePartitionUID };
      if (parseVolumeId(`${src.namespace}/${src.name}/${src.uid}`)) sourceVolumeId = formatVolumeId(src);
    }
    return {
      snapshotId: formatVolumeId({
        namespace: this.ns,
        name: s.metadata.name,
        uid: s.metadata.uid as string,
      }),
      sourceVolumeId,
      sizeBytes: BigInt(s.status?.sizeBytes ?? 0),
      readyToUse: s.status?.readyToUse === true,
      ...(created ? { creationTime: timestampFromDate(new Date(created)) } : {}),
    };
  }

  /** Ready=False for a reason waiting cannot cure (the agent refused the snapshot). */
  private static snapshotRefusal(s: NVMeSnapshot): string | undefined {
    const c = s.status?.conditions?.find((x) => x.type === "Ready");
    return c?.status === "False" && (c.reason === "SourceNotFound" || c.reason === "UnsupportedBackend")
      ? c.message
      : undefined;
  }

  private async createSnapshot(req: CreateSnapshotRequest, ctx: HandlerContext) {
    if (!req.name) throw invalidArgument("name is required");
    const nameBytes = Buffer.byteLength(req.name);
    if (nameBytes > MAX_REQUEST_NAME_LENGTH)
      throw invalidArgument(
        `name is ${nameBytes} bytes long; at most ${MAX_REQUEST_NAME_LENGTH} are allowed`,
      );
    if (!req.sourceVolumeId) throw invalidArgument("source_volume_id is required");
    if (Object.keys(req.parameters).length > 0)
      throw invalidArgument(
        `CreateSnapshot takes no parameters (got ${Object.keys(req.parameters).join(", ")})`,
      );
    this.requireSynced();
    const name = partitionNameFor(req.name);
    const key = this.key(name);
    return this.inFlight.run(`snapshot:${key}`, `CreateSnapshot ${req.name}`, async () => {
      let s = await this.snapClient.get(name, this.ns);
      if (s) {
        const ann = s.metadata.annotations ?? {};
        if (ann[SnapshotAnnotations.requestName] !== req.name)
          throw alreadyExists(`NVMeSnapshot ${key} belongs to another snapshot request`);
        if (ann[SnapshotAnnotations.sourceVolumeId] !== req.sourceVolumeId)
          throw alreadyExists(
            `snapshot ${req.name} already exists for source volume ${ann[SnapshotAnnotations.sourceVolumeId]}, not ${req.sourceVolumeId}`,
          );
        if (s.metadata.deletionTimestamp)
          throw aborted(`snapshot ${req.name} is being deleted; retry once it is gone`);
      } else {
        const ref = this.ref(req.sourceVolumeId);
        const p = ref && (await this.partitionOf(ref));
        if (!ref || !p || p.metadata.deletionTimestamp)
          throw notFound(`source volume ${req.sourceVolumeId} does not exist`);
        if ((p.spec.backend ?? "spdk") !== "spdk")
          throw failedPrecondition(
            `source volume ${req.sourceVolumeId} uses the kernel backend: disk partitions cannot be snapshotted`,
          );
        try {
          s = await this.snapClient.create({
            apiVersion: API_VERSION,
            kind: "NVMeSnapshot",
            metadata: {
              name,
              namespace: this.ns,
              labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
              annotations: {
                [SnapshotAnnotations.requestName]: req.name,
                [SnapshotAnnotations.sourceVolumeId]: req.sourceVolumeId,
              },
            },
            spec: { sourcePartitionName: ref.name, sourcePartitionUID: ref.uid },
          });
        } catch (err) {
          if (err instanceof StorageError && err.kind === "already-exists")
            throw aborted(`snapshot ${req.name} was created concurrently; retry`);
          throw err;
        }
        this.log.info("snapshot requested", { snapshot: key, source: req.sourceVolumeId });
      }
      const uid = s.metadata.uid as string;
      let last: NVMeSnapshot | undefined = s;
      const ready = await this.budget(
        ctx,
        (signal) =>
          this.snapshotWaiter.waitFor(
            key,
            (o) => {
              if (!o || o.metadata.uid !== uid) return undefined;
              last = o;
              const refused = CsiController.snapshotRefusal(o);
              if (refused) throw failedPrecondition(refused);
              return o.status?.readyToUse ? o : undefined;
            },
            signal,
          ),
        () => {
          const c = last?.status?.conditions?.find((x) => x.type === "Ready");
          return `snapshot ${req.name} (NVMeSnapshot ${key}) is not ready yet${c ? `: ${c.reason}: ${c.message}` : ""}`;
        },
      );
      return { snapshot: this.snapshotInfo(ready) };
    });
  }

  private async deleteSnapshot(req: DeleteSnapshotRequest, ctx: HandlerContext) {
    if (!req.snapshotId) throw invalidArgument("snapshot_id is required");
    const ref = this.ref(req.snapshotId);
    if (!ref) return {}; // never one of ours
    this.requireSynced();
    const key = this.key(ref.name);
    return this.inFlight.run(`snapshot:${key}`, "DeleteSnapshot", async () => {
      const s = await this.snapshotOf(ref);
      if (!s) return {};
      if (!s.metadata.deletionTimestamp) {
        try {
          await this.snapClient.delete(ref.name, this.ns, { uid: ref.uid });
        } catch (err) {
          if (err instanceof StorageError && err.kind === "conflict") return {};
          throw err;
        }
      }
      // Clones still reading from the snapshot keep its lvol alive; the agent deletes it once
      // they are gone. For CSI the snapshot is deleted as soon as the agent says so.
      const blocked = Symbol("blocked");
      try {
        await this.budget(
          ctx,
          (signal) =>
            this.waitGone(this.snapshotWaiter, this.snapClient, ref.name, ref.uid, signal, (o) => {
              if (o.status?.conditions?.some((c) => c.type === "DeletionBlocked" && c.status === "True"))
                throw blocked;
            }),
          () => `deletion of snapshot ${key} is not finished: the agent holds its finalizer`,
        );
      } catch (err) {
        if (err !== blocked) throw err;
        this.log.info("snapshot deletion deferred until its clones are gone", { snapshot: key });
        return {};
      }
      this.log.info("snapshot deleted", { snapshot: key, uid: ref.uid });
      return {};
    });
  }

  private listSnapshots(req: ListSnapshotsRequest) {
    this.requireSynced();
    let items = this.snapshots.list().filter((s) => {
      const uid = s.metadata.uid;
      return (
        uid !== undefined &&
        !s.metadata.deletionTimestamp &&
        parseVolumeId(`${this.ns}/${s.metadata.name}/${uid}`) !== undefined
      );
    });
    if (req.snapshotId) {
      const ref = this.ref(req.snapshotId);
      items = ref ? items.filter((s) => s.metadata.name === ref.name && s.metadata.uid === ref.uid) : [];
    }
    if (req.sourceVolumeId)
      items = items.filter((s) => this.snapshotInfo(s).sourceVolumeId === req.sourceVolumeId);
    const page = paginate(items, (s) => s.metadata.name, req.maxEntries, req.startingToken);
    return {
      entries: page.entries.map((s) => ({ snapshot: this.snapshotInfo(s) })),
      nextToken: page.nextToken,
    };
  }

  // ---- ControllerExpandVolume ---------------------------------------------------------------

  private async expandVolume(req: ControllerExpandVolumeRequest, ctx: HandlerContext) {
    if (!req.volumeId) throw invalidArgument("volume_id is required");
    const range = req.capacityRange;
    if (!range || (range.requiredBytes === 0n && range.limitBytes === 0n))
      throw invalidArgument("capacity_range with required_bytes or limit_bytes is required");
    let cap: NormalizedCapability | undefined;
    if (req.volumeCapability) [cap] = requireSupported([req.volumeCapability], "volume_capability");
    const target = resolveCapacity(range, 0);
    const ref = this.ref(req.volumeId);
    if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
    this.requireSynced();
    const key = this.key(ref.name);
    return this.inFlight.run(key, "ControllerExpandVolume", async () => {
      const p = await this.partitionOf(ref);
      if (!p || p.metadata.deletionTimestamp) throw notFound(`volume ${req.volumeId} does not exist`);
      const record = readRecord(p.metadata.annotations);
      // A filesystem must be grown by the node after the device grew; a raw block volume need not.
      const nodeExpansionRequired = cap
        ? cap.access === "mount"
        : (record?.capabilities.some((c) => c.access === "mount") ?? true);
      const current = capacityOf(p);
      if (target <= current && target <= p.spec.sizeBytes) {
        if (range.limitBytes > 0n && BigInt(current) > range.limitBytes)
          throw csiError(
            "out-of-range",
            `volume holds ${current} bytes, more than limit_bytes ${range.limitBytes}; volumes never shrink`,
          );
        return { capacityBytes: BigInt(current), nodeExpansionRequired };
      }
      if ((p.spec.backend ?? "spdk") !== "spdk") {
        throw failedPrecondition(
          `volume ${req.volumeId} uses the kernel backend, whose partitions cannot grow in place; only spdk volumes expand`,
        );
      }
      let patched = p;
      if (p.spec.sizeBytes < target)
        patched = await this.partClient.mergePatch(ref.name, this.ns, { spec: { sizeBytes: target } });
      const generation = patched.metadata.generation ?? 0;
      let last: NVMePartition | undefined = patched;
      const grown = await this.budget(
        ctx,
        (signal) =>
          this.partitionWaiter.waitFor(
            key,
            (o) => {
              if (!o || (o.metadata.generation ?? 0) < generation) return undefined;
              last = o;
              if (o.metadata.uid !== ref.uid || o.metadata.deletionTimestamp)
                throw aborted(`volume ${req.volumeId} went away during expansion`);
              if (o.status?.state === "Failed")
                throw csiError("unavailable", `expansion failed: ${progressOf(o)}`);
              return o.status?.state === "Exported" && capacityOf(o) >= target ? o : undefined;
            },
            signal,
          ),
        () =>
          `volume ${key} has not grown to ${target} bytes yet (allocated ${last ? capacityOf(last) : "?"}): ${progressOf(last)}`,
      );
      this.log.info("volume expanded", { partition: key, bytes: capacityOf(grown) });
      return { capacityBytes: BigInt(capacityOf(grown)), nodeExpansionRequired };
    });
  }
}

/** What differs between the stored request and a new one, for ALREADY_EXISTS messages. */
function differences(stored: VolumeRecord | undefined, wanted: VolumeRecord): string {
  if (!stored) return "no recorded request (created outside CSI, or by an incompatible version)";
  const out: string[] = [];
  if (stored.sizeBytes !== wanted.sizeBytes)
    out.push(`capacity ${stored.sizeBytes} bytes (asked: ${wanted.sizeBytes})`);
  if (canonicalJson(stored.params) !== canonicalJson(wanted.params))
    out.push(`parameters ${canonicalJson(stored.params)} (asked: ${canonicalJson(wanted.params)})`);
  if (canonicalJson(stored.capabilities) !== canonicalJson(wanted.capabilities))
    out.push(
      `capabilities ${stored.capabilities.map(capabilityKey).join(", ")} (asked: ${wanted.capabilities.map(capabilityKey).join(", ")})`,
    );
  if (canonicalJson(stored.source ?? null) !== canonicalJson(wanted.source ?? null))
    out.push("another content source");
  return out.length ? out.join("; ") : "a different request";
}
