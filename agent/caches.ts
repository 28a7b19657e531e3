// What the agent caches of each kind it watches: the scope (the release namespace, and this node's
// objects where a kind has a node field) and the transform that drops the fields no agent reads.
import { HANDOVER_ANNOTATION, kinds } from "../api/index.ts";
import type { CacheScope, ObjectTransform } from "../lib/kube/cache-set.ts";
import type { KubeObject } from "../lib/kube/resource.ts";

/**
 * The objects of kinds with a selectable spec.nodeName that are assigned to `nodeName`; for a
 * namespaced kind, only those in `namespace` (the release namespace: DISTORT's own objects live
 * there, and a tenant's objects in its own namespace must never reach an export or an ACL).
 */
export function onNode(nodeName: string, namespace?: string): CacheScope {
  return { ...(namespace ? { namespace } : {}), fieldSelector: `spec.nodeName=${nodeName}` };
}

/**
 * The scope of namespaced kinds with no selectable storage-node field (attachments, snapshots):
 * the release namespace only. The CSI controller writes them there; RBAC lets no tenant do so.
 */
export function inReleaseNamespace(namespace: string): CacheScope {
  return { namespace };
}

type WithStatus = KubeObject & { status?: { conditions?: unknown } };

function withoutConditions<T extends WithStatus>(obj: T): T {
  if (obj.status && "conditions" in obj.status) delete obj.status.conditions;
  return obj;
}

/** The condition of `type` only (when the object has it); every other condition is dropped. */
function withOnlyCondition<T extends WithStatus>(obj: T, type: string): T {
  const conds = obj.status?.conditions;
  if (!obj.status || conds === undefined) return obj;
  const own = Array.isArray(conds)
    ? conds.filter((c) => (c as { type?: unknown } | null)?.type === type)
    : [];
  if (own.length > 0) obj.status.conditions = own;
  else delete obj.status.conditions;
  return obj;
}

/**
 * Per kind, what the agent drops before caching (managedFields are gone already):
 * - NVMePartition: metadata.annotations and every condition but Ready (the one the agent writes).
 *   A status write that would change something re-reads the object (updateStatus), so the others
 *   are kept from the stored object; Ready is kept so that a pass can tell from the cache alone
 *   that its write would change nothing (a new agent has not stored any status yet, and a GET per
 *   export made its restart replay wait on the API server). Finalizers are added by a JSON patch
 *   testing only the finalizers and removed from a fresh read; no decision reads a condition or
 *   an annotation, except storage.distort.io/handover-from (a planned handover), which is kept.
 * - NVMeVolumeAttachment, NVMeSnapshot: status.conditions. Their status is written from a fresh
 *   read; the attachment's finalizer is added by a whole-object replace from the cache, which is
 *   why its metadata is kept whole (the status subresource makes the server ignore status there).
 * - NVMeDevice: nothing; the reporter computes a drive's next status from the cached one.
 * Objects of other kinds pass unchanged.
 */
export const agentTransform: ObjectTransform = (kind, obj) => {
  if (kind.kind === kinds.NVMePartition.kind) {
    const handover = obj.metadata.annotations?.[HANDOVER_ANNOTATION];
    delete obj.metadata.annotations;
    if (handover !== undefined) obj.metadata.annotations = { [HANDOVER_ANNOTATION]: handover };
    return withOnlyCondition(obj as WithStatus, "Ready");
  }
  if (kind.kind === kinds.NVMeVolumeAttachment.kind || kind.kind === kinds.NVMeSnapshot.kind) {
    return withoutConditions(obj as WithStatus);
  }
  return obj;
};
