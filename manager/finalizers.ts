// Finalizer edits as resourceVersion-guarded read-modify-write, bound to one object incarnation
// (UID), so an edit meant for a deleted claim never lands on a same-named replacement.
import type { KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import { retryOnConflict } from "../lib/kube/retry-on-conflict.ts";

/**
 * Applies `edit` to the finalizers of `name` if it is still the object with `uid`. `edit` returns
 * the new list, or undefined to leave it. Returns the stored object, or undefined when that
 * incarnation is gone. Retries conflicts (`attempts` reads in total); other errors propagate.
 */
export async function editFinalizers<T extends KubeObject>(
  client: ResourceClient<T>,
  name: string,
  namespace: string | undefined,
  uid: string,
  edit: (current: readonly string[]) => string[] | undefined,
  attempts = 5,
): Promise<T | undefined> {
  return retryOnConflict(`finalizers of ${name}`, attempts, async () => {
    const obj = await client.get(name, namespace);
    if (!obj || obj.metadata.uid !== uid) return { done: undefined };
    const current = obj.metadata.finalizers ?? [];
    const next = edit(current);
    if (!next || (next.length === current.length && next.every((f, j) => f === current[j])))
      return { done: obj };
    return { write: () => client.replace({ ...obj, metadata: { ...obj.metadata, finalizers: next } }) };
  });
}
