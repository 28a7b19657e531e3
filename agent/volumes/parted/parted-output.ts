// Parser for `parted --machine --script <dev> unit B print [free]`: the disk line, partitions and
// free regions, with every number in bytes. Validated with valibot; anything unexpected is an error.
import * as v from "valibot";
import { StorageError } from "../../../lib/errors.ts";

export interface PartedDisk {
  path: string;
  sizeBytes: number;
  transport: string;
  logicalSectorSize: number;
  physicalSectorSize: number;
  /** "gpt", "msdos", ...; "unknown" when there is no label, "loop" when a filesystem fills the disk. */
  table: string;
  model: string;
  flags: string;
}

export interface PartedPartition {
  number: number;
  /** First byte. */
  start: number;
  /** Last byte (inclusive), as parted prints it. */
  end: number;
  sizeBytes: number;
  filesystem: string;
  /** GPT partition name (the type column on msdos labels). */
  name: string;
  flags: string[];
}

/** Unallocated space inside the usable area, from `print free`; end is inclusive. */
export interface FreeRegion {
  start: number;
  end: number;
  sizeBytes: number;
}

export interface PartedTable {
  disk: PartedDisk;
  partitions: PartedPartition[];
  free: FreeRegion[];
}

const Count = v.pipe(v.string(), v.regex(/^\d+$/, "expected a number"), v.transform(Number), v.safeInteger());
const Bytes = v.pipe(
  v.string(),
  v.regex(/^\d+B$/, "expected a byte count like 1048576B"),
  v.transform((s) => Number(s.slice(0, -1))),
  v.safeInteger(),
);

const DiskFields = v.pipe(
  v.tuple([
    v.pipe(v.string(), v.nonEmpty()),
    Bytes,
    v.string(),
    Count,
    Count,
    v.string(),
    v.string(),
    v.string(),
  ]),
  v.transform(
    (f): PartedDisk => ({
      path: f[0],
      sizeBytes: f[1],
      transport: f[2],
      logicalSectorSize: f[3],
      physicalSectorSize: f[4],
      table: f[5],
      model: f[6],
      flags: f[7],
    }),
  ),
);

const PartitionFields = v.pipe(
  v.tuple([Count, Bytes, Bytes, Bytes, v.string(), v.string(), v.string()]),
  v.check((f) => f[2] >= f[1] && f[3] === f[2] - f[1] + 1, "start, end and size disagree"),
  v.transform(
    (f): PartedPartition => ({
      number: f[0],
      start: f[1],
      end: f[2],
      sizeBytes: f[3],
      filesystem: f[4],
      name: f[5],
      flags: f[6] === "" ? [] : f[6].split(", "),
    }),
  ),
);

const FreeFields = v.pipe(
  v.tuple([Count, Bytes, Bytes, Bytes, v.literal("free")]),
  v.transform((f): FreeRegion => ({ start: f[1], end: f[2], sizeBytes: f[3] })),
);

/**
 * Splits one machine-mode record into fields. parted ends records with ";" and escapes ":" and "\"
 * inside the path, model and partition name with a backslash.
 */
export function splitRecord(line: string): string[] {
  const body = line.endsWith(";") ? line.slice(0, -1) : line;
  const fields: string[] = [];
  let cur = "";
  for (let i = 0; i < body.length; i++) {
    const c = body[i] as string;
    if (c === "\\" && i + 1 < body.length) cur += body[++i];
    else if (c === ":") {
      fields.push(cur);
      cur = "";
    } else cur += c;
  }
  fields.push(cur);
  return fields;
}

/**
 * Parses the stdout of `parted -m -s <dev> unit B print` (with or without `free`). Pure. A disk
 * without a label still parses (table "unknown"; parted exits 1 then, which the caller decides
 * about). Throws StorageError("internal") quoting the offending line for anything else, since
 * acting on a misread partition table could destroy data.
 */
export function parsePartedPrint(stdout: string): PartedTable {
  function fail(why: string, line?: string): never {
    throw new StorageError(
      "internal",
      `unexpected parted output: ${why}${line ? ` in ${JSON.stringify(line)}` : ""}`,
      {
        details: { stdout: stdout.slice(0, 2000) },
      },
    );
  }
  const lines = stdout
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "");
  if (lines[0] !== "BYT;") fail(`expected the "BYT;" unit header, got ${JSON.stringify(lines[0] ?? "")}`);
  const diskLine = lines[1] ?? fail("no disk line");
  const diskFields = splitRecord(diskLine);
  // parted before 3.2 printed no disk-flags field.
  if (diskFields.length === 7) diskFields.push("");
  const disk = v.safeParse(DiskFields, diskFields);
  if (!disk.success) fail(v.summarize(disk.issues), diskLine);
  const partitions: PartedPartition[] = [];
  const free: FreeRegion[] = [];
  for (const line of lines.slice(2)) {
    const fields = splitRecord(line);
    if (fields.length === 5 && fields[4] === "free") {
      const r = v.safeParse(FreeFields, fields);
      if (!r.success) fail(v.summarize(r.issues), line);
      free.push(r.output);
      continue;
    }
    const r = v.safeParse(PartitionFields, fields);
    if (!r.success) fail(v.summarize(r.issues), line);
    partitions.push(r.output);
  }
  return { disk: disk.output, partitions, free };
}
