// Which block devices are in use by the host: `lsblk -J -o NAME,MOUNTPOINTS` parsed with valibot.
// A disk counts as mounted when it, a partition on it, or anything stacked on it has a mount
// point (swap shows as "[SWAP]"), so a drive holding the OS or any filesystem is never advertised.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";
import { type Exec, runChecked } from "../../lib/exec.ts";

/** The command, exactly; MOUNTPOINTS (util-linux >= 2.37) lists every mount of a bind-mounted device. */
export const LSBLK_ARGV: readonly string[] = ["lsblk", "-J", "-o", "NAME,MOUNTPOINTS"];

interface LsblkDevice {
  name: string;
  mountpoints?: (string | null)[] | null;
  /** What lsblk prints for MOUNTPOINT (singular); accepted so an older column choice still parses. */
  mountpoint?: string | null;
  children?: LsblkDevice[];
}

const LsblkDeviceSchema: v.GenericSchema<LsblkDevice> = v.looseObject({
  name: v.pipe(v.string(), v.minLength(1)),
  mountpoints: v.optional(v.nullable(v.array(v.nullable(v.string())))),
  mountpoint: v.optional(v.nullable(v.string())),
  children: v.optional(v.array(v.lazy(() => LsblkDeviceSchema))),
});

const LsblkSchema = v.looseObject({ blockdevices: v.array(LsblkDeviceSchema) });

function hasMount(d: LsblkDevice): boolean {
  const points = [...(d.mountpoints ?? []), d.mountpoint ?? null];
  if (points.some((p) => typeof p === "string" && p.length > 0)) return true;
  return (d.children ?? []).some(hasMount);
}

/**
 * Names of top-level block devices (disks) with a mount anywhere in their subtree. Throws
 * StorageError("internal") when the text is not lsblk's JSON. Pure.
 */
export function parseMountedDisks(json: string): Set<string> {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new StorageError("internal", `lsblk printed something that is not JSON`, { cause: err });
  }
  const r = v.safeParse(LsblkSchema, raw);
  if (!r.success) {
    const issue = r.issues[0];
    throw new StorageError(
      "internal",
      `lsblk JSON has an unexpected shape at ${issue ? (v.getDotPath(issue) ?? "<root>") : "?"}: ${issue?.message}`,
    );
  }
  return new Set(r.output.blockdevices.filter(hasMount).map((d) => d.name));
}

/** Runs lsblk through `exec` and returns the mounted disks. Rejects when lsblk fails or prints garbage. */
export async function mountedDisks(exec: Exec, timeoutMs = 10_000): Promise<Set<string>> {
  return parseMountedDisks(await runChecked(exec, LSBLK_ARGV, { timeoutMs }));
}
