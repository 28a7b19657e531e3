// Keyset pagination for ListVolumes: entries sorted by key, a page ends after max_entries, and the
// next token names the last key returned. Deleting or adding volumes between pages never repeats
// an entry, and a token stays valid when its own volume is gone. Pure.
import { aborted, invalidArgument } from "../errors.ts";

const PREFIX = "lv1:";

/** The opaque token that resumes after `lastKey`. */
export function encodeToken(lastKey: string): string {
  return Buffer.from(`${PREFIX}${lastKey}`, "utf8").toString("base64url");
}

/**
 * The key a token resumes after. A token this driver did not issue is ABORTED, as CSI asks for
 * ("invalid starting_token"): the CO restarts the listing from the beginning.
 */
export function decodeToken(token: string): string {
  const bad = () =>
    aborted(`starting_token ${JSON.stringify(token.slice(0, 64))} was not issued by this driver`);
  if (!/^[A-Za-z0-9_-]+$/.test(token)) throw bad();
  const text = Buffer.from(token, "base64url").toString("utf8");
  if (!text.startsWith(PREFIX) || text.length === PREFIX.length) throw bad();
  // base64url decoding ignores stray bits; a token must round-trip exactly.
  if (encodeToken(text.slice(PREFIX.length)) !== token) throw bad();
  return text.slice(PREFIX.length);
}

export interface Page<T> {
  entries: T[];
  /** Empty when the listing is complete. */
  nextToken: string;
}

/**
 * One page of `items` (any order; sorted here by `keyOf`). max_entries 0 means "all"; negative
 * is INVALID_ARGUMENT; a bad token is ABORTED.
 */
export function paginate<T>(
  items: readonly T[],
  keyOf: (t: T) => string,
  maxEntries: number,
  startingToken: string,
): Page<T> {
  if (maxEntries < 0) throw invalidArgument(`max_entries must not be negative (${maxEntries})`);
  const after = startingToken === "" ? undefined : decodeToken(startingToken);
  const sorted = [...items].sort((a, b) => {
    const ka = keyOf(a);
    const kb = keyOf(b);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  });
  const rest = after === undefined ? sorted : sorted.filter((t) => keyOf(t) > after);
  if (maxEntries === 0 || rest.length <= maxEntries) return { entries: rest, nextToken: "" };
  const entries = rest.slice(0, maxEntries);
  return { entries, nextToken: encodeToken(keyOf(entries[entries.length - 1] as T)) };
}
