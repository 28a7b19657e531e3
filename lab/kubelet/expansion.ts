// kubelet's half of volume expansion, as Kubernetes 1.36 does it (RecoverVolumeExpansionFailure):
// which claims ask for node expansion, and the claim status patches kubelet writes around
// NodeExpandVolume (pkg/volume/util/resize_util.go). The status computations are pure.
import * as k8s from "@kubernetes/client-node";
import { kubeError } from "../../lib/kube/resource.ts";

/** The resize conditions kubelet replaces (resize_util.go's knownResizeConditions); others are kept. */
export const RESIZE_CONDITIONS: ReadonlySet<string> = new Set([
  "FileSystemResizePending",
  "Resizing",
  "ControllerResizeError",
  "NodeResizeError",
]);

/**
 * True when the claim waits for the node: its storage resize status is NodeResizePending or
 * NodeResizeInProgress (a retry), or, from a resizer without resize statuses, it carries a true
 * FileSystemResizePending condition.
 */
export function wantsNodeExpansion(pvc: k8s.V1PersistentVolumeClaim): boolean {
  const resize = pvc.status?.allocatedResourceStatuses?.storage;
  if (resize === "NodeResizePending" || resize === "NodeResizeInProgress") return true;
  return (
    resize === undefined &&
    (pvc.status?.conditions ?? []).some((c) => c.type === "FileSystemResizePending" && c.status === "True")
  );
}

function iso(t: unknown): string | undefined {
  if (t === undefined || t === null) return undefined;
  return `${new Date(t as string).toISOString().slice(0, 19)}Z`;
}

/** A claim condition as JSON the API server reads back (times as RFC 3339 strings). */
function plainCondition(c: k8s.V1PersistentVolumeClaimCondition): Record<string, unknown> {
  const since = iso(c.lastTransitionTime);
  const probed = iso(c.lastProbeTime);
  return {
    type: c.type,
    status: c.status,
    ...(c.reason ? { reason: c.reason } : {}),
    ...(c.message ? { message: c.message } : {}),
    ...(since ? { lastTransitionTime: since } : {}),
    ...(probed ? { lastProbeTime: probed } : {}),
  };
}

/** MarkNodeExpansionInProgress: the status patch kubelet writes before NodeExpandVolume. */
export function expansionStartedStatus(): Record<string, unknown> {
  return { allocatedResourceStatuses: { storage: "NodeResizeInProgress" } };
}

/**
 * MarkFSResizeFinished: capacity.storage becomes `size` (the PV's capacity), the storage resize
 * status goes (the whole map when it was the only entry) and so do all resize conditions.
 * A merge patch of the claim's status.
 */
export function expansionFinishedStatus(
  pvc: k8s.V1PersistentVolumeClaim,
  size: string,
): Record<string, unknown> {
  const others = Object.keys(pvc.status?.allocatedResourceStatuses ?? {}).filter((k) => k !== "storage");
  return {
    capacity: { ...(pvc.status?.capacity ?? {}), storage: size },
    // In a merge patch null removes: the one key, or the map that would otherwise stay empty.
    allocatedResourceStatuses: others.length > 0 ? { storage: null } : null,
    conditions: (pvc.status?.conditions ?? [])
      .filter((c) => !RESIZE_CONDITIONS.has(c.type))
      .map(plainCondition),
  };
}

/**
 * MarkNodeExpansionFailedCondition: a NodeResizeError condition saying why, other conditions
 * kept; the resize status stays NodeResizeInProgress so the next sync retries.
 */
export function expansionFailedStatus(
  pvc: k8s.V1PersistentVolumeClaim,
  error: string,
  nowIso: string,
): Record<string, unknown> {
  return {
    conditions: [
      ...(pvc.status?.conditions ?? []).filter((c) => c.type !== "NodeResizeError").map(plainCondition),
      {
        type: "NodeResizeError",
        status: "True",
        lastTransitionTime: nowIso,
        message: `failed to expand pvc with ${error}`,
      },
    ],
  };
}

/**
 * Merge-patches the claim's status through the status subresource, guarded by the claim's
 * resourceVersion as kubelet's PatchPVCStatus is: a stale claim fails with StorageError "conflict".
 */
export async function patchClaimStatus(
  core: k8s.CoreV1Api,
  pvc: k8s.V1PersistentVolumeClaim,
  status: Record<string, unknown>,
): Promise<k8s.V1PersistentVolumeClaim> {
  try {
    return await core.patchNamespacedPersistentVolumeClaimStatus(
      {
        name: pvc.metadata?.name ?? "",
        namespace: pvc.metadata?.namespace ?? "default",
        body: { metadata: { resourceVersion: pvc.metadata?.resourceVersion }, status },
      },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  } catch (err) {
    throw kubeError(err, `update status of persistentvolumeclaim ${pvc.metadata?.name}`);
  }
}
