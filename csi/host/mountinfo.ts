// Parses /proc/self/mountinfo (proc(5)): one mount per line, with the mount point, the device
// (major:minor), the root of the mount within its filesystem, per-mount options, fs type and
// source. Pure; the octal escapes the kernel uses for space, tab, newline and backslash are undone.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";

export interface MountEntry {
  readonly id: number;
  readonly parentId: number;
  /** "major:minor" of the filesystem's device, e.g. "259:3" (0:N for virtual filesystems). */
  readonly majorMinor: string;
  /**
   * Path within the filesystem that is mounted: "/" for a whole filesystem, deeper for a bind;
   * "net:[<inode>]" and the like for a namespace file bound somewhere (nsfs).
   */
  readonly root: string;
  readonly mountPoint: string;
  /** Per-mount options ("rw", "ro", "nosuid"...). */
  readonly options: readonly string[];
  readonly fsType: string;
  /** Mount source as the kernel keeps it, e.g. "/dev/nvme1n1". */
  readonly source: string;
  readonly superOptions: readonly string[];
  /** True when the mount itself is read-only ("ro" among the per-mount options). */
  readonly readonly: boolean;
}

const EntrySchema = v.object({
  id: v.pipe(v.number(), v.integer(), v.minValue(0)),
  parentId: v.pipe(v.number(), v.integer(), v.minValue(0)),
  majorMinor: v.pipe(v.string(), v.regex(/^\d+:\d+$/, "major:minor expected")),
  // A path, or a pseudo filesystem's dentry name: a bound network namespace (nsfs, as
  // `ip netns add` leaves under /run/netns) shows its root as "net:[4026532178]".
  root: v.pipe(v.string(), v.regex(/^(\/|[a-z_]+:\[\d+\]$)/, "a path or a name like net:[4026532178]")),
  mountPoint: v.pipe(v.string(), v.startsWith("/")),
  options: v.array(v.string()),
  fsType: v.pipe(v.string(), v.minLength(1)),
  source: v.string(),
  superOptions: v.array(v.string()),
  readonly: v.boolean(),
});

/** Undoes the kernel's mangling of " \t\n\\" as \040 \011 \012 \134. */
export function unescapeMountField(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(Number.parseInt(oct, 8)));
}

/** One mountinfo line; throws StorageError "internal" when it does not have mountinfo's shape. */
export function parseMountinfoLine(line: string): MountEntry {
  const fields = line.split(" ");
  const sep = fields.indexOf("-", 6);
  if (sep < 0 || fields.length < sep + 3) {
    throw new StorageError("internal", `mountinfo line has no "-" separator: ${line.slice(0, 200)}`);
  }
  const [id, parentId, majorMinor, root, mountPoint, options] = fields;
  const opts = (options ?? "").split(",");
  const r = v.safeParse(EntrySchema, {
    id: Number(id),
    parentId: Number(parentId),
    majorMinor,
    root: unescapeMountField(root ?? ""),
    mountPoint: unescapeMountField(mountPoint ?? ""),
    options: opts,
    fsType: fields[sep + 1],
    source: unescapeMountField(fields[sep + 2] ?? ""),
    superOptions: (fields[sep + 3] ?? "").split(",").filter((o) => o !== ""),
    readonly: opts.includes("ro"),
  });
  if (!r.success) {
    throw new StorageError(
      "internal",
      `mountinfo line is malformed (${r.issues[0]?.message}): ${line.slice(0, 200)}`,
    );
  }
  return r.output;
}

/** Every mount in mountinfo text, in the kernel's order (a later mount on a path covers earlier ones). */
export function parseMountinfo(text: string): MountEntry[] {
  return text
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map(parseMountinfoLine);
}

/** Mounts whose mount point is exactly `path`, bottom first: the last one is what `path` shows. */
export function mountsAt(entries: readonly MountEntry[], path: string): MountEntry[] {
  return entries.filter((e) => e.mountPoint === path);
}
