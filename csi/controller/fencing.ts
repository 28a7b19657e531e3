// Single-writer fencing of ControllerPublish/Unpublish as pure decisions over the partition's one
// NVMeVolumeAttachment: who holds the volume, whether a new node may take it over (only after an
// administrator has marked the holder fenced), and what an unpublish may remove.
import type { NVMeVolumeAttachment } from "../../api/index.ts";
import { sameNode } from "../../lib/csi-node-id.ts";
import { findCondition } from "../../lib/kube/conditions.ts";

/**
 * Annotation an administrator sets to "true" on an NVMeVolumeAttachment after making sure its node
 * can no longer reach the target (powered off, cut from the fabric). Only then may another node
 * take the volume over; the takeover removes it, so it fences one holder exactly once.
 */
export const FENCED_ANNOTATION = "storage.distort.io/fenced";
/** Publication details the controller records, to tell an idempotent retry from an incompatible one. */
export const READONLY_ANNOTATION = "storage.distort.io/readonly";
export const ACCESS_ANNOTATION = "storage.distort.io/access";
/** The node a takeover displaced, for the audit trail. */
export const PREVIOUS_NODE_ANNOTATION = "storage.distort.io/previous-node";

/** What a ControllerPublishVolume asks for. */
export interface PublishIntent {
  nodeId: string;
  hostNQN: string;
  /** capabilityKey() of the requested capability. */
  access: string;
  readonly: boolean;
}

export type PublishDecision =
  /** No attachment: create one for this node. */
  | { action: "create" }
  /** The attachment is being deleted (an unpublish is revoking its ACL): wait until it is gone. */
  | { action: "wait-gone" }
  /** This node already holds the volume under this lifetime: wait for (or confirm) AccessReady. */
  | { action: "await-ready" }
  /** This node holds it, but its host NQN changed: a new lifetime with the new NQN. */
  | { action: "renew"; reason: string }
  /** The holder was fenced by an administrator: switch the attachment to this node. */
  | { action: "takeover"; from: string }
  /** Another node holds it and was not fenced: FAILED_PRECONDITION. */
  | { action: "refuse"; holder: string; message: string }
  /** This node holds it with other publication details: ALREADY_EXISTS. */
  | { action: "incompatible"; message: string };

/** Decides ControllerPublishVolume from the current attachment (undefined when there is none). */
export function decidePublish(
  current: NVMeVolumeAttachment | undefined,
  want: PublishIntent,
): PublishDecision {
  if (!current) return { action: "create" };
  if (current.metadata.deletionTimestamp) return { action: "wait-gone" };
  const ann = current.metadata.annotations ?? {};
  // Node IDs of one node compare by node name: a bare name (earlier releases) and name/NQN.
  if (sameNode(current.spec.nodeId, want.nodeId)) {
    const ro = ann[READONLY_ANNOTATION] === "true";
    const access = ann[ACCESS_ANNOTATION];
    if (ro !== want.readonly || (access !== undefined && access !== want.access)) {
      return {
        action: "incompatible",
        message: `volume is already published to node ${want.nodeId} with ${access ?? "another capability"}${ro ? " read-only" : ""}; this request asks for ${want.access}${want.readonly ? " read-only" : ""}`,
      };
    }
    if (current.spec.hostNQN !== want.hostNQN) {
      return {
        action: "renew",
        reason: `host NQN of ${want.nodeId} changed from ${current.spec.hostNQN} to ${want.hostNQN}`,
      };
    }
    if (current.spec.nodeId !== want.nodeId) {
      // Same node and host, node ID of a newer format: record the ID the CO now uses.
      return { action: "renew", reason: `node ID of ${current.spec.nodeId} is now ${want.nodeId}` };
    }
    return { action: "await-ready" };
  }
  if (ann[FENCED_ANNOTATION] === "true") return { action: "takeover", from: current.spec.nodeId };
  return {
    action: "refuse",
    holder: current.spec.nodeId,
    message: `volume is published to node ${current.spec.nodeId} (NVMeVolumeAttachment ${current.metadata.name}); it has a single writer. After making sure ${current.spec.nodeId} can no longer reach the target, annotate the attachment ${FENCED_ANNOTATION}=true to let ${want.nodeId} take it over`,
  };
}

/** True once the agent enforces exactly this attachment lifetime (AccessReady=True for its id). */
export function accessReady(a: NVMeVolumeAttachment, attachmentId: string): boolean {
  if (a.spec.attachmentId !== attachmentId || a.status?.observedAttachmentId !== attachmentId) return false;
  return findCondition(a.status?.conditions ?? [], "AccessReady")?.status === "True";
}

/** Why an attachment is not ready yet, for timeout messages. */
export function accessPending(a: NVMeVolumeAttachment | undefined): string {
  if (!a) return "the attachment is not visible yet";
  const c = findCondition(a.status?.conditions ?? [], "AccessReady");
  const observed = a.status?.observedAttachmentId;
  const lifetime =
    observed === a.spec.attachmentId
      ? ""
      : ` (target still enforces ${observed ?? "no"} attachment lifetime)`;
  return c
    ? `AccessReady=${c.status} ${c.reason}: ${c.message}${lifetime}`
    : `the agent has not reported AccessReady${lifetime}`;
}

export type UnpublishDecision =
  /** Nothing of this node's to remove (no attachment, or another node holds it now). */
  | { action: "done"; why: string }
  /** Delete it (exact UID) and wait until the agent revoked the ACL and released it. */
  | { action: "delete" }
  /** Already being deleted: wait until it is gone. */
  | { action: "wait-gone" };

/**
 * Decides ControllerUnpublishVolume. An empty nodeId means "from every node". A request from a
 * node that no longer holds the attachment (it was taken over) must not remove the new holder's
 * access: that is what keeps a delayed unpublish from un-fencing anything.
 */
export function decideUnpublish(
  current: NVMeVolumeAttachment | undefined,
  nodeId: string,
): UnpublishDecision {
  if (!current) return { action: "done", why: "not published" };
  if (nodeId !== "" && !sameNode(current.spec.nodeId, nodeId))
    return { action: "done", why: `published to ${current.spec.nodeId}, not ${nodeId}` };
  if (current.metadata.deletionTimestamp) return { action: "wait-gone" };
  return { action: "delete" };
}

/**
 * Label on the extra attachments of a MULTI_NODE_READER_ONLY volume (one per reader node, value
 * the partition UID), so a publish can list every reader of a partition from the API server.
 */
export const READER_OF_LABEL = "storage.distort.io/reader-of";

export type ExclusionDecision =
  /** Nothing of the other kind holds the volume: go on. */
  | { action: "proceed" }
  /** Only attachments being deleted stand in the way: wait until they are gone. */
  | { action: "wait-gone"; names: string[] }
  /** Live attachments of the other kind: FAILED_PRECONDITION. */
  | { action: "refuse"; message: string };

/**
 * Readers and a writer never hold a volume together. A MULTI_NODE_READER_ONLY publish (`reader`)
 * checks the partition's one writer-style attachment (`others` = [it] or []); every other publish
 * checks the reader attachments (`others` = all of them). Attachments being deleted are still on
 * the target's ACL until the agent revokes them, so they are waited for, never overlooked. Pure.
 */
export function decideExclusion(reader: boolean, others: readonly NVMeVolumeAttachment[]): ExclusionDecision {
  if (others.length === 0) return { action: "proceed" };
  const live = others.filter((a) => !a.metadata.deletionTimestamp);
  if (live.length === 0) return { action: "wait-gone", names: others.map((a) => a.metadata.name) };
  const nodes = [...new Set(live.map((a) => a.spec.nodeId))].sort().join(", ");
  return reader
    ? {
        action: "refuse",
        message: `volume is published to node ${nodes} with ${live[0]?.metadata.annotations?.[ACCESS_ANNOTATION] ?? "a single-node capability"}; MULTI_NODE_READER_ONLY readers are admitted only while no other publication holds it`,
      }
    : {
        action: "refuse",
        message: `volume is published read-only (MULTI_NODE_READER_ONLY) to node(s) ${nodes}; a publication of another mode is refused until every reader has unpublished`,
      };
}
