// The DPU's filesystem operations for Filesystem volumes, as a port: probe a block device (blkid),
// format it (mkfs), mount and unmount it, read the mount table. The host implementation runs
// util-linux, e2fsprogs and xfsprogs through Exec and reads /proc/self/mountinfo through HostFs.

import { StorageError } from "../../lib/errors.ts";
import { type Exec, runChecked } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { blkidArgv, type DeviceContent, interpretBlkid } from "../../lib/host/blkid.ts";
import { mountArgv } from "../../lib/host/mount-argv.ts";
import type { FsType } from "./request.ts";

/** One line of the mount table. */
export interface MountEntry {
  readonly mountPoint: string;
  readonly fsType: string;
  readonly source: string;
}

/**
 * Host mounts and block devices. Calls on different paths may run concurrently; callers serialise
 * calls on one path. Failures are StorageError: "internal" for a command that failed, "timeout"
 * for one that outlived its deadline, "unavailable" for a device that cannot be read.
 */
export interface HostFilesystem {
  /** The whole mount table, in kernel order. */
  mounts(): Promise<MountEntry[]>;
  /** What the device holds; "unavailable" when it cannot be read (blank is only said of a readable device). */
  probe(device: string): Promise<DeviceContent>;
  /** Creates a filesystem on a device the caller has found blank. */
  format(device: string, fsType: FsType): Promise<void>;
  mount(device: string, dir: string, fsType: FsType, readonly: boolean): Promise<void>;
  /** Unmounts whatever is mounted on `dir` (the top mount). */
  unmount(dir: string): Promise<void>;
  /** Creates `dir` and missing parents. */
  ensureDir(dir: string): Promise<void>;
  /** Removes the empty directory `dir`; absent is fine. */
  removeDir(dir: string): Promise<void>;
}

/** Decodes mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134 backslash). */
function unescapeMountinfo(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
}

/**
 * Parses /proc/self/mountinfo. Pure. Lines that do not have the documented shape (id, parent,
 * major:minor, root, mount point, options, optional fields, "-", type, source, super options) are
 * skipped rather than guessed at.
 */
export function parseMountinfo(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split("\n")) {
    const f = line.split(" ");
    const sep = f.indexOf("-", 6);
    if (f.length < 10 || sep < 0 || sep + 2 >= f.length) continue;
    out.push({
      mountPoint: unescapeMountinfo(f[4] as string),
      fsType: f[sep + 1] as string,
      source: unescapeMountinfo(f[sep + 2] as string),
    });
  }
  return out;
}

/** argv that formats `device`. Discards are skipped: a thin volume is already zero, and discarding a large one over NBD takes minutes. */
export function mkfsArgv(device: string, fsType: FsType): string[] {
  return fsType === "ext4"
    ? ["mkfs.ext4", "-q", "-E", "nodiscard", device]
    : ["mkfs.xfs", "-q", "-K", device];
}

export interface HostFilesystemOptions {
  exec: Exec;
  /** For /proc/self/mountinfo and directories. */
  fs: HostFs;
  /** Deadline of each command; mkfs of a large volume takes a while. Default 300 s. */
  commandTimeoutMs?: number;
}

/** HostFilesystem on the host's tools. */
export function hostFilesystem(o: HostFilesystemOptions): HostFilesystem {
  const timeoutMs = o.commandTimeoutMs ?? 300_000;
  const run = (argv: string[]) => runChecked(o.exec, argv, { timeoutMs });
  return {
    async mounts() {
      return parseMountinfo(await o.fs.readFile("/proc/self/mountinfo"));
    },
    async probe(device) {
      // blkid says "nothing found" for a device it cannot read: only a device that just served a
      // read may be called blank, or a dead path would be formatted on its return.
      const read = await o.exec.run(
        ["dd", `if=${device}`, "of=/dev/null", "bs=4096", "count=1", "iflag=direct", "status=none"],
        { timeoutMs },
      );
      if (read.code !== 0) {
        throw new StorageError(
          "unavailable",
          `cannot read ${device}: ${(read.stderr || read.stdout).trim().slice(0, 300)}`,
        );
      }
      return interpretBlkid(await o.exec.run(blkidArgv(device), { timeoutMs }));
    },
    async format(device, fsType) {
      await run(mkfsArgv(device, fsType));
    },
    async mount(device, dir, fsType, readonly) {
      await run(mountArgv(device, dir, fsType, readonly ? ["ro"] : []));
    },
    async unmount(dir) {
      await run(["umount", dir]);
    },
    async ensureDir(dir) {
      const parts = dir.split("/").filter(Boolean);
      let path = "";
      for (const p of parts) {
        path += `/${p}`;
        if (await o.fs.isDirectory(path)) continue;
        try {
          await o.fs.mkdir(path);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
        }
      }
    },
    async removeDir(dir) {
      try {
        await o.fs.rmdir(dir);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
        throw new StorageError("internal", `cannot remove ${dir}: ${(err as Error).message}`, { cause: err });
      }
    },
  };
}
