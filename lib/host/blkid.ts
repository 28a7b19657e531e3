// What a block device holds, from low-level `blkid -p -o export` (KEY=value lines; exit 2 when
// nothing was found, 8 when probing was ambiguous). Pure; the caller decides when to trust "blank".
// Shared by the CSI node and the DPU plugin, which both format only what is provably blank.
import { StorageError } from "../errors.ts";
import type { ExecResult } from "../exec.ts";

/** argv probing `device` for filesystems, RAID/LVM/crypto signatures and partition tables. */
export function blkidArgv(device: string): string[] {
  return ["blkid", "-p", "-o", "export", device];
}

/** The verdict of a probe. */
export type DeviceContent =
  /** No signature at all (only meaningful once the device is known to be readable). */
  | { readonly kind: "blank" }
  /** A filesystem blkid recognises, e.g. "ext4", "xfs". */
  | { readonly kind: "filesystem"; readonly fsType: string }
  /**
   * Something that is not a mountable filesystem we could keep: partition table, LVM, swap,
   * LUKS... `description` reads after "holds", e.g. "a gpt partition table".
   */
  | { readonly kind: "other"; readonly description: string };

/** KEY=value lines into a map; blank and malformed lines are skipped. */
export function parseExport(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of text.split("\n")) {
    const eq = line.indexOf("=");
    if (eq > 0) out.set(line.slice(0, eq).trim(), line.slice(eq + 1).trim());
  }
  return out;
}

/**
 * Interprets a finished blkid run. Exit 2 is "nothing found", which blkid also answers for a
 * device it could not read: the caller must establish readability before formatting on "blank".
 * Exit 8 (ambiguous: several signatures) is "other", never blank; so is any signature that is not
 * a filesystem (RAID member, LVM, LUKS, swap, a partition table) and one blkid cannot name.
 * Throws StorageError "internal" for any other failure.
 */
export function interpretBlkid(r: ExecResult): DeviceContent {
  if (r.code === 2) return { kind: "blank" };
  if (r.code === 8) return { kind: "other", description: "ambiguous signatures (blkid exit 8)" };
  if (r.code !== 0) {
    throw new StorageError(
      "internal",
      `blkid exited ${r.code}: ${(r.stderr || r.stdout).trim().slice(0, 500)}`,
    );
  }
  const kv = parseExport(r.stdout);
  const type = kv.get("TYPE");
  const usage = kv.get("USAGE");
  // swap says USAGE=other, but an old blkid without USAGE must not make it a filesystem either.
  if (type !== undefined && (usage === undefined || usage === "filesystem") && type !== "swap")
    return { kind: "filesystem", fsType: type };
  if (type !== undefined)
    return { kind: "other", description: `a ${type} signature${usage ? ` (${usage})` : ""}` };
  const pt = kv.get("PTTYPE");
  if (pt !== undefined) return { kind: "other", description: `a ${pt} partition table` };
  // Exit 0 with no type is a signature blkid could not name; treat it as data, not blank.
  return { kind: "other", description: `an unrecognised signature (${r.stdout.trim().slice(0, 100)})` };
}
