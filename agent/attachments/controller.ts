// The node-local attachment reconciler: keeps each exported partition's target ACL equal to its
// NVMeVolumeAttachment (section 3.8/4.4). The authorized host is added only after every other host
// is revoked; AccessReady=True is written only once the ACL is exact; the finalizer stays until the
// host is revoked, so a late unpublish can never leave two writers allowed.
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { kinds } from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import { StorageError } from "../../lib/errors.ts";
import type { WatchCache } from "../../lib/kube/cache.ts";
import { setCondition } from "../../lib/kube/conditions.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import type { ControllerManager } from "../../lib/kube/controller-manager.ts";
import type { EventRecorder } from "../../lib/kube/events.ts";
import { WorkQueue } from "../../lib/kube/queue.ts";
import { objectKey, ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import type { BackendName, TargetBackend } from "../backends/types.ts";
import { inReleaseNamespace, onNode } from "../caches.ts";
import { aclLocks } from "../partitions/acl-lock.ts";
import { desiredHosts } from "../partitions/controller.ts";
import { keyedAclFor, type SecretReader } from "../partitions/host-keys.ts";
import { isPartitionRecord } from "./partition-record.ts";

export const ATTACHMENT_FINALIZER = "storage.distort.io/acl-revoke";

export interface AttachmentControllerOptions {
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
  logger: Logger;
  clock: Clock;
  events?: EventRecorder;
  workers?: number;
  /** Reads DH-HMAC-CHAP secrets referenced by partitions. */
  secrets?: SecretReader;
}

export type AttachmentDecision =
  | { action: "ignore" }
  | { action: "add-finalizer" }
  | { action: "wait"; reason: string; message: string }
  | { action: "grant"; nqn: string; backend: BackendName; hosts: string[] }
  | { action: "revoke"; nqn?: string; backend?: BackendName; hosts: string[] };

/**
 * Pure decision for one attachment, given its partition (if any) and every attachment of that
 * partition. Attachments of partitions on other nodes are not this agent's business.
 */
export function decideAttachment(
  a: NVMeVolumeAttachment,
  partition: NVMePartition | undefined,
  siblings: readonly NVMeVolumeAttachment[],
  nodeName: string,
): AttachmentDecision {
  const mine = partition?.spec.nodeName === nodeName && isPartitionRecord(a, partition);
  const hasFinalizer = (a.metadata.finalizers ?? []).includes(ATTACHMENT_FINALIZER);
  const nqn = partition?.status?.nqn;
  const backend = partition?.spec.backend ?? "spdk";
  if (a.metadata.deletionTimestamp) {
    if (!hasFinalizer) return { action: "ignore" };
    // Another node's agent owns that ACL and its finalizer.
    const owner = partition?.metadata.uid === a.spec.partitionUID ? partition?.spec.nodeName : undefined;
    if (owner && owner !== nodeName) {
      return { action: "ignore" };
    }
    // A partition that is gone (its export went with it) or never exported has no ACL to revoke;
    // an object that is not the partition's record never put a host into it.
    if (!mine || !nqn) return { action: "revoke", hosts: [] };
    return {
      action: "revoke",
      nqn,
      backend,
      hosts: desiredHosts(
        partition,
        siblings.filter((s) => s.metadata.name !== a.metadata.name),
      ),
    };
  }
  // A missing or replaced partition is reported by the CSI controller, not by every agent; an
  // attachment that is not the partition's record (see isPartitionRecord) is never granted.
  if (!mine) return { action: "ignore" };
  if (!hasFinalizer) return { action: "add-finalizer" };
  if (partition.status?.state !== "Exported" || !nqn) {
    return {
      action: "wait",
      reason: "NotExported",
      message: `partition ${a.spec.partitionName} is not exported yet`,
    };
  }
  return { action: "grant", nqn, backend, hosts: desiredHosts(partition, siblings) };
}

export class AttachmentController {
  readonly attachments: WatchCache<NVMeVolumeAttachment>;
  readonly partitions: WatchCache<NVMePartition>;
  private readonly client: ResourceClient<NVMeVolumeAttachment>;
  private readonly partClient: ResourceClient<NVMePartition>;
  private readonly queue: WorkQueue;

  /** Registers with o.manager, which starts and stops it; reconciles begin once every cache synced. */
  constructor(private readonly o: AttachmentControllerOptions) {
    this.client = new ResourceClient(o.conn, kinds.NVMeVolumeAttachment);
    this.partClient = new ResourceClient(o.conn, kinds.NVMePartition);
    this.attachments = o.manager.caches.cache(kinds.NVMeVolumeAttachment, inReleaseNamespace(o.namespace));
    this.partitions = o.manager.caches.cache(kinds.NVMePartition, onNode(o.nodeName, o.namespace));
    this.queue = new WorkQueue({ name: "attachments", clock: o.clock });
    const enqueue = (a: NVMeVolumeAttachment) => this.queue.add(objectKey(a.metadata));
    this.attachments.onChange(enqueue);
    // Export (re)created or target restarted: the ACL must be re-applied for its attachments.
    const byPartition = (p: NVMePartition) => {
      for (const a of this.attachments.list()) if (a.spec.partitionUID === p.metadata.uid) enqueue(a);
    };
    this.partitions.onChange(byPartition);
    o.manager.add({
      name: "attachments",
      queue: this.queue,
      workers: o.workers ?? 2,
      reconcile: (key) => this.reconcile(key),
    });
  }

  /** From the cache of this node's partitions, else from the API server (it may be another node's). */
  private async partitionOf(a: NVMeVolumeAttachment): Promise<NVMePartition | undefined> {
    const cached = this.partitions.get(
      objectKey({ name: a.spec.partitionName, namespace: a.metadata.namespace }),
    );
    return cached ?? (await this.partClient.get(a.spec.partitionName, a.metadata.namespace));
  }

  private async setAccess(
    a: NVMeVolumeAttachment,
    status: "True" | "False",
    reason: string,
    message: string,
  ) {
    const now = new Date(this.o.clock.now());
    await updateStatus(this.client, a.metadata.name, a.metadata.namespace, (latest) => {
      if (latest.metadata.uid !== a.metadata.uid) return undefined;
      // The ACL was set for a's spec; a newer spec (another host, a takeover) is not what it grants.
      if (
        status === "True" &&
        (latest.spec.attachmentId !== a.spec.attachmentId || latest.spec.hostNQN !== a.spec.hostNQN)
      )
        return undefined;
      const s = structuredClone(latest.status ?? { conditions: [] }) as NonNullable<
        NVMeVolumeAttachment["status"]
      >;
      s.conditions = setCondition(
        s.conditions ?? [],
        { type: "AccessReady", status, reason, message, observedGeneration: latest.metadata.generation },
        now,
      );
      // Only an exact ACL for THIS spec may claim this attachment lifetime.
      if (status === "True") s.observedAttachmentId = latest.spec.attachmentId;
      s.observedGeneration = latest.metadata.generation;
      return s;
    });
  }

  private backend(name: BackendName): TargetBackend {
    const b = this.o.backends[name];
    if (!b) throw new StorageError("unimplemented", `this agent serves no ${name} backend`);
    return b;
  }

  /** The decision for `key` from the caches as they are now (the attachment gone: revoke all but its siblings). */
  private decideNow(key: string, p: NVMePartition | undefined): AttachmentDecision {
    const a = this.attachments.get(key);
    if (!a) return { action: "ignore" };
    const siblings = this.attachments.list().filter((x) => x.spec.partitionUID === a.spec.partitionUID);
    return decideAttachment(a, p, siblings, this.o.nodeName);
  }

  async reconcile(key: string): Promise<{ requeueAfterMs?: number } | undefined> {
    const a = this.attachments.get(key);
    if (!a) return;
    const p = await this.partitionOf(a);
    const siblings = this.attachments.list().filter((x) => x.spec.partitionUID === a.spec.partitionUID);
    const d = decideAttachment(a, p, siblings, this.o.nodeName);
    switch (d.action) {
      case "ignore":
        return;
      case "add-finalizer":
        await this.client.replace({
          ...a,
          metadata: { ...a.metadata, finalizers: [...(a.metadata.finalizers ?? []), ATTACHMENT_FINALIZER] },
        });
        return;
      case "wait":
        await this.setAccess(a, "False", d.reason, d.message);
        throw new StorageError("unavailable", d.message);
      case "grant": {
        await aclLocks.run(d.nqn, async () => {
          // Decided again from the caches under the ACL lock: what the pass saw at its start may
          // be older than an ACL another pass applied meanwhile.
          const g = this.decideNow(key, p);
          if (g.action !== "grant" || g.nqn !== d.nqn) {
            throw new StorageError("unavailable", `attachment ${key} changed while its ACL was being set`);
          }
          // A host whose keys the Secret does not hold yet is left out; the read-back below then
          // keeps the attachment waiting until a later pass admits it.
          const acl = await keyedAclFor(p as NVMePartition, g.hosts, this.o.secrets);
          await this.backend(g.backend).setHosts(g.nqn, acl.hosts, acl.keys, acl.psks);
          // Read back: AccessReady means the target really holds exactly this ACL.
          const state = await this.backend(g.backend).inspectExport(g.nqn);
          const have = [...(state?.hosts ?? [])].sort();
          if (!state || have.join(",") !== g.hosts.join(",")) {
            throw new StorageError(
              "unavailable",
              `ACL of ${g.nqn} reads back as [${have.join(", ")}], expected [${g.hosts.join(", ")}]`,
            );
          }
          // A revoked host that still holds a controller could still write: not ready until it is gone.
          const lingering = (state.connectedHosts ?? []).filter((h) => !g.hosts.includes(h));
          if (lingering.length > 0) {
            throw new StorageError(
              "unavailable",
              `revoked host(s) ${lingering.join(", ")} still connected to ${g.nqn}; waiting for their controllers to end`,
            );
          }
          const granted = this.attachments.get(key) ?? a;
          await this.setAccess(
            granted,
            "True",
            "HostAllowed",
            `${granted.spec.hostNQN} may connect to ${g.nqn}`,
          );
        });
        return;
      }
      case "revoke": {
        if (d.nqn && d.backend) {
          const nqn = d.nqn;
          const backend = d.backend;
          try {
            await aclLocks.run(nqn, async () => {
              const r = this.decideNow(key, p);
              const hosts = r.action === "revoke" ? r.hosts : d.hosts;
              const acl = await keyedAclFor(p as NVMePartition, hosts, this.o.secrets);
              await this.backend(backend).setHosts(nqn, acl.hosts, acl.keys, acl.psks);
            });
          } catch (err) {
            // No subsystem means no ACL left to revoke.
            if (!(err instanceof StorageError && err.kind === "not-found")) throw err;
          }
        }
        const latest = await this.client.get(a.metadata.name, a.metadata.namespace);
        if (latest && latest.metadata.uid === a.metadata.uid) {
          await this.client.replace({
            ...latest,
            metadata: {
              ...latest.metadata,
              finalizers: (latest.metadata.finalizers ?? []).filter((f) => f !== ATTACHMENT_FINALIZER),
            },
          });
        }
        this.o.logger.info("attachment access revoked", { attachment: key, nqn: d.nqn });
        await this.o.events?.record(
          a,
          "Normal",
          "AccessRevoked",
          "Revoke",
          `${a.spec.hostNQN} removed from ${d.nqn ?? "(no export)"}`,
        );
        return;
      }
    }
  }
}
