// Keyset pagination for the List RPCs (CSI ListVolumes/ListSnapshots, DPF ListDevices): entries
// sorted by key in byte order, a page ends after max_entries, and the next token names the last key
// returned. Adding or deleting entries between pages never repeats an entry nor skips one that
// existed throughout, and a token stays valid when its own entry is gone. Pure.
import { StorageError } from "./errors.ts";

const PREFIX = "ks1:";

/** The opaque token that resumes after `lastKey`. */
export function encodeToken(lastKey: string): string {
  return Buffer.from(`${PREFIX}${lastKey}`, "utf8").toString("base64url");
}

/** True when `s` holds an ASCII control character (C0 or DEL); no key of ours does. */
function hasControlChar(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) return true;
  }
  return false;
}

/**
 * The key a token resumes after. A token this plugin did not issue is StorageError "busy"
 * (ABORTED), as CSI asks for an invalid starting_token: the caller restarts the listing.
 */
export function decodeToken(token: string): string {
  const bad = () =>
    new StorageError(
      "busy",
      `starting_token ${JSON.stringify(token.slice(0, 64))} was not issued by this plugin`,
    );
  if (!/^[A-Za-z0-9_-]+$/.test(token)) throw bad();
  const text = Buffer.from(token, "base64url").toString("utf8");
  if (!text.startsWith(PREFIX) || text.length === PREFIX.length) throw bad();
  const key = text.slice(PREFIX.length);
  // base64url decoding ignores stray bits and bad UTF-8 is replaced: a real token round-trips.
  // Names and ids never hold control characters, so no issued token names one.
  if (encodeToken(key) !== token || hasControlChar(key)) throw bad();
  return key;
}

export interface Page<T> {
  readonly entries: T[];
  /** Empty when the listing is complete. */
  readonly nextToken: string;
}

/** Byte-wise UTF-8 order (not UTF-16 or locale order), the same on every instance and language. */
function compare(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/**
 * One page of `items` (any order; sorted here by `keyOf`) after `startingToken` ("" = from the
 * start). maxEntries 0 means "all"; a negative one is StorageError "invalid"; a bad token "busy".
 */
export function paginate<T>(
  items: readonly T[],
  keyOf: (t: T) => string,
  maxEntries: number,
  startingToken: string,
): Page<T> {
  if (maxEntries < 0) throw new StorageError("invalid", `max_entries must not be negative (${maxEntries})`);
  const after = startingToken === "" ? undefined : decodeToken(startingToken);
  const sorted = [...items].sort((a, b) => compare(keyOf(a), keyOf(b)));
  const rest = after === undefined ? sorted : sorted.filter((t) => compare(keyOf(t), after) > 0);
  if (maxEntries === 0 || rest.length <= maxEntries) return { entries: rest, nextToken: "" };
  const entries = rest.slice(0, maxEntries);
  return { entries, nextToken: encodeToken(keyOf(entries[entries.length - 1] as T)) };
}
