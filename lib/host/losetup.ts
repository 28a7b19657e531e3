// Loop devices through util-linux losetup: the argv to attach and detach, and the parser of
// `losetup --list --json`. Used for read-only views of raw block volumes, and by the lab's
// initiator that stands loop devices in for NVMe namespaces.
import * as v from "valibot";
import { StorageError } from "../errors.ts";

/** One attached loop device. */
export interface LoopDevice {
  /** "/dev/loopN". */
  readonly name: string;
  /** The backing file or device; losetup appends " (deleted)" when the file was unlinked. */
  readonly backFile: string;
  readonly readonly: boolean;
  readonly offset: number;
  /** 0 when the device runs to the end of the file. */
  readonly sizeLimit: number;
}

export const LOSETUP_LIST_ARGV: readonly string[] = [
  "losetup",
  "--list",
  "--json",
  "--output",
  "NAME,BACK-FILE,RO,OFFSET,SIZELIMIT",
];

/**
 * argv attaching `file` (or a device) to the first free loop device and printing its name. An
 * offset or size limit of 0 is left out, so a device over a whole file follows the file's size
 * on `losetup --set-capacity`.
 */
export function attachArgv(
  file: string,
  opts: { readonly?: boolean; offset?: number; sizeLimit?: number } = {},
): string[] {
  const argv = ["losetup", "--find", "--show"];
  if (opts.readonly) argv.push("--read-only");
  if (opts.offset) argv.push("--offset", String(opts.offset));
  if (opts.sizeLimit) argv.push("--sizelimit", String(opts.sizeLimit));
  argv.push(file);
  return argv;
}

export function detachArgv(device: string): string[] {
  return ["losetup", "--detach", device];
}

export function setCapacityArgv(device: string): string[] {
  return ["losetup", "--set-capacity", device];
}

// losetup prints numbers as numbers and, depending on version, booleans as true/false or "1"/"0".
const flag = v.union([
  v.boolean(),
  v.pipe(
    v.union([v.string(), v.number()]),
    v.transform((x) => String(x) === "1"),
  ),
]);
const count = v.union([
  v.pipe(v.number(), v.integer(), v.minValue(0)),
  v.pipe(v.string(), v.regex(/^\d+$/), v.transform(Number)),
]);

const ListSchema = v.object({
  loopdevices: v.array(
    v.looseObject({
      name: v.pipe(v.string(), v.startsWith("/dev/")),
      "back-file": v.nullable(v.string()),
      ro: flag,
      offset: count,
      sizelimit: count,
    }),
  ),
});

/** Parses LOSETUP_LIST_ARGV's output; empty output means no loop device is attached. */
export function parseLosetupList(text: string): LoopDevice[] {
  if (text.trim() === "") return [];
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new StorageError("internal", "losetup --list printed something that is not JSON", { cause: err });
  }
  const r = v.safeParse(ListSchema, raw);
  if (!r.success) {
    throw new StorageError(
      "internal",
      `losetup --list JSON has an unexpected shape: ${r.issues[0]?.message}`,
    );
  }
  return r.output.loopdevices.map((d) => ({
    name: d.name,
    backFile: d["back-file"] ?? "",
    readonly: d.ro,
    offset: d.offset,
    sizeLimit: d.sizelimit,
  }));
}

/** The device name losetup --find --show printed; StorageError "internal" for anything else. */
export function parseAttached(stdout: string): string {
  const name = stdout.trim();
  if (!/^\/dev\/loop\d+$/.test(name)) {
    throw new StorageError(
      "internal",
      `losetup --show printed ${JSON.stringify(name.slice(0, 100))}, not a loop device`,
    );
  }
  return name;
}
