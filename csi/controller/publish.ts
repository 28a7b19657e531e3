// ControllerPublishVolume and ControllerUnpublishVolume: a publication is the partition's one
// NVMeVolumeAttachment (or, for MULTI_NODE_READER_ONLY and MULTI_NODE_MULTI_WRITER, one per node),
// moved between nodes only by the fencing rules in fencing.ts, and done only once the agent reports
// the target ACL in force (or revoked) for exactly that lifetime.
import type { HandlerContext } from "@connectrpc/connect";
import { API_VERSION, type NVMePartition, type NVMeVolumeAttachment } from "../../api/index.ts";
import type {
  ControllerPublishVolumeRequest,
  ControllerUnpublishVolumeRequest,
} from "../../gen/csi/v1/csi_pb.ts";
import { parseNodeId } from "../../lib/csi-node-id.ts";
import { StorageError } from "../../lib/errors.ts";
import { DRIVER_NAME, formatPortals, PublishContextKeys } from "../../lib/volume-context.ts";
import { aborted, alreadyExists, failedPrecondition, invalidArgument, notFound } from "../errors.ts";
import {
  type AccessModeName,
  capabilityKey,
  isMultiNodeMode,
  MAX_SHARED_WRITERS,
  type NormalizedCapability,
  requireSupported,
} from "./capabilities.ts";
import {
  ACCESS_ANNOTATION,
  accessPending,
  accessReady,
  decideExclusion,
  decidePublish,
  decideSharing,
  decideUnpublish,
  type ExclusionDecision,
  FENCED_ANNOTATION,
  PREVIOUS_NODE_ANNOTATION,
  type PublishIntent,
  READER_OF_LABEL,
  READONLY_ANNOTATION,
} from "./fencing.ts";
import { PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./fingerprint.ts";
import type { ControllerState } from "./state.ts";
import { attachmentNameFor, readerAttachmentNameFor, type VolumeRef } from "./volume-id.ts";
import { replicatedPortalsOf } from "./volume-view.ts";

/**
 * ControllerPublishVolume: authorizes the node's host NQN on the volume and answers once the
 * agent enforces it, with the host NQN and attachment id as publish context. Idempotent per
 * (volume, node, capability, readonly); FAILED_PRECONDITION while another unfenced node holds the
 * volume, ALREADY_EXISTS for the same node with an incompatible capability, NOT_FOUND for a gone
 * volume or node. MULTI_NODE_READER_ONLY and MULTI_NODE_MULTI_WRITER (raw block only, at most
 * MAX_SHARED_WRITERS nodes: a live migration's source and destination) publications each get
 * their own attachment, so several hosts share the ACL; they and any other publication, and the
 * two multi-node modes, exclude each other (FAILED_PRECONDITION). Once all but one have
 * unpublished, the volume is single-writer again for every other mode. Holders an administrator
 * annotated fenced are revoked before a publication that needs them gone. The check and the
 * create run under the volume's in-flight hold, so two publishes of one volume in this
 * controller cannot both pass it.
 */
export async function publishVolume(
  c: ControllerState,
  req: ControllerPublishVolumeRequest,
  ctx: HandlerContext,
) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  if (!req.nodeId) throw invalidArgument("node_id is required");
  if (!req.volumeCapability) throw invalidArgument("volume_capability is required");
  const [cap] = requireSupported([req.volumeCapability], "volume_capability") as [NormalizedCapability];
  const ref = c.ref(req.volumeId);
  if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(key, `ControllerPublishVolume ${req.nodeId}`, async () => {
    const p = await c.partitionOf(ref);
    if (!p || p.metadata.deletionTimestamp) throw notFound(`volume ${req.volumeId} does not exist`);
    const id = parseNodeId(req.nodeId);
    const node = await c.nodes.get(id.nodeName);
    if (!node) throw notFound(`node ${id.nodeName} does not exist`);
    // The node ID carries the host NQN, and must be the one kubelet keeps in the node's CSINode
    // (written only by that node's kubelet). A bare node name (an ID csi-attacher stored from an
    // earlier release) takes the NQN from CSINode. Nothing else names it: a Node annotation is
    // never read, since anything allowed to patch Nodes could write one.
    const registered = node.registeredNodeId ? parseNodeId(node.registeredNodeId).hostNQN : undefined;
    if (id.hostNQN && registered && id.hostNQN !== registered) {
      throw failedPrecondition(
        `node ID ${req.nodeId} is not the one node ${id.nodeName} registered (${node.registeredNodeId}); the CO must publish with the node ID in its CSINode`,
      );
    }
    const hostNQN = id.hostNQN ?? registered;
    if (!hostNQN) {
      throw failedPrecondition(
        `node ${id.nodeName} has not registered its NVMe host NQN: its CSI node ID carries none and its CSINode has no ${DRIVER_NAME} entry; the DISTORT node plugin registers it through kubelet (from /etc/nvme/hostnqn) when it starts there`,
      );
    }
    // One initiator identity on two machines: the target could not tell their I/O apart, and
    // admitting it would admit both.
    const claimants = await c.nodes.claiming(hostNQN);
    const others = claimants.filter((n) => n !== id.nodeName);
    if (others.length > 0) {
      const message = `nodes ${[id.nodeName, ...others].sort().join(", ")} all present host NQN ${hostNQN}; publishing volume ${key} to ${id.nodeName} is refused until each node has its own /etc/nvme/hostnqn`;
      c.log.warn("duplicate host NQN refused at publish", {
        partition: key,
        node: id.nodeName,
        nqn: hostNQN,
        others,
      });
      void c.o.events?.record(p, "Warning", "DuplicateHostNQN", "Publish", message);
      throw failedPrecondition(message);
    }
    const intent: PublishIntent = {
      nodeId: req.nodeId,
      hostNQN,
      access: capabilityKey(cap),
      readonly: req.readonly,
    };
    // The host's DH-HMAC-CHAP keys (and TLS PSK) exist before the attachment admits it: the agent installs
    // them with the ACL, kubelet hands them to the node at NodeStage. Nothing secret is returned.
    const dhchap = p.spec.targetOptions?.dhchap;
    // nvmet keeps one key per host for all its subsystems: there the pair is the host's own,
    // the same in every volume's Secret.
    if (dhchap) {
      await c.keys.ensureHost(p, dhchap.secretName, hostNQN, dhchap.mode, dhchap.hash, {
        perHost: p.spec.backend === "kernel",
      });
    }
    // A TLS volume's PSK for this host, in the same Secret, before the attachment admits it.
    const tls = p.spec.targetOptions?.tls;
    if (tls) await c.keys.ensurePsk(p, tls.secretName, hostNQN);
    const keySecret = dhchap?.secretName ?? tls?.secretName;
    const multi = isMultiNodeMode(cap.mode) ? cap.mode : undefined;
    let last: NVMeVolumeAttachment | undefined;
    const a = await c.budget(
      ctx,
      (signal) =>
        authorize(c, p, ref, intent, multi, signal, (o) => {
          last = o;
        }),
      () => `node ${req.nodeId} is not authorized on volume ${key} yet: ${accessPending(last)}`,
    );
    // A host this volume was taken from (fenced by now: the attachment is AccessReady for the
    // new one) keeps no pair behind.
    if (keySecret) {
      const published = [...(await primaryOf(c, ref)), ...(await readersOf(c, ref))].map(
        (x) => x.spec.hostNQN,
      );
      await c.keys.retainHosts(c.ns, keySecret, [...new Set([...published, hostNQN])]);
    }
    // A replicated volume: a path to every node that serves it or may after a failover.
    const now = (await c.partitionOf(ref)) ?? p;
    const portals = replicatedPortalsOf(
      now,
      c.partitions.list().filter((x) => x.spec.replicaOf?.uid === ref.uid),
    );
    return {
      publishContext: {
        [PublishContextKeys.hostNQN]: a.spec.hostNQN,
        [PublishContextKeys.attachmentId]: a.spec.attachmentId,
        ...(portals.length > 1 ? { [PublishContextKeys.portals]: formatPortals(portals) } : {}),
      },
    };
  });
}

/**
 * Brings the partition's attachment to `intent` (section 3.8) and waits for AccessReady. `multi`:
 * the multi-node mode of the publication (its own per-node attachment), else undefined.
 */
async function authorize(
  c: ControllerState,
  p: NVMePartition,
  ref: VolumeRef,
  intent: PublishIntent,
  multi: AccessModeName | undefined,
  signal: AbortSignal,
  seen: (a: NVMeVolumeAttachment) => void,
): Promise<NVMeVolumeAttachment> {
  const primary = attachmentNameFor(ref.name, ref.uid);
  const reader = multi !== undefined;
  const name = reader ? readerAttachmentNameFor(ref.name, ref.uid, intent.nodeId) : primary;
  const annotations = {
    [READONLY_ANNOTATION]: String(intent.readonly),
    [ACCESS_ANNOTATION]: intent.access,
  };
  const labels = {
    [PROVISIONED_BY_LABEL]: PROVISIONED_BY,
    ...(reader ? { [READER_OF_LABEL]: ref.uid } : {}),
  };
  for (;;) {
    let held = reader ? await primaryOf(c, ref) : await readersOf(c, ref);
    let ex: ExclusionDecision = decideExclusion(reader, held);
    if (ex.action === "proceed" && multi) {
      held = await readersOf(c, ref);
      ex = decideSharing(multi, intent.nodeId, held, MAX_SHARED_WRITERS);
    }
    if (ex.action === "refuse") throw failedPrecondition(ex.message);
    if (ex.action === "revoke") {
      for (const o of held.filter((x) => (ex as { names: string[] }).names.includes(x.metadata.name))) {
        try {
          await c.attClient.delete(o.metadata.name, c.ns, { uid: o.metadata.uid });
        } catch (err) {
          if (!(err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")))
            throw err;
        }
        c.log.warn("fenced publication revoked", { partition: c.key(ref.name), node: o.spec.nodeId });
        void c.o.events?.record(
          p,
          "Warning",
          "FencedRevoked",
          "Publish",
          `publication for fenced node ${o.spec.nodeId} revoked before publishing to ${intent.nodeId}`,
        );
        await c.waitGone(
          c.attachmentWaiter,
          c.attClient,
          o.metadata.name,
          o.metadata.uid as string,
          signal,
          seen,
        );
      }
      continue;
    }
    if (ex.action === "wait-gone") {
      const names = ex.names;
      for (const o of held.filter((x) => names.includes(x.metadata.name)))
        await c.waitGone(
          c.attachmentWaiter,
          c.attClient,
          o.metadata.name,
          o.metadata.uid as string,
          signal,
          seen,
        );
      continue;
    }
    const cur = await c.attClient.get(name, c.ns);
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
          created = await c.attClient.create({
            apiVersion: API_VERSION,
            kind: "NVMeVolumeAttachment",
            metadata: {
              name,
              namespace: c.ns,
              labels,
              annotations,
            },
            spec: {
              partitionName: ref.name,
              partitionUID: ref.uid,
              nodeId: intent.nodeId,
              hostNQN: intent.hostNQN,
              attachmentId: c.newAttachmentId(),
            },
          });
        } catch (err) {
          if (err instanceof StorageError && err.kind === "already-exists") continue;
          throw err;
        }
        c.log.info("volume publication requested", {
          partition: c.key(ref.name),
          node: intent.nodeId,
        });
        return awaitReady(c, created, signal, seen);
      }
      case "wait-gone":
        await c.waitGone(
          c.attachmentWaiter,
          c.attClient,
          name,
          (cur as NVMeVolumeAttachment).metadata.uid as string,
          signal,
          seen,
        );
        continue;
      case "await-ready":
        return awaitReady(c, cur as NVMeVolumeAttachment, signal, seen);
      case "renew":
      case "takeover": {
        const held = cur as NVMeVolumeAttachment;
        const ann: Record<string, string> = { ...(held.metadata.annotations ?? {}), ...annotations };
        delete ann[FENCED_ANNOTATION];
        if (d.action === "takeover") ann[PREVIOUS_NODE_ANNOTATION] = d.from;
        let switched: NVMeVolumeAttachment;
        try {
          // resourceVersion-guarded: an unpublish or another takeover in between wins, we re-read.
          switched = await c.attClient.replace({
            ...held,
            metadata: { ...held.metadata, annotations: ann },
            spec: {
              ...held.spec,
              nodeId: intent.nodeId,
              hostNQN: intent.hostNQN,
              // Only the node ID's format changed (same host): the same grant, the same attachment
              // id, so nothing downstream sees a new owner. A new host or a takeover gets a new id.
              attachmentId:
                d.action === "renew" && held.spec.hostNQN === intent.hostNQN
                  ? held.spec.attachmentId
                  : c.newAttachmentId(),
            },
          });
        } catch (err) {
          if (err instanceof StorageError && (err.kind === "conflict" || err.kind === "not-found")) continue;
          throw err;
        }
        const what = d.action === "takeover" ? `taken over from fenced node ${d.from}` : d.reason;
        c.log.warn("volume publication switched", {
          partition: c.key(ref.name),
          node: intent.nodeId,
          why: what,
        });
        void c.o.events?.record(
          p,
          "Warning",
          d.action === "takeover" ? "TakenOver" : "HostNQNChanged",
          "Publish",
          `publication for node ${intent.nodeId}: ${what}`,
        );
        return awaitReady(c, switched, signal, seen);
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
function awaitReady(
  c: ControllerState,
  a: NVMeVolumeAttachment,
  signal: AbortSignal,
  seen: (a: NVMeVolumeAttachment) => void,
): Promise<NVMeVolumeAttachment> {
  const id = a.spec.attachmentId;
  const generation = a.metadata.generation ?? 0;
  return c.attachmentWaiter.waitFor(
    c.key(a.metadata.name),
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

/** The partition's writer-style attachment (the one per partition name), as a list of 0 or 1. */
async function primaryOf(c: ControllerState, ref: VolumeRef): Promise<NVMeVolumeAttachment[]> {
  const a = await c.attClient.get(attachmentNameFor(ref.name, ref.uid), c.ns);
  return a && a.spec.partitionUID === ref.uid ? [a] : [];
}

/** Every multi-node (per-node) attachment of this partition incarnation, from the API server. */
async function readersOf(c: ControllerState, ref: VolumeRef): Promise<NVMeVolumeAttachment[]> {
  const list = await c.attClient.list({ namespace: c.ns, labelSelector: `${READER_OF_LABEL}=${ref.uid}` });
  return list.items.filter((a) => a.spec.partitionUID === ref.uid);
}

/**
 * ControllerUnpublishVolume: removes the node's publication (any node's when node_id is empty)
 * and answers once the agent has revoked the target ACL and released the attachment. OK when
 * nothing is published there; idempotent. A reader node's own attachment goes the same way.
 */
export async function unpublishVolume(
  c: ControllerState,
  req: ControllerUnpublishVolumeRequest,
  ctx: HandlerContext,
) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const ref = c.ref(req.volumeId);
  if (!ref) return {}; // no such volume: nothing is published
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(key, `ControllerUnpublishVolume ${req.nodeId}`, async () => {
    let last: NVMeVolumeAttachment | undefined;
    await c.budget(
      ctx,
      async (signal) => {
        const readers = (await readersOf(c, ref)).filter(
          (a) => req.nodeId === "" || a.spec.nodeId === req.nodeId,
        );
        const primary = await primaryOf(c, ref);
        for (const cur of [...primary, ...readers]) {
          last = cur;
          const d = decideUnpublish(cur, req.nodeId);
          if (d.action === "done") continue;
          const name = cur.metadata.name;
          if (d.action === "delete") {
            try {
              await c.attClient.delete(name, c.ns, { uid: cur.metadata.uid });
            } catch (err) {
              // The uid precondition failed: the attachment we read is gone already.
              if (err instanceof StorageError && err.kind === "conflict") continue;
              throw err;
            }
          }
          await c.waitGone(c.attachmentWaiter, c.attClient, name, cur.metadata.uid as string, signal, (o) => {
            last = o;
          });
          // Only once the target no longer admits the host: its keys go last.
          const opts = (await c.partitionOf(ref))?.spec.targetOptions;
          const keySecret = opts?.dhchap?.secretName ?? opts?.tls?.secretName;
          if (keySecret) await c.keys.removeHost(c.ns, keySecret, cur.spec.hostNQN);
          c.log.info("volume unpublished", { partition: key, node: cur.spec.nodeId });
        }
      },
      () =>
        `revoking access of ${last?.spec.nodeId ?? req.nodeId} to volume ${key} is not finished: the agent holds the attachment until the target ACL is revoked`,
    );
    return {};
  });
}
