// The cleanup finalizer is added with a JSON patch guarded by the object's UID and its finalizers
// as last seen, not by resourceVersion: the manager's status write usually lands between the
// agent seeing a partition and adding the finalizer, and a full update from the cached copy then
// conflicted every time, costing a retry on the critical path for nothing.
import type { JsonPatchOp, KubeObject } from "../../lib/kube/resource.ts";

/**
 * Ops appending `finalizer` to `obj`'s finalizers, which apply only while the stored object is
 * the same incarnation and its list is still the one in `obj`: a finalizer someone else added or
 * removed meanwhile fails the `test` (422) instead of being overwritten.
 */
export function addFinalizerOps(obj: KubeObject, finalizer: string): JsonPatchOp[] {
  const seen = obj.metadata.finalizers ?? [];
  const guard: JsonPatchOp[] = [{ op: "test", path: "/metadata/uid", value: obj.metadata.uid }];
  // The apiserver omits an empty list, so "none yet" is tested as a missing member (null).
  if (seen.length === 0) {
    return [
      ...guard,
      { op: "test", path: "/metadata/finalizers", value: null },
      { op: "add", path: "/metadata/finalizers", value: [finalizer] },
    ];
  }
  return [
    ...guard,
    { op: "test", path: "/metadata/finalizers", value: seen },
    { op: "add", path: "/metadata/finalizers/-", value: finalizer },
  ];
}
