// Status writes that start from an object the caller already holds (the cache's copy, or what a
// spec write returned), saving the read updateStatus would do; on a conflict they fall back to
// lib/kube/status.ts's read-compute-write loop.
import { StorageError } from "../lib/errors.ts";
import type { ResourceClient } from "../lib/kube/resource.ts";
import { jsonEqual, updateStatus, type WithStatus } from "../lib/kube/status.ts";

/**
 * Sets the status of `known`'s object to `compute(latest)`, first trying `known` as the latest.
 * `compute` must be pure (it may run several times); undefined means leave it. Returns the stored
 * object, or undefined when the object is gone. Same errors as updateStatus.
 */
export async function writeStatus<S, T extends WithStatus<S>>(
  client: ResourceClient<T>,
  known: T,
  compute: (latest: T) => S | undefined,
): Promise<T | undefined> {
  const next = compute(known);
  if (next === undefined || jsonEqual(next, known.status)) return known;
  try {
    return await client.replaceStatus({ ...known, status: next });
  } catch (err) {
    if (err instanceof StorageError && err.kind === "not-found") return undefined;
    if (!(err instanceof StorageError && err.kind === "conflict")) throw err;
  }
  return updateStatus(client, known.metadata.name, known.metadata.namespace, compute);
}
