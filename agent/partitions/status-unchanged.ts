// A partition's status write as a function of the object it is applied to, and whether the
// cached object alone shows that the write would change nothing.
import type { NVMePartition } from "../../api/index.ts";
import { type Condition, setCondition } from "../../lib/kube/conditions.ts";
import { jsonEqual } from "../../lib/kube/status.ts";

type PartitionStatus = NonNullable<NVMePartition["status"]>;

/**
 * The status `patch` and condition `cond` make of `latest` (conditions keep their transition
 * times, the other conditions stay as they are); undefined for another object of the same name
 * (UID not `uid`). Pure, as updateStatus requires.
 */
export function partitionStatusWrite(
  uid: string | undefined,
  patch: (s: PartitionStatus) => void,
  cond: Omit<Condition, "lastTransitionTime">,
  now: Date,
): (latest: NVMePartition) => PartitionStatus | undefined {
  return (latest) => {
    if (latest.metadata.uid !== uid) return undefined;
    const s = structuredClone(latest.status ?? { state: "Pending", conditions: [] }) as PartitionStatus;
    patch(s);
    s.conditions = setCondition(
      s.conditions ?? [],
      { ...cond, observedGeneration: latest.metadata.generation },
      now,
    );
    s.observedGeneration = latest.metadata.generation;
    return s;
  };
}

/**
 * True when `compute`, a status write, gives the cached object's status back as it is: the stored
 * object already says what the write asks for, so there is nothing to read or write. The agent's
 * cache keeps the Ready condition only (agentTransform); a write sets one condition and leaves
 * the others, so comparing without them decides as comparing the stored object would. A cache
 * behind the API server (another writer's change not delivered yet) is put right by the watch
 * event that delivers the change, which queues the partition again.
 */
export function cachedStatusHolds<T extends { status?: unknown }>(
  cached: T,
  compute: (latest: T) => unknown,
): boolean {
  if (cached.status === undefined) return false;
  const next = compute(cached);
  return next !== undefined && jsonEqual(next, cached.status);
}
