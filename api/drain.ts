// Cordon and drain of a storage node (RDMAStorageNode) or of one drive (NVMeDevice): the operator's
// spec fields, the manager's Drained condition and the Event reasons. The agent creates both
// objects and merge-patches only its own spec fields, so these operator fields are never overwritten.
import * as v from "valibot";
import { cel } from "./common.ts";

/** spec.unschedulable: cordon. No new copy or volume is placed here; what is here stays. */
export const UnschedulableSchema = v.pipe(
  v.boolean(),
  v.description(
    "Cordon (operator): true = placement puts no new volume or replica here; what is already here stays and keeps serving. Absent or false: schedulable (unless spec.drain is true).",
  ),
);

/** spec.drain: drain (implies cordon). */
export const DrainSchema = v.pipe(
  v.boolean(),
  v.description(
    "Drain (operator, implies cordon): true = every replica of a replicated volume here is re-created elsewhere, rebuilt, and only then removed; a volume served from here is handed over to another node holding a current copy first. Single-copy volumes cannot move and block the drain (the Drained condition names them). Progress: the Drained condition. Set false or remove it to stop (what moved stays moved; a replacement made for a copy that stays is removed again).",
  ),
);

const contradiction =
  "spec.unschedulable must not be false while spec.drain is true (a drain implies cordon): remove spec.unschedulable or set it true";

/** The cordon/drain fields every drainable spec carries, and the rule between them. */
export const drainFields = {
  unschedulable: v.optional(UnschedulableSchema),
  drain: v.optional(DrainSchema),
};

/** CEL on the spec object: drain without cordon is a contradiction, not silently resolved. */
export function drainRule<TInput>() {
  return cel<TInput>(
    "!(has(self.drain) && self.drain && has(self.unschedulable) && !self.unschedulable)",
    contradiction,
    { fieldPath: ".unschedulable", reason: "FieldValueInvalid" },
  );
}

/** The same rule for valibot (parsed objects). */
export function drainCheck<T extends { unschedulable?: boolean | undefined; drain?: boolean | undefined }>() {
  return v.check<T, string>((s) => !(s.drain === true && s.unschedulable === false), contradiction);
}

/** Condition type (manager) on a draining RDMAStorageNode or NVMeDevice. */
export const DRAINED = "Drained";

/** Drained condition reasons. */
export const DrainReasons = {
  /** Copies are being replaced / retired / handed over. */
  Draining: "Draining",
  /** Single-copy volumes are here: they cannot move, the drain cannot finish. */
  SingleCopyVolumes: "SingleCopyVolumes",
  /** Nothing of DISTORT is left here. */
  Drained: "Drained",
  /** spec.drain is false/absent again: the drain was stopped. */
  NotDraining: "NotDraining",
} as const;

/** Whether the object's spec asks for a drain. */
export function isDraining(o: { spec: { drain?: boolean | undefined } } | undefined): boolean {
  return o?.spec.drain === true;
}

/** Whether placement must skip the object (cordoned, or draining). */
export function isCordoned(
  o: { spec: { drain?: boolean | undefined; unschedulable?: boolean | undefined } } | undefined,
): boolean {
  return o?.spec.unschedulable === true || o?.spec.drain === true;
}
