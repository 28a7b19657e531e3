// What every Controller RPC family shares: the watch caches, API clients and waiters of one
// controller process, its in-flight set, and the lookups and waits the handlers build on them.
import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  kinds,
  type NVMeDevice,
  type NVMePartition,
  type NVMeSnapshot,
  type NVMeVolumeAttachment,
  type RDMAStorageNode,
} from "../../api/index.ts";
import type { VolumeSchema } from "../../gen/csi/v1/csi_pb.ts";
import type { Clock } from "../../lib/clock.ts";
import { InFlight } from "../../lib/concurrency/in-flight.ts";
import { StorageError } from "../../lib/errors.ts";
import type { WatchCache } from "../../lib/kube/cache.ts";
import { CacheSet } from "../../lib/kube/cache-set.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import type { EventRecorder } from "../../lib/kube/events.ts";
import { kubeNodeDirectory, type NodeDirectory } from "../../lib/kube/node-directory.ts";
import { type KubeObject, objectKey, ResourceClient } from "../../lib/kube/resource.ts";
import { kubeVolumeKeyStore, type VolumeKeyStore } from "../../lib/kube/volume-keys.ts";
import type { Logger } from "../../lib/log.ts";
import { PROVISIONED_BY, PROVISIONED_BY_LABEL, readRecord } from "./fingerprint.ts";
import { accessibleTopology } from "./topology.ts";
import { formatVolumeId, parseVolumeId, type VolumeRef } from "./volume-id.ts";
import { capacityOf, volumeContextOf } from "./volume-view.ts";
import { CacheWaiter, type CallContext, withBudget } from "./waiter.ts";

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
  /** Per-volume DH-HMAC-CHAP key Secrets; the API server's by default. */
  keys?: VolumeKeyStore;
  /**
   * Periodic collection of partitions whose claim vanished before a PV existed (see
   * collectOrphans). Absent: no background collection (tests that own their partitions).
   */
  orphans?: { graceMs: number; intervalMs: number };
  /**
   * Age of a storage node's last heartbeat past which volume health reports its volumes
   * INACCESSIBLE (its agent is gone); DEFAULT_HEARTBEAT_STALENESS_MS (the manager's default) when
   * omitted.
   */
  heartbeatStalenessMs?: number;
}

export type VolumeInit = MessageInitShape<typeof VolumeSchema>;

/**
 * The state of one controller service. Construction registers no watch: start() of each cache
 * (owned by CsiController) does. Handlers read the caches only after requireSynced(), and read the
 * API server itself wherever a stale cache could turn into a wrong answer.
 */
export class ControllerState {
  readonly partitions: WatchCache<NVMePartition>;
  readonly attachments: WatchCache<NVMeVolumeAttachment>;
  readonly devices: WatchCache<NVMeDevice>;
  readonly storageNodes: WatchCache<RDMAStorageNode>;
  readonly snapshots: WatchCache<NVMeSnapshot>;
  readonly inFlight = new InFlight();
  readonly partClient: ResourceClient<NVMePartition>;
  readonly attClient: ResourceClient<NVMeVolumeAttachment>;
  readonly snapClient: ResourceClient<NVMeSnapshot>;
  readonly partitionWaiter: CacheWaiter<NVMePartition>;
  readonly attachmentWaiter: CacheWaiter<NVMeVolumeAttachment>;
  readonly snapshotWaiter: CacheWaiter<NVMeSnapshot>;
  readonly nodes: NodeDirectory;
  readonly newAttachmentId: () => string;
  readonly keys: VolumeKeyStore;
  readonly ns: string;
  readonly log: Logger;

  constructor(readonly o: ControllerOptions) {
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
    this.keys = o.keys ?? kubeVolumeKeyStore(o.conn, { [PROVISIONED_BY_LABEL]: PROVISIONED_BY });
  }

  /** The five caches, in the order start() and stop() walk them. */
  caches() {
    return [this.partitions, this.attachments, this.devices, this.storageNodes, this.snapshots] as const;
  }

  get synced(): boolean {
    return this.caches().every((c) => c.hasSynced);
  }

  /** Throws UNAVAILABLE until every cache has listed once. */
  requireSynced(): void {
    if (!this.synced)
      throw new StorageError(
        "unavailable",
        "the CSI controller is still syncing its caches with the API server",
      );
  }

  /** The cache and in-flight key of an object in the driver namespace. */
  key(name: string): string {
    return objectKey({ namespace: this.ns, name });
  }

  /** The volume an id designates, or undefined when the id is not one of this driver's. */
  ref(volumeId: string): VolumeRef | undefined {
    const ref = parseVolumeId(volumeId);
    // Only the configured namespace is watched (and authorized); ids elsewhere are not ours.
    return ref && ref.namespace === this.ns ? ref : undefined;
  }

  /**
   * The partition of exactly this incarnation, read from the API server; undefined when gone, and
   * for a copy of a replicated volume (the manager's, never a CSI volume of its own).
   */
  async partitionOf(ref: VolumeRef): Promise<NVMePartition | undefined> {
    const p = await this.partClient.get(ref.name, ref.namespace);
    return p && p.metadata.uid === ref.uid && !p.spec.replicaOf ? p : undefined;
  }

  /** The snapshot of exactly this incarnation, read from the API server; undefined when gone. */
  async snapshotOf(ref: VolumeRef): Promise<NVMeSnapshot | undefined> {
    const s = await this.snapClient.get(ref.name, ref.namespace);
    return s && s.metadata.uid === ref.uid ? s : undefined;
  }

  /** Runs `wait` within the call's budget; DEADLINE_EXCEEDED with `onTimeout()` when it runs out. */
  budget<R>(ctx: CallContext, wait: (signal: AbortSignal) => Promise<R>, onTimeout: () => string) {
    return withBudget(ctx, this.o.clock, this.o.defaultTimeoutMs, wait, onTimeout);
  }

  /**
   * Waits until the object `uid` under `name` is gone, judged from the cache and confirmed by the
   * API server: the cache may not even have seen it yet, and "absent from the cache" must never
   * become an early OK. A replacement with another UID counts as gone. `seen` gets every copy of
   * the object observed meanwhile and may throw to end the wait.
   */
  async waitGone<T extends KubeObject>(
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

  /** The CSI Volume of a partition: id, capacity, context and the topology it is reachable from. */
  volumeOf(p: NVMePartition): VolumeInit {
    const record = readRecord(p.metadata.annotations);
    return {
      volumeId: formatVolumeId({ namespace: this.ns, name: p.metadata.name, uid: p.metadata.uid as string }),
      capacityBytes: BigInt(capacityOf(p)),
      volumeContext: volumeContextOf(p, record) ?? {},
      accessibleTopology: accessibleTopology(
        p.spec.topology,
        storageNodeLabels(this.storageNodes.list(), p.spec.nodeName),
      ),
    };
  }

  /**
   * Cached partitions a volume id can name. A partition made by hand with a name longer than ids
   * allow is skipped rather than failing the whole listing.
   */
  addressable(): NVMePartition[] {
    return this.partitions.list().filter((p) => {
      // A copy of a replicated volume is the manager's, not a volume of its own.
      if (p.spec.replicaOf) return false;
      const uid = p.metadata.uid;
      return uid !== undefined && parseVolumeId(`${this.ns}/${p.metadata.name}/${uid}`) !== undefined;
    });
  }

  /** Node ids of live attachments per partition UID. */
  publishedNodes(): Map<string, string[]> {
    return publishedNodes(this.attachments.list());
  }
}

/**
 * The labels of the storage node serving `nodeName` (the freshest heartbeat wins when several
 * RDMAStorageNodes claim it); none for an unplaced partition or an unknown node.
 */
export function storageNodeLabels(
  nodes: readonly RDMAStorageNode[],
  nodeName: string | undefined,
): Record<string, string> {
  if (!nodeName) return {};
  let best: RDMAStorageNode | undefined;
  for (const n of nodes) {
    if (n.spec.nodeName !== nodeName) continue;
    if (!best || (n.status?.lastHeartbeatTime ?? "") > (best.status?.lastHeartbeatTime ?? "")) best = n;
  }
  return best?.metadata.labels ?? {};
}

/** Node ids per partition UID, from attachments not being deleted. */
export function publishedNodes(attachments: readonly NVMeVolumeAttachment[]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const a of attachments) {
    if (a.metadata.deletionTimestamp) continue;
    const list = out.get(a.spec.partitionUID) ?? [];
    list.push(a.spec.nodeId);
    out.set(a.spec.partitionUID, list);
  }
  return out;
}
