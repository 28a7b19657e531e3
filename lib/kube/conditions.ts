// metav1.Condition helpers on plain data (the equivalent of k8s.io/apimachinery/pkg/api/meta's
// SetStatusCondition and friends): pure functions, never mutating their inputs.

import { StorageError } from "../errors.ts";

export type ConditionStatus = "True" | "False" | "Unknown";

/** metav1.Condition as it appears in a CRD's status.conditions. */
export type Condition = {
  type: string;
  status: ConditionStatus;
  observedGeneration?: number;
  /** RFC 3339 with whole seconds, as the API server stores metav1.Time. */
  lastTransitionTime: string;
  reason: string;
  message: string;
};

/** metav1.Condition validation limits (apimachinery ValidateConditions). */
export const MAX_MESSAGE_BYTES = 32768;
const MAX_REASON = 1024;
const MAX_TYPE = 316;
const REASON = /^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/;
// A qualified name: optional DNS-subdomain prefix and "/", then a name part of at most 63 chars.
const TYPE =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const STATUSES: ReadonlySet<string> = new Set(["True", "False", "Unknown"]);
const TRUNCATED = "...";

/**
 * The API server stores metav1.Time at second precision; writing milliseconds would make every
 * read-back differ from what we computed and defeat conditionsEqual's no-op detection.
 */
export function formatConditionTime(now: Date): string {
  return now.toISOString().replace(/\.\d+Z$/, "Z");
}

/** Cuts `message` to MAX_MESSAGE_BYTES of UTF-8 (the server counts bytes), on a code point boundary. */
export function truncateMessage(message: string): string {
  const enc = new TextEncoder();
  if (enc.encode(message).length <= MAX_MESSAGE_BYTES) return message;
  const budget = MAX_MESSAGE_BYTES - TRUNCATED.length;
  let bytes = 0;
  let end = 0;
  for (const ch of message) {
    const cp = ch.codePointAt(0) as number;
    const size = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (bytes + size > budget) break;
    bytes += size;
    end += ch.length;
  }
  return message.slice(0, end) + TRUNCATED;
}

/**
 * Returns a new array with `next` set: an existing condition of the same type is replaced in
 * place (the first one, if the input holds duplicates), otherwise `next` is appended. The
 * lastTransitionTime is kept when the status did not change and set to `now` when it did (or the
 * type is new). The message is truncated to MAX_MESSAGE_BYTES. Throws StorageError("invalid") on
 * a reason that is not CamelCase-ish (metav1 pattern, 1..1024 chars), a malformed type, an
 * unknown status, or an observedGeneration that is not a non-negative integer.
 */
export function setCondition(
  conds: readonly Condition[],
  next: Omit<Condition, "lastTransitionTime">,
  now: Date,
): Condition[] {
  validate(next);
  const at = conds.findIndex((c) => c.type === next.type);
  const prev = at >= 0 ? conds[at] : undefined;
  const updated: Condition = {
    type: next.type,
    status: next.status,
    ...(next.observedGeneration === undefined ? {} : { observedGeneration: next.observedGeneration }),
    lastTransitionTime:
      prev !== undefined && prev.status === next.status ? prev.lastTransitionTime : formatConditionTime(now),
    reason: next.reason,
    message: truncateMessage(next.message),
  };
  const out = conds.map((c) => ({ ...c }));
  if (at >= 0) out[at] = updated;
  else out.push(updated);
  return out;
}

/** The first condition of `type`, or undefined. */
export function findCondition(conds: readonly Condition[], type: string): Condition | undefined {
  return conds.find((c) => c.type === type);
}

/**
 * True when condition `type` exists with status "True". With `generation`, also requires
 * observedGeneration === generation, so a stale True written for an older spec does not count.
 */
export function isTrue(conds: readonly Condition[], type: string, generation?: number): boolean {
  const c = findCondition(conds, type);
  if (c?.status !== "True") return false;
  return generation === undefined || c.observedGeneration === generation;
}

/** A new array without any condition of `type` (all duplicates removed). */
export function removeCondition(conds: readonly Condition[], type: string): Condition[] {
  return conds.filter((c) => c.type !== type).map((c) => ({ ...c }));
}

/**
 * True when both lists hold the same conditions, ignoring order: same types, and per type the
 * same status, reason, message, observedGeneration and lastTransitionTime. Use it to skip status
 * writes that would change nothing. Lists with duplicate types compare by multiset.
 */
export function conditionsEqual(a: readonly Condition[], b: readonly Condition[]): boolean {
  if (a.length !== b.length) return false;
  const key = (c: Condition) =>
    JSON.stringify([
      c.type,
      c.status,
      c.observedGeneration ?? null,
      c.lastTransitionTime,
      c.reason,
      c.message,
    ]);
  const ka = a.map(key).sort();
  const kb = b.map(key).sort();
  return ka.every((k, i) => k === kb[i]);
}

function validate(next: Omit<Condition, "lastTransitionTime">): void {
  const bad = (what: string) =>
    new StorageError("invalid", `condition ${JSON.stringify(next.type)}: ${what}`);
  if (typeof next.type !== "string" || next.type.length > MAX_TYPE || !TYPE.test(next.type)) {
    throw bad("type must be a qualified name (e.g. Ready or example.com/Ready)");
  }
  if (!STATUSES.has(next.status))
    throw bad(`status must be True, False or Unknown, got ${String(next.status)}`);
  if (
    typeof next.reason !== "string" ||
    next.reason.length < 1 ||
    next.reason.length > MAX_REASON ||
    !REASON.test(next.reason)
  ) {
    throw bad(
      `reason ${JSON.stringify(next.reason)} must be CamelCase ([A-Za-z][A-Za-z0-9_,:]*), 1..1024 chars`,
    );
  }
  if (typeof next.message !== "string") throw bad("message must be a string");
  const g = next.observedGeneration;
  if (g !== undefined && !(Number.isSafeInteger(g) && g >= 0)) {
    throw bad(`observedGeneration must be a non-negative integer, got ${g}`);
  }
}
