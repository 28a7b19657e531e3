// Parser for `wipefs --no-act --json <dev>`: which on-disk signatures (filesystems, partition
// tables, RAID or LVM headers) a device carries, so a disk that is not blank is never labelled.
import * as v from "valibot";
import { StorageError } from "../../../lib/errors.ts";

export interface Signature {
  type: string;
  offset: string;
}

const WipefsJson = v.object({
  signatures: v.array(v.object({ type: v.string(), offset: v.string() })),
});

/**
 * The signatures wipefs reports. Pure. Empty output (what some util-linux versions print for a
 * blank device) means none. Malformed output is StorageError("internal").
 */
export function parseWipefs(stdout: string): Signature[] {
  if (stdout.trim() === "") return [];
  let json: unknown;
  try {
    json = JSON.parse(stdout);
  } catch (err) {
    throw new StorageError("internal", `wipefs printed something that is not JSON: ${stdout.slice(0, 200)}`, {
      cause: err,
    });
  }
  const r = v.safeParse(WipefsJson, json);
  if (!r.success) throw new StorageError("internal", `unexpected wipefs output: ${v.summarize(r.issues)}`);
  return r.output.signatures.map((s) => ({ type: s.type, offset: s.offset }));
}
