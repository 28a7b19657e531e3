// The StorageClass parameter mkfsOptions: extra mkfs.ext4 / mkfs.xfs arguments, checked against an
// allow-list per filesystem (geometry and feature choices only: nothing that forces over an
// existing signature, names a device or file, or changes what is formatted). Pure.
import { StorageError } from "./errors.ts";

/** Filesystems mkfsOptions can be given for. */
export type MkfsFsType = "ext4" | "xfs";

type Check = (value: string) => boolean;

const int = (min: number, max: number): Check => {
  return (s) => /^\d{1,12}$/.test(s) && Number(s) >= min && Number(s) <= max;
};
const oneOf =
  (...values: string[]): Check =>
  (s) =>
    values.includes(s);
const bit = oneOf("0", "1");
/** A size as mkfs.xfs reads it: digits with an optional unit (k, m, g; or s for sectors, b blocks). */
const xfsSize: Check = (s) => /^\d{1,12}[kmgsb]?$/.test(s);
const powerOfTwo = (min: number, max: number): Check => {
  return (s) => int(min, max)(s) && (Number(s) & (Number(s) - 1)) === 0;
};

/** A comma list of sub-options "name=value" (or a bare flag when the check is undefined). */
function subOptions(allowed: Readonly<Record<string, Check | undefined>>): Check {
  return (s) => {
    const seen = new Set<string>();
    return s.split(",").every((part) => {
      const eq = part.indexOf("=");
      const name = eq < 0 ? part : part.slice(0, eq);
      if (seen.has(name) || !Object.hasOwn(allowed, name)) return false;
      seen.add(name);
      const check = allowed[name];
      return check === undefined ? eq < 0 : eq > 0 && check(part.slice(eq + 1));
    });
  };
}

const EXT4_FEATURES = new Set([
  "64bit",
  "dir_index",
  "extent",
  "huge_file",
  "metadata_csum",
  "orphan_file",
  "project",
  "quota",
  "sparse_super2",
]);

/** Options that take a value (a Check) or none (null), per filesystem. */
const ALLOWED: Readonly<Record<MkfsFsType, Readonly<Record<string, Check | null>>>> = {
  ext4: {
    "-b": oneOf("1024", "2048", "4096"),
    "-i": int(1024, 67_108_864),
    "-I": oneOf("128", "256", "512", "1024"),
    "-m": int(0, 50),
    "-N": int(1, 4_294_967_295),
    "-J": subOptions({ size: int(1, 10_240) }),
    "-E": subOptions({
      stride: int(1, 4_194_304),
      stripe_width: int(1, 4_194_304),
      lazy_itable_init: bit,
      lazy_journal_init: bit,
      packed_meta_blocks: bit,
      discard: undefined,
      nodiscard: undefined,
    }),
    "-O": (s) => s.split(",").every((f) => EXT4_FEATURES.has(f.replace(/^\^/, ""))),
  },
  xfs: {
    "-b": subOptions({ size: powerOfTwo(512, 65_536) }),
    "-i": subOptions({ size: powerOfTwo(256, 2048), maxpct: int(0, 100) }),
    "-d": subOptions({ su: xfsSize, sw: int(1, 65_536), agcount: int(1, 1_048_576) }),
    "-l": subOptions({ size: xfsSize }),
    "-n": subOptions({ size: powerOfTwo(512, 65_536) }),
    "-m": subOptions({ crc: bit, finobt: bit, reflink: bit, rmapbt: bit, bigtime: bit, inobtcount: bit }),
    "-K": null,
  },
};

/** The option names allowed for `fsType`, for messages and docs. */
export function allowedMkfsOptions(fsType: MkfsFsType): string[] {
  return Object.keys(ALLOWED[fsType]);
}

/**
 * The mkfs arguments `raw` stands for (whitespace-separated; an option's value is the next word),
 * or StorageError "invalid" naming the first option or value outside the allow-list, a repeated
 * option, or an option missing its value. An empty string is no arguments.
 */
export function parseMkfsOptions(raw: string, fsType: MkfsFsType): string[] {
  const words = raw.trim() === "" ? [] : raw.trim().split(/\s+/);
  const allowed = ALLOWED[fsType];
  const out: string[] = [];
  const seen = new Set<string>();
  const refuse = (why: string) =>
    new StorageError(
      "invalid",
      `mkfsOptions for ${fsType}: ${why} (allowed: ${allowedMkfsOptions(fsType).join(" ")})`,
    );
  for (let i = 0; i < words.length; i++) {
    const opt = words[i] as string;
    if (!Object.hasOwn(allowed, opt)) throw refuse(`option ${JSON.stringify(opt)} is not allowed`);
    if (seen.has(opt)) throw refuse(`option ${opt} is given twice`);
    seen.add(opt);
    const check = allowed[opt];
    out.push(opt);
    if (check === null || check === undefined) continue;
    const value = words[++i];
    if (value === undefined) throw refuse(`option ${opt} needs a value`);
    if (!check(value)) throw refuse(`value ${JSON.stringify(value)} of ${opt} is not allowed`);
    out.push(value);
  }
  return out;
}
