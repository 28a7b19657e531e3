// The status half of a reconcile outcome: fields to set or drop and conditions to upsert, applied
// to whatever status the server holds at write time (updateStatus may re-apply it after a conflict).
import type { Condition } from "../api/index.ts";
import { setCondition } from "../lib/kube/conditions.ts";
import { jsonEqual } from "../lib/kube/status.ts";

/** A condition the core wants; lastTransitionTime is managed by setCondition. */
export type ConditionInput = Omit<Condition, "lastTransitionTime">;

export interface StatusPatch<S> {
  /** Fields to set; a key whose value is undefined is removed. */
  set?: { [K in keyof S]?: S[K] | undefined };
  conditions?: readonly ConditionInput[];
}

type WithConditions = { conditions?: Condition[] };

/**
 * `current` (or `initial` when the object has no status yet) with `patch` applied. Pure: never
 * mutates its inputs. Fields the patch does not name, including conditions of other types, are
 * kept, so writers of different fields (agent, manager) do not clobber each other.
 */
export function applyStatusPatch<S extends WithConditions>(
  current: S | undefined,
  initial: S,
  patch: StatusPatch<S>,
  now: Date,
): S {
  const out: Record<string, unknown> = { ...(current ?? initial) };
  for (const [k, v] of Object.entries(patch.set ?? {})) {
    if (v === undefined) delete out[k];
    else out[k] = v;
  }
  let conds = (out.conditions as Condition[] | undefined) ?? [];
  for (const c of patch.conditions ?? []) conds = setCondition(conds, c, now) as Condition[];
  if (patch.conditions?.length || out.conditions !== undefined) out.conditions = conds;
  return out as S;
}

/** True when the patch would change nothing in `current` (used to skip writes and requeues). */
export function isNoop<S extends WithConditions>(current: S | undefined, patch: StatusPatch<S>): boolean {
  if (current === undefined) return false;
  for (const [k, v] of Object.entries(patch.set ?? {})) {
    if (!jsonEqual((current as Record<string, unknown>)[k], v)) return false;
  }
  const conds = current.conditions ?? [];
  for (const c of patch.conditions ?? []) {
    const have = conds.find((x) => x.type === c.type);
    if (
      !have ||
      have.status !== c.status ||
      have.reason !== c.reason ||
      have.message !== c.message ||
      have.observedGeneration !== c.observedGeneration
    )
      return false;
  }
  return true;
}
