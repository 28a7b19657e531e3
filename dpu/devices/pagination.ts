// Keyset pagination for ListDevices: devices sorted by volume id, a page ends after max_entries,
// and the next token names the last volume id returned. Devices added or removed between pages
// never make a page repeat or skip a device that existed throughout. Pure.
import { StorageError } from "../../lib/errors.ts";
import { hasControlChar } from "./request.ts";

const PREFIX = "dpu1:";

/** The opaque token that resumes after `lastKey`. */
export function encodeToken(lastKey: string): string {
  return Buffer.from(`${PREFIX}${lastKey}`, "utf8").toString("base64url");
}

/**
 * The key a token resumes after. A token this plugin did not issue is StorageError "busy"
 * (ABORTED): the caller restarts the listing from the beginning, as CSI's ListVolumes does.
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
  // Volume ids never hold control characters, so no issued token names one.
  if (encodeToken(key) !== token || hasControlChar(key)) throw bad();
  return key;
}

export interface Page<T> {
  readonly entries: T[];
  /** Empty when the listing is complete. */
  readonly nextToken: string;
}

/** Byte-wise order (not locale order), so the same ids sort the same on every plugin instance. */
function compare(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** One page of `items` after `startingToken` ("" = from the start); maxEntries 0 = all. */
export function paginate<T>(
  items: readonly T[],
  keyOf: (t: T) => string,
  maxEntries: number,
  startingToken: string,
): Page<T> {
  const after = startingToken === "" ? undefined : decodeToken(startingToken);
  const sorted = [...items].sort((a, b) => compare(keyOf(a), keyOf(b)));
  const rest = after === undefined ? sorted : sorted.filter((t) => compare(keyOf(t), after) > 0);
  if (maxEntries === 0 || rest.length <= maxEntries) return { entries: rest, nextToken: "" };
  const entries = rest.slice(0, maxEntries);
  return { entries, nextToken: encodeToken(keyOf(entries[entries.length - 1] as T)) };
}
