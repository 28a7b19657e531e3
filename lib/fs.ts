// Host filesystem access as a port with a configurable root, so /sys, /dev and
// /sys/kernel/config can be a directory tree in tests and in the lab. Paths given to a HostFs are
// absolute host paths ("/sys/class/nvme"); the root is prepended.
import * as fsp from "node:fs/promises";
import { join } from "node:path";

export interface HostFs {
  /** The root every path is resolved under ("/" in production). */
  readonly root: string;
  readFile(path: string): Promise<string>;
  /** Writes the whole value, as the kernel expects for sysfs and configfs attributes. */
  writeFile(path: string, data: string): Promise<void>;
  readdir(path: string): Promise<string[]>;
  /** Target of a symlink, as stored. */
  readlink(path: string): Promise<string>;
  symlink(target: string, path: string): Promise<void>;
  mkdir(path: string): Promise<void>;
  rmdir(path: string): Promise<void>;
  unlink(path: string): Promise<void>;
  exists(path: string): Promise<boolean>;
  isDirectory(path: string): Promise<boolean>;
}

/** A HostFs over node:fs under `root`. Symlink targets that are absolute are rooted as well. */
export function hostFs(root = "/"): HostFs {
  const at = (p: string) => (root === "/" ? p : join(root, p));
  return {
    root,
    readFile: (p) => fsp.readFile(at(p), "utf8"),
    writeFile: (p, d) => fsp.writeFile(at(p), d),
    readdir: (p) => fsp.readdir(at(p)),
    readlink: (p) => fsp.readlink(at(p)),
    symlink: (t, p) => fsp.symlink(t.startsWith("/") ? at(t) : t, at(p)),
    mkdir: async (p) => {
      await fsp.mkdir(at(p));
    },
    rmdir: (p) => fsp.rmdir(at(p)),
    unlink: (p) => fsp.unlink(at(p)),
    exists: async (p) => {
      try {
        await fsp.lstat(at(p));
        return true;
      } catch {
        return false;
      }
    },
    isDirectory: async (p) => {
      try {
        return (await fsp.stat(at(p))).isDirectory();
      } catch {
        return false;
      }
    },
  };
}
