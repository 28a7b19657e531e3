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
 * Label on the per-node attachments of a multi-node volume (MULTI_NODE_READER_ONLY readers,
 * MULTI_NODE_MULTI_WRITER writers; value the partition UID), so a publish can list every holder
 * of a partition from the API server. The agent recognises them by name, not by this label.
 */
export const READER_OF_LABEL = "storage.distort.io/reader-of";

/** The access mode an attachment was published with (the tail of its access annotation). */
export function modeOf(a: NVMeVolumeAttachment): string | undefined {
  return a.metadata.annotations?.[ACCESS_ANNOTATION]?.split(":").at(-1);
}

const fenced = (a: NVMeVolumeAttachment) => a.metadata.annotations?.[FENCED_ANNOTATION] === "true";

export type ExclusionDecision =
  /** Nothing of the other kind holds the volume: go on. */
  | { action: "proceed" }
  /** Only attachments being deleted stand in the way: wait until they are gone. */
  | { action: "wait-gone"; names: string[] }
  /**
   * Attachments an administrator marked fenced stand in the way: delete them (their hosts leave
   * the ACL), wait until they are gone, then decide again.
   */
  | { action: "revoke"; names: string[] }
  /** Live attachments of the other kind: FAILED_PRECONDITION. */
  | { action: "refuse"; message: string };

/**
 * Single-node and multi-node publications never hold a volume together. A multi-node publish
 * (`multi`: MULTI_NODE_READER_ONLY or MULTI_NODE_MULTI_WRITER) checks the partition's one
 * single-node attachment (`others` = [it] or []); every other publish checks the multi-node
 * attachments (`others` = all of them), and may revoke them when every live one is fenced.
 * Attachments being deleted are still on the target's ACL until the agent revokes them, so they
 * are waited for, never overlooked. Pure.
 */
export function decideExclusion(multi: boolean, others: readonly NVMeVolumeAttachment[]): ExclusionDecision {
  if (others.length === 0) return { action: "proceed" };
  const live = others.filter((a) => !a.metadata.deletionTimestamp);
  if (live.length === 0) return { action: "wait-gone", names: others.map((a) => a.metadata.name) };
  const nodes = [...new Set(live.map((a) => a.spec.nodeId))].sort().join(", ");
  if (multi)
    return {
      action: "refuse",
      message: `volume is published to node ${nodes} with ${live[0]?.metadata.annotations?.[ACCESS_ANNOTATION] ?? "a single-node capability"}; multi-node publications (MULTI_NODE_READER_ONLY, MULTI_NODE_MULTI_WRITER) are admitted only while no other publication holds it`,
    };
  // The takeover rule of a single holder, applied to each: fenced holders lose their access.
  if (live.every(fenced)) return { action: "revoke", names: live.map((a) => a.metadata.name) };
  const modes = [...new Set(live.map((a) => modeOf(a) ?? "a multi-node mode"))].sort().join(", ");
  return {
    action: "refuse",
    message: `volume is published ${modes} to node(s) ${nodes}; a publication of another mode is refused until every one of them has unpublished (or is annotated ${FENCED_ANNOTATION}=true)`,
  };
}

/**
 * A multi-node publish of `mode` for node `nodeId` against the partition's other multi-node
 * attachments (`shared`; this node's own is decidePublish's business and is skipped here):
 * - fenced ones (live) are revoked first: a fenced host never stays on the ACL;
 * - ones of another multi-node mode refuse it (readers and writers never share a volume), or are
 *   waited for while being deleted;
 * - MULTI_NODE_MULTI_WRITER admits `maxWriters` hosts: more live ones refuse it, and ones still
 *   leaving the ACL are waited for.
 * Pure.
 */
export function decideSharing(
  mode: string,
  nodeId: string,
  shared: readonly NVMeVolumeAttachment[],
  maxWriters: number,
): ExclusionDecision {
  const others = shared.filter((a) => !sameNode(a.spec.nodeId, nodeId));
  const live = others.filter((a) => !a.metadata.deletionTimestamp);
  const leaving = others.filter((a) => a.metadata.deletionTimestamp);
  const revoke = live.filter(fenced);
  if (revoke.length > 0) return { action: "revoke", names: revoke.map((a) => a.metadata.name) };
  const foreign = live.filter((a) => modeOf(a) !== mode);
  if (foreign.length > 0) {
    const nodes = [...new Set(foreign.map((a) => a.spec.nodeId))].sort().join(", ");
    return {
      action: "refuse",
      message: `volume is published ${modeOf(foreign[0] as NVMeVolumeAttachment) ?? "in another mode"} to node(s) ${nodes}; ${mode} is refused until they have unpublished`,
    };
  }
  const foreignLeaving = leaving.filter((a) => modeOf(a) !== mode);
  if (foreignLeaving.length > 0)
    return { action: "wait-gone", names: foreignLeaving.map((a) => a.metadata.name) };
  if (mode === "MULTI_NODE_MULTI_WRITER" && live.length + leaving.length >= maxWriters) {
    if (live.length >= maxWriters) {
      const nodes = live
        .map((a) => a.spec.nodeId)
        .sort()
        .join(", ");
      return {
        action: "refuse",
        message: `volume is published MULTI_NODE_MULTI_WRITER to ${maxWriters} nodes already (${nodes}), the most a live migration needs; unpublish one first`,
      };
    }
    return { action: "wait-gone", names: leaving.map((a) => a.metadata.name) };
  }
  return { action: "proceed" };
}
