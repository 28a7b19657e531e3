// Finds an NVMe subsystem's controllers and namespace block devices in sysfs, by subsystem NQN and
// namespace UUID/NGUID: /sys/class/nvme-subsystem/*/subsysnqn -> head disks (multipath) or the
// controllers' disks (no multipath) -> /sys/block/<disk>/{uuid,nguid}. Never globs /dev.
import { StorageError } from "../../lib/errors.ts";
import type { HostFs } from "../../lib/fs.ts";
import { namespaceIdDigits } from "./nvme-initiator.ts";

export const SUBSYSTEM_CLASS = "/sys/class/nvme-subsystem";
export const CONTROLLER_CLASS = "/sys/class/nvme";

// libnvme's filters: visible disks are nvme<a>n<b>; nvme<a>c<b>n<c> are hidden per-path disks.
const DISK = /^nvme\d+n\d+$/;
const CONTROLLER = /^nvme\d+$/;

async function readAttr(fs: HostFs, path: string): Promise<string | undefined> {
  try {
    return (await fs.readFile(path)).trim();
  } catch {
    return undefined;
  }
}

async function listDir(fs: HostFs, path: string): Promise<string[]> {
  try {
    return await fs.readdir(path);
  } catch {
    return [];
  }
}

/** The sysfs directory of the subsystem whose subsysnqn is `nqn`, or undefined. */
export async function findSubsystemDir(fs: HostFs, nqn: string): Promise<string | undefined> {
  for (const name of (await listDir(fs, SUBSYSTEM_CLASS)).sort()) {
    const dir = `${SUBSYSTEM_CLASS}/${name}`;
    if ((await readAttr(fs, `${dir}/subsysnqn`)) === nqn) return dir;
  }
  return undefined;
}

/** Controller names (nvmeX) that belong to the subsystem at `subsysDir`. */
export async function subsystemControllers(fs: HostFs, subsysDir: string): Promise<string[]> {
  return (await listDir(fs, subsysDir)).filter((n) => CONTROLLER.test(n)).sort();
}

/**
 * Visible namespace disks of the subsystem: with native multipath the head disks live in the
 * subsystem directory; without it each controller directory holds its own disks.
 */
export async function subsystemDisks(fs: HostFs, subsysDir: string): Promise<string[]> {
  const heads = (await listDir(fs, subsysDir)).filter((n) => DISK.test(n));
  if (heads.length > 0) return heads.sort();
  const disks: string[] = [];
  for (const ctrl of await subsystemControllers(fs, subsysDir)) {
    for (const n of await listDir(fs, `${subsysDir}/${ctrl}`)) if (DISK.test(n)) disks.push(n);
  }
  return [...new Set(disks)].sort();
}

/**
 * The disk name (e.g. "nvme3n1") of subsystem `nqn`'s namespace with UUID or NGUID `namespaceId`,
 * or its only namespace when no id is given. Undefined while the subsystem or a matching disk is
 * not visible. The trailing number of a disk name is an instance, not the NSID, which is why
 * identity comes from the disk's own uuid/nguid attributes. StorageError "invalid" for an id
 * that is not a UUID/NGUID, "precondition" for several namespaces and no id.
 */
export async function findNamespaceDisk(
  fs: HostFs,
  nqn: string,
  namespaceId?: string,
): Promise<string | undefined> {
  const want = namespaceId === undefined ? undefined : namespaceIdDigits(namespaceId);
  if (namespaceId !== undefined && want === undefined) {
    throw new StorageError("invalid", `namespace id ${JSON.stringify(namespaceId)} is not a UUID or NGUID`);
  }
  const dir = await findSubsystemDir(fs, nqn);
  if (dir === undefined) return undefined;
  const disks = await subsystemDisks(fs, dir);
  if (want === undefined) {
    if (disks.length > 1) {
      throw new StorageError(
        "precondition",
        `subsystem ${nqn} has ${disks.length} namespaces (${disks.join(", ")}) and no namespace UUID was given`,
      );
    }
    return disks[0];
  }
  for (const disk of disks) {
    for (const attr of ["uuid", "nguid"]) {
      const value = await readAttr(fs, `/sys/block/${disk}/${attr}`);
      if (value !== undefined && namespaceIdDigits(value) === want) return disk;
    }
  }
  return undefined;
}
