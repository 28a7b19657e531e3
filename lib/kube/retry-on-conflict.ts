// The optimistic-concurrency loop behind every read-modify-write of a Kubernetes object: read,
// decide, write with the read's resourceVersion, and on a conflict start over from a fresh read.
import { StorageError } from "../errors.ts";

/** What one attempt decided after its read: stop with `done`, or perform `write`. */
export type Attempt<T> = { readonly done: T | undefined } | { readonly write: () => Promise<T> };

/**
 * Runs `attempt` (a fresh read and a decision) up to `attempts` times. A `done` result is returned
 * as is. A `write` is performed: its result is returned; StorageError "conflict" starts the next
 * attempt; "not-found" (the object went away meanwhile) returns undefined; anything else
 * propagates. After `attempts` conflicts in a row, throws StorageError "conflict" naming `what`
 * ("status of x"), with the last conflict as its cause.
 */
export async function retryOnConflict<T>(
  what: string,
  attempts: number,
  attempt: () => Promise<Attempt<T>>,
): Promise<T | undefined> {
  let last: unknown;
  for (let i = 0; i < attempts; i++) {
    const step = await attempt();
    if ("done" in step) return step.done;
    try {
      return await step.write();
    } catch (err) {
      if (err instanceof StorageError && err.kind === "conflict") {
        last = err;
        continue;
      }
      if (err instanceof StorageError && err.kind === "not-found") return undefined;
      throw err;
    }
  }
  throw new StorageError("conflict", `${what}: ${attempts} conflicting writes in a row`, { cause: last });
}
