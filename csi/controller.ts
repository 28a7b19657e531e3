// The CSI Controller service: volumes are NVMePartitions in the driver namespace, publications their
// one NVMeVolumeAttachment each. This file owns the lifecycle (caches, orphan sweeps, readiness)
// and routes each RPC to its family under controller/: volumes, publish, snapshots, listing,
// expansion, health. RPCs validate before any API call, run one at a time per volume, and wait for
// the manager and agent on watch caches within the caller's deadline.
import type { ServiceImpl } from "@connectrpc/connect";
import type {
  NVMeDevice,
  NVMePartition,
  NVMeSnapshot,
  NVMeVolumeAttachment,
  RDMAStorageNode,
} from "../api/index.ts";
import {
  ControllerServiceCapability_RPC_Type as Cap,
  type Controller,
  GroupControllerServiceCapability_RPC_Type as GroupCap,
  type GroupController,
  type SnapshotMetadata,
} from "../gen/csi/v1/csi_pb.ts";
import type { InFlight } from "../lib/concurrency/in-flight.ts";
import { KeyedMutex } from "../lib/concurrency/keyed-mutex.ts";
import { errorMessage } from "../lib/errors.ts";
import type { WatchCache } from "../lib/kube/cache.ts";
import { expandVolume } from "./controller/expansion.ts";
import {
  createVolumeGroupSnapshot,
  deleteVolumeGroupSnapshot,
  getVolumeGroupSnapshot,
} from "./controller/group-snapshots.ts";
import { getVolume, getVolumeHealth, listVolumeHealth } from "./controller/health.ts";
import { decideRotation, ROTATE_KEYS_ANNOTATION, rotateKeysIfAsked } from "./controller/key-rotation.ts";
import { getCapacity, getSnapshot, listSnapshots, listVolumes } from "./controller/listing.ts";
import { modifyVolume } from "./controller/modify.ts";
import { collectOrphans } from "./controller/orphan-collection.ts";
import { publishVolume, unpublishVolume } from "./controller/publish.ts";
import { getMetadataAllocated, getMetadataDelta } from "./controller/snapshot-metadata.ts";
import { createSnapshot, deleteSnapshot } from "./controller/snapshots.ts";
import { type ControllerOptions, ControllerState } from "./controller/state.ts";
import { createVolume, deleteVolume, validateVolumeCapabilities } from "./controller/volumes.ts";

export { SnapshotAnnotations } from "./controller/snapshots.ts";
export type { ControllerOptions } from "./controller/state.ts";

/**
 * What ControllerGetCapabilities advertises, and nothing else: every entry is backed by a handler
 * below. Snapshots and clones are SPDK lvol snapshots and clones (spdk backend only); ModifyVolume
 * changes QoS limits (spdk backend only). Read-only publication is enforced by the node (read-only
 * mounts, read-only block devices): the target ACL admits a host for reads and writes alike, so a
 * reader host is trusted to the node plugin, and readers never share a volume with a writer.
 */
export const CONTROLLER_CAPABILITIES: readonly Cap[] = [
  Cap.CREATE_DELETE_VOLUME,
  Cap.PUBLISH_UNPUBLISH_VOLUME,
  Cap.PUBLISH_READONLY,
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
  Cap.GET_SNAPSHOT,
  Cap.CLONE_VOLUME,
  Cap.MODIFY_VOLUME,
];

/**
 * What GroupControllerGetCapabilities advertises: group snapshots of volumes on one storage node,
 * taken by the agent in one burst (controller/group-snapshots.ts).
 */
export const GROUP_CONTROLLER_CAPABILITIES: readonly GroupCap[] = [
  GroupCap.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
];

type Impl = Partial<ServiceImpl<typeof Controller>>;

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
  readonly inFlight: InFlight;
  private readonly state: ControllerState;
  private stopped = false;
  private cancelSweep: (() => void) | undefined;
  private sweeping: Promise<unknown> | undefined;
  private readonly rotations = new KeyedMutex();

  constructor(private readonly o: ControllerOptions) {
    this.state = new ControllerState(o);
    this.partitions = this.state.partitions;
    this.attachments = this.state.attachments;
    this.devices = this.state.devices;
    this.storageNodes = this.state.storageNodes;
    this.snapshots = this.state.snapshots;
    this.inFlight = this.state.inFlight;
  }

  /**
   * Starts the caches; resolves once all five have listed. With `orphans` configured, then runs
   * an orphan sweep at once and every `intervalMs` until stop().
   */
  async start(): Promise<void> {
    // A new storage.distort.io/rotate-keys value rotates that volume's keys (once per value; the
    // Secret records the generation done, so a restart or a repeat changes nothing).
    this.partitions.on({
      add: (p) => this.rotateKeys(p),
      update: (old, p) => {
        const was = old.metadata.annotations?.[ROTATE_KEYS_ANNOTATION];
        if (p.metadata.annotations?.[ROTATE_KEYS_ANNOTATION] !== was) this.rotateKeys(p);
      },
    });
    await Promise.all(this.state.caches().map((c) => c.start()));
    if (this.o.orphans && !this.stopped) this.scheduleSweep(0);
  }

  /** Runs one partition's rotation request in the background, one at a time per partition. */
  private rotateKeys(p: NVMePartition): void {
    if (this.stopped || decideRotation(p).action === "none") return;
    const key = `${p.metadata.namespace}/${p.metadata.name}`;
    void this.rotations
      .run(key, () =>
        rotateKeysIfAsked(p, { keys: this.state.keys, events: this.o.events, logger: this.o.logger }),
      )
      .catch((err: unknown) =>
        this.o.logger.warn("DH-HMAC-CHAP key rotation failed; retried at the next sweep", {
          partition: key,
          err: errorMessage(err),
        }),
      );
  }

  /** Stops the orphan sweeps (waiting for one in progress) and the caches. Idempotent. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.cancelSweep?.();
    await this.sweeping;
    await Promise.all(this.state.caches().map((c) => c.stop()));
  }

  private scheduleSweep(ms: number): void {
    const orphans = this.o.orphans;
    if (!orphans || this.stopped) return;
    this.cancelSweep = this.o.clock.setTimeout(() => {
      // Rotations that failed (the Secret write) are tried again: done ones are no-ops.
      for (const p of this.partitions.list()) if (decideRotation(p).action === "rotate") this.rotateKeys(p);
      this.sweeping = this.collectOrphans(orphans.graceMs)
        .catch((err) => this.o.logger.warn("orphan sweep failed", { err: errorMessage(err) }))
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
   * that partition (logged). See controller/orphan-collection.ts.
   */
  collectOrphans(graceMs: number): Promise<string[]> {
    return collectOrphans(this.state, graceMs);
  }

  /** Whether all five caches have listed once. */
  get synced(): boolean {
    return this.state.synced;
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
    const s = this.state;
    return {
      createVolume: (r, ctx) => createVolume(s, r, ctx),
      deleteVolume: (r, ctx) => deleteVolume(s, r, ctx),
      controllerPublishVolume: (r, ctx) => publishVolume(s, r, ctx),
      controllerUnpublishVolume: (r, ctx) => unpublishVolume(s, r, ctx),
      validateVolumeCapabilities: (r) => validateVolumeCapabilities(s, r),
      listVolumes: (r) => listVolumes(s, r),
      getCapacity: (r) => getCapacity(s, r),
      controllerGetCapabilities: () => ({
        capabilities: CONTROLLER_CAPABILITIES.map((type) => ({ type: { case: "rpc", value: { type } } })),
      }),
      controllerGetVolume: (r) => getVolume(s, r),
      controllerGetVolumeHealth: (r) => getVolumeHealth(s, r),
      controllerListVolumeHealth: (r) => listVolumeHealth(s, r),
      controllerExpandVolume: (r, ctx) => expandVolume(s, r, ctx),
      controllerModifyVolume: (r, ctx) => modifyVolume(s, r, ctx),
      createSnapshot: (r, ctx) => createSnapshot(s, r, ctx),
      deleteSnapshot: (r, ctx) => deleteSnapshot(s, r, ctx),
      listSnapshots: (r) => listSnapshots(s, r),
      getSnapshot: (r) => getSnapshot(s, r),
    };
  }

  /** The GroupController service implementation to register with serveGrpc beside service(). */
  groupService(): Partial<ServiceImpl<typeof GroupController>> {
    const s = this.state;
    return {
      groupControllerGetCapabilities: () => ({
        capabilities: GROUP_CONTROLLER_CAPABILITIES.map((type) => ({
          type: { case: "rpc", value: { type } },
        })),
      }),
      createVolumeGroupSnapshot: (r, ctx) => createVolumeGroupSnapshot(s, r, ctx),
      deleteVolumeGroupSnapshot: (r, ctx) => deleteVolumeGroupSnapshot(s, r, ctx),
      getVolumeGroupSnapshot: (r) => getVolumeGroupSnapshot(s, r),
    };
  }

  /**
   * The SnapshotMetadata service (changed-block tracking) to register beside service(); the
   * external-snapshot-metadata sidecar calls it on the same socket.
   */
  snapshotMetadataService(): Partial<ServiceImpl<typeof SnapshotMetadata>> {
    const s = this.state;
    return {
      getMetadataAllocated: (r, ctx) => getMetadataAllocated(s, r, ctx),
      getMetadataDelta: (r, ctx) => getMetadataDelta(s, r, ctx),
    };
  }
}
