// What the agent caches of each kind it watches: the scope (the release namespace, and this node's
// objects where a kind has a node field) and the transform that drops the fields no agent reads.
import { kinds } from "../api/index.ts";
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

/**
 * Per kind, what the agent drops before caching (managedFields are gone already):
 * - NVMePartition: status.conditions and metadata.annotations. Every status write re-reads the
 *   object (updateStatus), finalizers are added by a JSON patch testing only the finalizers and
 *   removed from a fresh read, and no decision reads a condition or an annotation.
 * - NVMeVolumeAttachment, NVMeSnapshot: status.conditions. Their status is written from a fresh
 *   read; the attachment's finalizer is added by a whole-object replace from the cache, which is
 *   why its metadata is kept whole (the status subresource makes the server ignore status there).
 * - NVMeDevice: nothing; the reporter computes a drive's next status from the cached one.
 * Objects of other kinds pass unchanged.
 */
export const agentTransform: ObjectTransform = (kind, obj) => {
  if (kind.kind === kinds.NVMePartition.kind) {
    delete obj.metadata.annotations;
    return withoutConditions(obj as WithStatus);
  }
  if (kind.kind === kinds.NVMeVolumeAttachment.kind || kind.kind === kinds.NVMeSnapshot.kind) {
    return withoutConditions(obj as WithStatus);
  }
  return obj;
};
