// Test stand-in for the manager and agent: writes through the real API server what they would
// (placement, Exported status, AccessReady, finalizer removal), on command or automatically. Tests
// only; the lead runs the real binaries behind csi-sanity.
import * as v from "valibot";
import { externalIdFor, nqnFor } from "../../../agent/partitions/identity.ts";
import {
  kinds,
  type NVMeDevice,
  type NVMePartition,
  NVMePartitionStatusSchema,
  type NVMeVolumeAttachment,
  type RDMAStorageNode,
} from "../../../api/index.ts";
import { StorageError } from "../../../lib/errors.ts";
import { WatchCache } from "../../../lib/kube/cache.ts";
import { type Condition, setCondition } from "../../../lib/kube/conditions.ts";
import type { KubeConnection } from "../../../lib/kube/connection.ts";
import { objectKey, ResourceClient } from "../../../lib/kube/resource.ts";
import { updateStatus } from "../../../lib/kube/status.ts";
import { silentLogger } from "../../../lib/log.ts";
import { roundUpToUnit as roundUp } from "../../../lib/units.ts";

export const PARTITION_FINALIZER = "storage.distort.io/partition-cleanup";
export const ATTACHMENT_FINALIZER = "storage.distort.io/acl-revoke";

/** What the stand-in does on its own when objects change; tests flip these. */
export interface AutoBehaviour {
  /** Place and export every new partition (manager + agent). */
  exportNew: boolean;
  /** Report the grown size when spec.sizeBytes grows (agent resize). */
  grow: boolean;
  /** Grant every attachment lifetime (agent ACL + AccessReady). */
  grant: boolean;
  /** Drop finalizers of objects being deleted (agent cleanup). */
  release: boolean;
}

type PartitionStatus = NonNullable<NVMePartition["status"]>;

export class StandIn {
  readonly parts: ResourceClient<NVMePartition>;
  readonly atts: ResourceClient<NVMeVolumeAttachment>;
  readonly devs: ResourceClient<NVMeDevice>;
  /** The serial of the stand-in storage node's one drive, where place() puts every partition. */
  readonly serialNumber = "SIM-SERIAL-1";
  readonly auto: AutoBehaviour = { exportNew: false, grow: false, grant: false, release: false };
  private readonly partCache: WatchCache<NVMePartition>;
  private readonly attCache: WatchCache<NVMeVolumeAttachment>;
  private readonly chains = new Map<string, Promise<void>>();

  constructor(
    conn: KubeConnection,
    private readonly ns: string,
    readonly storageNode = "storage-1",
  ) {
    this.parts = new ResourceClient(conn, kinds.NVMePartition);
    this.atts = new ResourceClient(conn, kinds.NVMeVolumeAttachment);
    this.devs = new ResourceClient(conn, kinds.NVMeDevice);
    this.partCache = new WatchCache(this.parts, { namespace: ns, logger: silentLogger });
    this.attCache = new WatchCache(this.atts, { namespace: ns, logger: silentLogger });
    const onPart = (p: NVMePartition) =>
      this.serial(`p/${p.metadata.name}`, () => this.reactPartition(p.metadata.name));
    const onAtt = (a: NVMeVolumeAttachment) =>
      this.serial(`a/${a.metadata.name}`, () => this.reactAttachment(a.metadata.name));
    this.partCache.on({ add: onPart, update: (_o, n) => onPart(n) });
    this.attCache.on({ add: onAtt, update: (_o, n) => onAtt(n) });
  }

  async start(): Promise<void> {
    await Promise.all([this.partCache.start(), this.attCache.start()]);
  }

  async stop(): Promise<void> {
    await Promise.all([this.partCache.stop(), this.attCache.stop()]);
    await Promise.all([...this.chains.values()]);
  }

  private serial(key: string, fn: () => Promise<void>): void {
    const next = (this.chains.get(key) ?? Promise.resolve()).then(fn).catch(() => {});
    this.chains.set(key, next);
  }

  // Reactions read the stand-in's own cache, not the API server: a test that counts the CSI
  // controller's requests must not see the stand-in's reads of the object it just wrote.
  private async reactPartition(name: string): Promise<void> {
    const p = this.partCache.get(objectKey({ name, namespace: this.ns }));
    if (!p) return;
    if (p.metadata.deletionTimestamp) {
      if (this.auto.release) await this.releasePartition(name);
      return;
    }
    if (this.auto.exportNew && !p.status) await this.exportPartition(name);
    else if (
      this.auto.grow &&
      p.status?.state === "Exported" &&
      (p.status.allocatedBytes ?? 0) < roundUp(p.spec.sizeBytes)
    )
      await this.setPartitionStatus(name, (s) => ({ ...s, allocatedBytes: roundUp(p.spec.sizeBytes) }));
  }

  private async reactAttachment(name: string): Promise<void> {
    const a = this.attCache.get(objectKey({ name, namespace: this.ns }));
    if (!a) return;
    if (a.metadata.deletionTimestamp) {
      if (this.auto.release) await this.releaseAttachment(name);
      return;
    }
    if (this.auto.grant && a.status?.observedAttachmentId !== a.spec.attachmentId) await this.grant(name);
  }

  /** The NVMeDevice name of the stand-in's drive. */
  get deviceName(): string {
    return `${this.storageNode}-sim-serial-1`;
  }

  /** The drive as the agent reports it (1 TiB) with the empty ledger the manager starts it with. */
  async ensureDevice(): Promise<NVMeDevice> {
    const have = await this.devs.get(this.deviceName);
    if (have?.status) return have;
    if (!have) {
      try {
        await this.devs.create({
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "NVMeDevice",
          metadata: { name: this.deviceName },
          spec: {
            nodeName: this.storageNode,
            pciAddress: "0000:3b:00.0",
            serial: this.serialNumber,
            model: "sim",
            allocatableBytes: 1024 ** 4,
            numaNode: 0,
          },
        } as NVMeDevice);
      } catch (err) {
        if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
      }
    }
    return (await updateStatus(this.devs, this.deviceName, undefined, (d) =>
      d.status ? undefined : { phase: "Available", reservations: [], conditions: [] },
    )) as NVMeDevice;
  }

  /**
   * The agent's heartbeat: the stand-in storage node's RDMAStorageNode (in the stand-in's
   * namespace) with lastHeartbeatTime `at` (now by default) and Ready as given. Volume health
   * judges a volume by it.
   */
  async heartbeat(o: { at?: Date; ready?: boolean } = {}): Promise<RDMAStorageNode> {
    const nodes = new ResourceClient(this.parts.conn, kinds.RDMAStorageNode);
    if (!(await nodes.get(this.storageNode, this.ns))) {
      try {
        await nodes.create({
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "RDMAStorageNode",
          metadata: { name: this.storageNode, namespace: this.ns },
          spec: { nodeName: this.storageNode },
        } as RDMAStorageNode);
      } catch (err) {
        if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
      }
    }
    const at = (o.at ?? new Date()).toISOString().replace(/\.\d+Z$/, "Z");
    const ok = o.ready ?? true;
    return (await updateStatus(nodes, this.storageNode, this.ns, (n) => ({
      ...(n.status ?? {}),
      lastHeartbeatTime: at,
      conditions: setCondition(
        n.status?.conditions ?? [],
        {
          type: "Ready",
          status: ok ? "True" : "False",
          reason: ok ? "Heartbeat" : "HeartbeatStale",
          message: "written by the test stand-in",
        },
        new Date(),
      ),
    }))) as RDMAStorageNode;
  }

  /** Manager placement: a ledger entry on the drive first, then nodeName + deviceSerial. */
  async place(name: string): Promise<NVMePartition> {
    const p = (await this.parts.get(name, this.ns)) as NVMePartition;
    if (p.spec.nodeName) return p;
    await this.heartbeat();
    // A replicated volume holds no drive: the manager only names the node serving it.
    if ((p.spec.replicas ?? 1) > 1)
      return this.parts.replace({ ...p, spec: { ...p.spec, nodeName: this.storageNode } });
    await this.ensureDevice();
    await updateStatus(this.devs, this.deviceName, undefined, (d) => {
      const ledger = d.status?.reservations ?? [];
      if (ledger.some((r) => r.uid === p.metadata.uid)) return undefined;
      return {
        ...(d.status as NonNullable<NVMeDevice["status"]>),
        reservations: [
          ...ledger,
          { uid: p.metadata.uid as string, namespace: this.ns, name, bytes: roundUp(p.spec.sizeBytes) },
        ],
      };
    });
    return this.parts.replace({
      ...p,
      spec: { ...p.spec, nodeName: this.storageNode, deviceSerial: this.serialNumber },
    });
  }

  /** Placement, the agent's finalizer, and an Exported status with NQN and portal. */
  async exportPartition(name: string, portal = { ip: "192.0.2.10", port: 4420 }): Promise<NVMePartition> {
    const placed = await this.place(name);
    if (!(placed.metadata.finalizers ?? []).includes(PARTITION_FINALIZER)) {
      await this.parts.replace({
        ...placed,
        metadata: {
          ...placed.metadata,
          finalizers: [...(placed.metadata.finalizers ?? []), PARTITION_FINALIZER],
        },
      });
    }
    const uid = placed.metadata.uid as string;
    return (await this.setPartitionStatus(
      name,
      (s, p) => ({
        ...s,
        state: "Exported",
        externalId: externalIdFor(uid),
        nqn: nqnFor(externalIdFor(uid)),
        portalIP: portal.ip,
        portalPort: portal.port,
        transport: p.spec.targetOptions?.transport ?? "rdma",
        allocatedBytes: roundUp(p.spec.sizeBytes),
      }),
      { type: "Ready", status: "True", reason: "Exported", message: "exported by the test stand-in" },
    )) as NVMePartition;
  }

  /** Any status change, with an optional condition set the way the real writers do. */
  async setPartitionStatus(
    name: string,
    change: (s: PartitionStatus, p: NVMePartition) => PartitionStatus,
    cond?: Omit<Condition, "lastTransitionTime">,
  ): Promise<NVMePartition | undefined> {
    return updateStatus(this.parts, name, this.ns, (p) => {
      const base: PartitionStatus = p.status ?? { state: "Pending", conditions: [] };
      const next = change(structuredClone(base), p);
      if (cond)
        next.conditions = setCondition(
          next.conditions ?? [],
          { ...cond, observedGeneration: p.metadata.generation },
          new Date(),
        );
      next.observedGeneration = p.metadata.generation;
      return v.parse(NVMePartitionStatusSchema, next);
    });
  }

  /** Agent: finalizer, then AccessReady=True for the current lifetime. */
  async grant(name: string): Promise<NVMeVolumeAttachment | undefined> {
    const a = await this.atts.get(name, this.ns);
    if (!a) return undefined;
    if (!(a.metadata.finalizers ?? []).includes(ATTACHMENT_FINALIZER)) {
      await this.atts.replace({
        ...a,
        metadata: { ...a.metadata, finalizers: [...(a.metadata.finalizers ?? []), ATTACHMENT_FINALIZER] },
      });
    }
    return updateStatus(this.atts, name, this.ns, (latest) => ({
      observedAttachmentId: latest.spec.attachmentId,
      conditions: setCondition(
        latest.status?.conditions ?? [],
        {
          type: "AccessReady",
          status: "True",
          reason: "HostAllowed",
          message: `${latest.spec.hostNQN} allowed`,
          observedGeneration: latest.metadata.generation,
        },
        new Date(),
      ),
      observedGeneration: latest.metadata.generation,
    }));
  }

  async releasePartition(name: string): Promise<void> {
    await this.dropFinalizer(this.parts, name, PARTITION_FINALIZER);
  }

  async releaseAttachment(name: string): Promise<void> {
    await this.dropFinalizer(this.atts, name, ATTACHMENT_FINALIZER);
  }

  private async dropFinalizer<T extends NVMePartition | NVMeVolumeAttachment>(
    client: ResourceClient<T>,
    name: string,
    finalizer: string,
  ): Promise<void> {
    for (let i = 0; i < 5; i++) {
      const o = await client.get(name, this.ns);
      if (!o || !(o.metadata.finalizers ?? []).includes(finalizer)) return;
      try {
        await client.replace({
          ...o,
          metadata: {
            ...o.metadata,
            finalizers: (o.metadata.finalizers ?? []).filter((f) => f !== finalizer),
          },
        });
        return;
      } catch {
        // conflict: re-read
      }
    }
  }

  key(name: string): string {
    return objectKey({ namespace: this.ns, name });
  }
}
