// Status writes through the /status subresource with optimistic concurrency: read the latest
// object, compute the new status from it, write with its resourceVersion, and on conflict start
// over from a fresh read. A computed status equal to the stored one is not written.
import type { KubeObject, ResourceClient } from "./resource.ts";
import { retryOnConflict } from "./retry-on-conflict.ts";

export type WithStatus<S> = KubeObject & { status?: S };

/** Structural equality for JSON data (key order ignored), used to skip no-op writes. */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b))
    return a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  const ka = Object.keys(a).filter((k) => (a as Record<string, unknown>)[k] !== undefined);
  const kb = Object.keys(b).filter((k) => (b as Record<string, unknown>)[k] !== undefined);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => jsonEqual((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/**
 * Sets the status of `name` to `compute(latest)`. `compute` must be a pure function of the object
 * it is given (it can run several times); returning undefined means "leave it". Returns the
 * stored object, or undefined when the object no longer exists. Gives up with
 * StorageError("conflict") after `attempts` conflicting writes in a row.
 */
export async function updateStatus<S, T extends WithStatus<S>>(
  client: ResourceClient<T>,
  name: string,
  namespace: string | undefined,
  compute: (latest: T) => S | undefined,
  attempts = 5,
): Promise<T | undefined> {
  return retryOnConflict(`status of ${name}`, attempts, async () => {
    const latest = await client.get(name, namespace);
    if (!latest) return { done: undefined };
    const next = compute(latest);
    if (next === undefined || jsonEqual(next, latest.status)) return { done: latest };
    return { write: () => client.replaceStatus({ ...latest, status: next }) };
  });
}
