// The node-local snapshot reconciler's shell: reads the agent's shared caches of NVMeSnapshots and
// of this node's partitions (a source becoming Exported wakes its snapshots), runs decideSnapshot, and carries the decision out
// through the SnapshotLvols port (SpdkLvolVolumeManager in production) and the API server.
import type { NVMePartition, NVMeSnapshot, NVMeSnapshotStatus } from "../../api/index.ts";
import {
  GROUP_SNAPSHOT_LABEL,
  groupMembersOf,
  kinds,
  MAX_ENCODED_CLUSTER_MAP,
  NVMeSnapshotConditionTypes,
} from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import { encodeClusterMap } from "../../lib/cluster-map.ts";
import { StorageError } from "../../lib/errors.ts";
import type { WatchCache } from "../../lib/kube/cache.ts";
import { type ConditionStatus, formatConditionTime, setCondition } from "../../lib/kube/conditions.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import type { ControllerManager } from "../../lib/kube/controller-manager.ts";
import type { EventRecorder } from "../../lib/kube/events.ts";
import { WorkQueue } from "../../lib/kube/queue.ts";
import { objectKey, ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import { formatQuantity } from "../../lib/units.ts";
import type { DeviceRef } from "../backends/types.ts";
import { inReleaseNamespace, onNode } from "../caches.ts";
import { snapshotExternalIdFor } from "../partitions/identity.ts";
import { decideSnapshot, SNAPSHOT_FINALIZER, type SnapshotPlace, type SnapshotWhy } from "./decide.ts";
import { decideGroup } from "./group.ts";

/** The SPDK operations snapshots need; both idempotent (looked up by alias before acting). */
export interface SnapshotLvols {
  /** Snapshot lvol `lvolName` as `snapshotName` unless it exists; its size. Source gone: "not-found". */
  ensureSnapshot(device: DeviceRef, lvolName: string, snapshotName: string): Promise<{ sizeBytes: number }>;
  /**
   * Snapshots every item at one point in the target's order (all snapshot calls issued together,
   * after every lookup); idempotent per item; sizes in input order.
   */
  ensureSnapshots(
    items: readonly { device: DeviceRef; lvolName: string; snapshotName: string }[],
  ): Promise<{ sizeBytes: number }[]>;
  /** Gone already: done. Clones still depend on it: "precondition". */
  deleteSnapshot(device: DeviceRef, snapshotName: string): Promise<void>;
}

/** Changed-block records of snapshot lvols (SpdkBlockMaps in production). */
export interface SnapshotBlockMaps {
  /** Lookups only: what a record would be read from now. Snapshot gone: "not-found". */
  origin(device: DeviceRef, snapshotName: string): Promise<{ fingerprint: string; parentSnapshot?: string }>;
  /** Reads the record (shallow copies); "unavailable" when SPDK changed it meanwhile. */
  read(
    device: DeviceRef,
    snapshotName: string,
  ): Promise<{
    clusterSizeBytes: number;
    numClusters: number;
    clusters: number[];
    fingerprint: string;
    parentSnapshot?: string;
  }>;
}

export interface SnapshotControllerOptions {
  conn: KubeConnection;
  /** Runs this controller; its caches come from the manager's CacheSet (shared with the others). */
  manager: ControllerManager;
  nodeName: string;
  /**
   * The release namespace: the only one whose partitions, attachments and snapshots this agent
   * watches and acts on (a tenant's look-alike objects in its own namespace are never seen).
   */
  namespace: string;
  /** Undefined when this agent serves no spdk backend: its snapshots are refused. */
  lvols: SnapshotLvols | undefined;
  /** Undefined: changed-block tracking is off here; ready snapshots get no blockMetadata. */
  blockMaps?: SnapshotBlockMaps | undefined;
  logger: Logger;
  clock: Clock;
  events?: EventRecorder;
  workers?: number;
  /** Retry period while deletion is blocked by clones. Default 5 s. */
  blockedRetryMs?: number;
}

function deviceOf(place: SnapshotPlace): DeviceRef {
  return { name: "", serial: place.deviceSerial, pciAddress: "" };
}

/**
 * One per agent, registered with its ControllerManager, which starts and stops it. Safe to run on
 * every storage node: each acts only on snapshots whose source lives on its node.
 */
export class SnapshotController {
  readonly snapshots: WatchCache<NVMeSnapshot>;
  readonly partitions: WatchCache<NVMePartition>;
  private readonly client: ResourceClient<NVMeSnapshot>;
  private readonly partClient: ResourceClient<NVMePartition>;
  private readonly queue: WorkQueue;
  /** One group take at a time per group ("namespace/group"), across this agent's workers. */
  private readonly groupLocks = new Map<string, Promise<unknown>>();

  constructor(private readonly o: SnapshotControllerOptions) {
    this.client = new ResourceClient(o.conn, kinds.NVMeSnapshot);
    this.partClient = new ResourceClient(o.conn, kinds.NVMePartition);
    this.snapshots = o.manager.caches.cache(kinds.NVMeSnapshot, inReleaseNamespace(o.namespace));
    this.partitions = o.manager.caches.cache(kinds.NVMePartition, onNode(o.nodeName, o.namespace));
    this.queue = new WorkQueue({ name: "snapshots", clock: o.clock });
    const enqueue = (s: NVMeSnapshot) => this.queue.add(objectKey(s.metadata));
    // A member's change (its finalizer, its deletion) can unblock the rest of its group.
    this.snapshots.onChange((s) => {
      enqueue(s);
      for (const name of groupMembersOf(s))
        if (name !== s.metadata.name) this.queue.add(objectKey({ name, namespace: s.metadata.namespace }));
    });
    const bySource = (p: NVMePartition) => {
      for (const s of this.snapshots.list()) if (s.spec.sourcePartitionUID === p.metadata.uid) enqueue(s);
    };
    this.partitions.onChange(bySource);
    o.manager.add({
      name: "snapshots",
      queue: this.queue,
      workers: o.workers ?? 2,
      reconcile: (key) => this.reconcile(key),
    });
  }

  private async sourceOf(s: NVMeSnapshot): Promise<NVMePartition | undefined> {
    const key = objectKey({ name: s.spec.sourcePartitionName, namespace: s.metadata.namespace });
    return (
      this.partitions.get(key) ??
      (await this.partClient.get(s.spec.sourcePartitionName, s.metadata.namespace))
    );
  }

  private async writeStatus(
    s: NVMeSnapshot,
    change: (st: NVMeSnapshotStatus) => void,
    cond?: { type: string; status: ConditionStatus; why: SnapshotWhy },
  ) {
    const now = new Date(this.o.clock.now());
    await updateStatus(this.client, s.metadata.name, s.metadata.namespace, (latest) => {
      if (latest.metadata.uid !== s.metadata.uid) return undefined;
      const st = structuredClone(latest.status ?? { conditions: [] }) as NVMeSnapshotStatus;
      change(st);
      if (cond) {
        st.conditions = setCondition(
          st.conditions ?? [],
          {
            type: cond.type,
            status: cond.status,
            reason: cond.why.reason,
            message: cond.why.message,
            observedGeneration: latest.metadata.generation,
          },
          now,
        );
      }
      st.observedGeneration = latest.metadata.generation;
      return st;
    });
  }

  private async setFinalizer(s: NVMeSnapshot, present: boolean) {
    const latest = await this.client.get(s.metadata.name, s.metadata.namespace);
    if (!latest || latest.metadata.uid !== s.metadata.uid) return;
    const rest = (latest.metadata.finalizers ?? []).filter((f) => f !== SNAPSHOT_FINALIZER);
    await this.client.replace({
      ...latest,
      metadata: { ...latest.metadata, finalizers: present ? [...rest, SNAPSHOT_FINALIZER] : rest },
    });
  }

  /** One pass for snapshot `key` ("namespace/name"); throws to be retried with backoff. */
  async reconcile(key: string): Promise<{ requeueAfterMs?: number } | undefined> {
    const s = this.snapshots.get(key);
    if (!s) return;
    const d = decideSnapshot(s, await this.sourceOf(s), this.o.nodeName);
    switch (d.action) {
      case "ignore":
        if (d.why === "ready") return this.maintainBlockMetadata(s);
        return;
      case "done":
        return;
      case "add-finalizer":
        await this.setFinalizer(s, true);
        return;
      case "wait":
        await this.writeStatus(
          s,
          (st) => {
            st.readyToUse = false;
          },
          {
            type: "Ready",
            status: "False",
            why: d.why,
          },
        );
        throw new StorageError("unavailable", d.why.message);
      case "refuse":
        await this.writeStatus(
          s,
          (st) => {
            st.readyToUse = false;
          },
          {
            type: "Ready",
            status: "False",
            why: d.why,
          },
        );
        return;
      case "take": {
        if (s.metadata.labels?.[GROUP_SNAPSHOT_LABEL] && groupMembersOf(s).length > 0)
          return this.reconcileGroup(s);
        const lvols = this.o.lvols;
        if (!lvols) {
          await this.writeStatus(
            s,
            (st) => {
              st.readyToUse = false;
            },
            {
              type: "Ready",
              status: "False",
              why: {
                reason: "UnsupportedBackend",
                message: `node ${this.o.nodeName} serves no spdk backend`,
              },
            },
          );
          return;
        }
        // Record where before acting: deletion must find the lvol even if the source goes first.
        await this.writeStatus(s, (st) => {
          st.nodeName = d.place.nodeName;
          st.deviceSerial = d.place.deviceSerial;
          st.externalId = d.place.externalId;
        });
        const { sizeBytes } = await lvols.ensureSnapshot(deviceOf(d.place), d.sourceLvol, d.place.externalId);
        const now = formatConditionTime(new Date(this.o.clock.now()));
        await this.writeStatus(
          s,
          (st) => {
            st.readyToUse = true;
            st.sizeBytes = sizeBytes;
            st.size = formatQuantity(sizeBytes);
            st.creationTime ??= now;
          },
          {
            type: "Ready",
            status: "True",
            why: { reason: "SnapshotTaken", message: `lvol ${d.place.externalId}` },
          },
        );
        this.o.logger.info("snapshot ready", { snapshot: key, lvol: d.place.externalId, bytes: sizeBytes });
        return;
      }
      case "delete": {
        if (d.place) {
          if (!this.o.lvols) throw new StorageError("unimplemented", "this agent serves no spdk backend");
          try {
            await this.o.lvols.deleteSnapshot(deviceOf(d.place), d.place.externalId);
          } catch (err) {
            if (!(err instanceof StorageError && err.kind === "precondition")) throw err;
            await this.writeStatus(s, () => {}, {
              type: "DeletionBlocked",
              status: "True",
              why: {
                reason: "ClonesExist",
                message: `SPDK refuses to delete ${d.place.externalId}: ${err.message}`,
              },
            });
            return { requeueAfterMs: this.o.blockedRetryMs ?? 5_000 };
          }
        }
        // SPDK merged the snapshot into its only clone: a snapshot recorded after it reads again.
        if (d.place) {
          const gone = d.place.externalId;
          for (const o of this.snapshots.list())
            if (
              o.status?.blockMetadata?.parentSnapshot === gone &&
              o.status.deviceSerial === d.place.deviceSerial
            )
              this.queue.add(objectKey(o.metadata));
        }
        await this.setFinalizer(s, false);
        this.o.logger.info("snapshot deleted", { snapshot: key, lvol: d.place?.externalId });
        return;
      }
    }
  }

  /**
   * Keeps a ready snapshot's changed-block record equal to what SPDK holds: read once after the
   * snapshot is taken, and again whenever its origin changes (a deleted parent merged into it).
   * A failed read leaves BlockMetadata False with the reason and is retried; the snapshot stays
   * ready (clones do not need the record).
   */
  private async maintainBlockMetadata(s: NVMeSnapshot): Promise<undefined> {
    const maps = this.o.blockMaps;
    const uid = s.metadata.uid;
    const serial = s.status?.deviceSerial;
    if (!maps || !uid || !serial || s.status?.nodeName !== this.o.nodeName) return undefined;
    const name = snapshotExternalIdFor(uid);
    const device: DeviceRef = { name: "", serial, pciAddress: "" };
    const rec = s.status?.blockMetadata;
    const cond = s.status?.conditions?.find((c) => c.type === NVMeSnapshotConditionTypes.BlockMetadata);
    let origin: Awaited<ReturnType<SnapshotBlockMaps["origin"]>>;
    try {
      origin = await maps.origin(device, name);
    } catch (err) {
      // A ready snapshot whose lvol is gone is not this loop's to repair.
      if (err instanceof StorageError && err.kind === "not-found") return undefined;
      throw err;
    }
    if (
      rec &&
      cond?.status === "True" &&
      rec.fingerprint === origin.fingerprint &&
      rec.parentSnapshot === origin.parentSnapshot
    )
      return undefined;
    const type = NVMeSnapshotConditionTypes.BlockMetadata;
    let reading: Awaited<ReturnType<SnapshotBlockMaps["read"]>>;
    try {
      reading = await maps.read(device, name);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      // A stale record is worse than none: drop it so nothing answers from it.
      await this.writeStatus(
        s,
        (st) => {
          delete st.blockMetadata;
        },
        { type, status: "False", why: { reason: "ReadFailed", message } },
      );
      throw err;
    }
    const encoded = encodeClusterMap(reading.clusters, reading.numClusters);
    if (encoded.length > MAX_ENCODED_CLUSTER_MAP) {
      await this.writeStatus(
        s,
        (st) => {
          delete st.blockMetadata;
        },
        {
          type,
          status: "False",
          why: {
            reason: "TooLarge",
            message: `the record of ${reading.clusters.length} clusters encodes to ${encoded.length} bytes, more than ${MAX_ENCODED_CLUSTER_MAP}`,
          },
        },
      );
      return undefined;
    }
    const now = formatConditionTime(new Date(this.o.clock.now()));
    await this.writeStatus(
      s,
      (st) => {
        st.blockMetadata = {
          clusterSizeBytes: reading.clusterSizeBytes,
          numClusters: reading.numClusters,
          clusters: encoded,
          fingerprint: reading.fingerprint,
          recordedAt: now,
          ...(reading.parentSnapshot === undefined ? {} : { parentSnapshot: reading.parentSnapshot }),
        };
      },
      {
        type,
        status: "True",
        why: {
          reason: "Recorded",
          message: `${reading.clusters.length} of ${reading.numClusters} clusters held by this snapshot${reading.parentSnapshot ? ` since ${reading.parentSnapshot}` : ""}`,
        },
      },
    );
    this.o.logger.info("snapshot block record read", {
      snapshot: objectKey(s.metadata),
      clusters: reading.clusters.length,
      parent: reading.parentSnapshot,
    });
    return undefined;
  }

  /**
   * Takes the group `s` belongs to, one group at a time. Members are re-read from the API server
   * (the cache may not show a take that just finished). Every member's place is recorded, then all
   * bdev_lvol_snapshot calls go out together on the persistent connection, and only then is any
   * member marked ready: a crash in between leaves no member ready, and the next pass deletes
   * what the interrupted burst made and takes the whole group again.
   */
  private async reconcileGroup(s: NVMeSnapshot): Promise<undefined> {
    const group = `${s.metadata.namespace}/${s.metadata.labels?.[GROUP_SNAPSHOT_LABEL]}`;
    const prev = this.groupLocks.get(group) ?? Promise.resolve();
    const run = prev.catch(() => {}).then(() => this.takeGroup(s, group));
    this.groupLocks.set(group, run);
    try {
      await run;
    } finally {
      if (this.groupLocks.get(group) === run) this.groupLocks.delete(group);
    }
    return undefined;
  }

  private async takeGroup(s: NVMeSnapshot, group: string): Promise<void> {
    const names = groupMembersOf(s);
    const members = new Map<string, NVMeSnapshot>();
    const sources = new Map<string, NVMePartition | undefined>();
    for (const name of names) {
      const m = await this.client.get(name, s.metadata.namespace);
      if (!m) continue;
      members.set(name, m);
      sources.set(name, await this.sourceOf(m));
    }
    const d = decideGroup(names, members, (m) => sources.get(m.metadata.name), this.o.nodeName);
    const notReady = (st: NVMeSnapshotStatus) => {
      st.readyToUse = false;
    };
    switch (d.action) {
      case "ignore":
        return;
      case "wait":
        await this.writeStatus(s, notReady, { type: "Ready", status: "False", why: d.why });
        throw new StorageError("unavailable", d.why.message);
      case "refuse":
        for (const m of members.values())
          if ((m.status?.nodeName ?? sources.get(m.metadata.name)?.spec.nodeName) === this.o.nodeName)
            await this.writeStatus(m, notReady, { type: "Ready", status: "False", why: d.why });
        return;
      case "take": {
        const lvols = this.o.lvols;
        if (!lvols) {
          const why = {
            reason: "UnsupportedBackend",
            message: `node ${this.o.nodeName} serves no spdk backend`,
          };
          for (const t of d.members)
            await this.writeStatus(t.snapshot, notReady, { type: "Ready", status: "False", why });
          return;
        }
        for (const t of d.members)
          await this.writeStatus(t.snapshot, (st) => {
            st.nodeName = t.place.nodeName;
            st.deviceSerial = t.place.deviceSerial;
            st.externalId = t.place.externalId;
          });
        if (d.fresh)
          await Promise.all(
            d.members.map((t) => lvols.deleteSnapshot(deviceOf(t.place), t.place.externalId)),
          );
        // One burst: every lookup, then every snapshot call, in flight together.
        const sizes = await lvols.ensureSnapshots(
          d.members.map((t) => ({
            device: deviceOf(t.place),
            lvolName: t.sourceLvol,
            snapshotName: t.place.externalId,
          })),
        );
        const now = formatConditionTime(new Date(this.o.clock.now()));
        for (const [i, t] of d.members.entries())
          await this.writeStatus(
            t.snapshot,
            (st) => {
              st.readyToUse = true;
              st.sizeBytes = sizes[i]?.sizeBytes ?? 0;
              st.creationTime ??= now;
            },
            {
              type: "Ready",
              status: "True",
              why: { reason: "SnapshotTaken", message: `lvol ${t.place.externalId} (group ${group})` },
            },
          );
        this.o.logger.info("group snapshot ready", { group, members: d.members.length });
        return;
      }
    }
  }
}
