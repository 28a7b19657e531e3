// Which file extents the host's loop devices map, read from sysfs: the emulator asks before it
// moves a thick lvol's bytes, because a loop device of the lab initiator reads and writes them in
// place and would silently keep using the old location.
import { readdirSync, readFileSync, realpathSync } from "node:fs";
import { join } from "node:path";
import type { FileExtent } from "./block-io.ts";
import type { ExtentInUse } from "./lvol-store.ts";

/**
 * An ExtentInUse over `/sys/block/loop*\/loop/{backing_file,offset,sizelimit}`: true when an
 * attached loop device over the same file (compared by real path) overlaps the extent. Hosts
 * without sysfs or loop devices answer false. Synchronous and cheap (a few small reads per loop).
 */
export function sysfsLoopProbe(sysBlock = "/sys/block"): ExtentInUse {
  return (extent: FileExtent) => {
    let file: string;
    let names: string[];
    try {
      file = realpathSync(extent.path);
      names = readdirSync(sysBlock).filter((n) => /^loop\d+$/.test(n));
    } catch {
      return false;
    }
    for (const name of names) {
      const dir = join(sysBlock, name, "loop");
      let backing: string;
      let offset: number;
      let limit: number;
      try {
        backing = readFileSync(join(dir, "backing_file"), "utf8").replace(/\n$/, "");
        offset = Number(readFileSync(join(dir, "offset"), "utf8").trim());
        limit = Number(readFileSync(join(dir, "sizelimit"), "utf8").trim());
      } catch {
        continue; // not attached, or detached while we looked
      }
      if (backing !== file) continue;
      const end = limit > 0 ? offset + limit : Number.POSITIVE_INFINITY;
      if (offset < extent.offset + extent.length && extent.offset < end) return true;
    }
    return false;
  };
}
