// The Mounter port of the CSI node (mount table, mount/bind/unmount, device probing, mkfs, online
// grow, statfs, device sizes) and its host implementation on util-linux, e2fsprogs and xfsprogs
// through Exec, with /proc/self/mountinfo read through HostFs.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";
import { type Exec, type ExecOptions, runChecked } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { blkidArgv, type DeviceContent, interpretBlkid } from "../../lib/host/blkid.ts";
import {
  attachArgv,
  detachArgv,
  LOSETUP_LIST_ARGV,
  parseAttached,
  parseLosetupList,
} from "../../lib/host/losetup.ts";
import { mountArgv } from "../../lib/host/mount-argv.ts";
import { type MountEntry, mountsAt, parseMountinfo } from "./mountinfo.ts";

/** Filesystems the node formats and mounts. */
export type FsType = "ext4" | "xfs";
export const FS_TYPES: readonly FsType[] = ["ext4", "xfs"];

/** statfs of a mounted filesystem, in bytes and inodes. */
export interface FsUsage {
  readonly totalBytes: number;
  readonly availableBytes: number;
  readonly usedBytes: number;
  readonly totalInodes: number;
  readonly freeInodes: number;
  readonly usedInodes: number;
}

/**
 * Host mounts and block devices. Every method may be called concurrently for different paths;
 * callers serialise work on one path. Failures are StorageError ("internal" for a command that
 * failed, "timeout" for one that outlived its deadline, "unavailable" for an unreadable device).
 */
export interface Mounter {
  /** The whole mount table, in kernel order. */
  mounts(): Promise<MountEntry[]>;
  /** Mounts whose mount point is exactly `path`, bottom first (the last is the visible one). */
  mountsAt(path: string): Promise<MountEntry[]>;
  /** Mounts filesystem `fsType` on `device` at directory `target` with `options` (may be empty). */
  mount(device: string, target: string, fsType: FsType, options: readonly string[]): Promise<void>;
  /**
   * Bind-mounts `source` (a directory or a device node) onto `target` (a directory or a file),
   * read-only when asked. A read-only request that cannot be applied leaves nothing mounted.
   */
  bindMount(source: string, target: string, opts: { readonly: boolean }): Promise<void>;
  /** Unmounts the topmost mount at `target`. */
  unmount(target: string): Promise<void>;
  /**
   * Writes the filesystem mounted at `path` out to its device (`sync -f`, syncfs(2)); fails when
   * the writeback reports an error, so data the device never got is not taken for written.
   */
  syncFilesystem(path: string): Promise<void>;
  /**
   * What `device` holds. Reads the device first, so "blank" means readable and without any
   * signature; an unreadable device is StorageError "unavailable", never "blank".
   */
  probe(device: string): Promise<DeviceContent>;
  /**
   * Makes a filesystem on `device` with `extraArgs` (already allow-listed, lib/mkfs-options.ts)
   * after DISTORT's own; refuses (fails) when the tool finds an existing signature.
   */
  mkfs(device: string, fsType: FsType, extraArgs?: readonly string[]): Promise<void>;
  /** Grows the mounted filesystem on `device` (mounted at `mountPoint`) to fill the device. */
  growFs(fsType: FsType, device: string, mountPoint: string): Promise<void>;
  /** Usage of the filesystem mounted at `path`. */
  statfs(path: string): Promise<FsUsage>;
  /** Size of block device `device` in bytes. */
  deviceSize(device: string): Promise<number>;
  /** "major:minor" (decimal) of the block device node at `path`, following symlinks and binds. */
  deviceNumber(path: string): Promise<string>;
  /**
   * A read-only block device showing `device` (a read-only bind mount of a device node does not
   * stop writes through it; a read-only loop device does). Idempotent: an existing read-only view
   * of `device` is returned again.
   */
  readOnlyView(device: string): Promise<string>;
  /** Detaches a view made by readOnlyView(); a view already gone is fine. */
  releaseReadOnlyView(view: string): Promise<void>;
  /**
   * Sets block device `device` read-only in the kernel (`blockdev --setro`, BLKROSET): every
   * later open for writing and every write through it fails, whoever opens it. Idempotent.
   */
  setReadOnly(device: string): Promise<void>;
  /** Undoes setReadOnly() (`blockdev --setrw`). Idempotent. */
  setReadWrite(device: string): Promise<void>;
  /**
   * Makes the filesystem tree at directory `root` usable by group `gid`, as kubelet's fsGroup
   * does: every entry's group becomes `gid` with group read/write (and search on directories),
   * directories get set-group-ID so new entries inherit the group. Skipped, as kubelet's
   * OnRootMismatch policy, when `root` already has that group and set-group-ID.
   */
  applyMountGroup(root: string, gid: number): Promise<void>;
}

/** argv making `fsType` on `device`, without forcing: both tools then refuse to overwrite a signature. */
export function mkfsArgv(fsType: FsType, device: string, extraArgs: readonly string[] = []): string[] {
  // -m0: a volume belongs to one workload; blocks reserved for root would only be lost space.
  return fsType === "ext4" ? ["mkfs.ext4", "-m0", ...extraArgs, device] : ["mkfs.xfs", ...extraArgs, device];
}

/** argv growing a mounted filesystem: resize2fs takes the device, xfs_growfs the mount point. */
export function growFsArgv(fsType: FsType, device: string, mountPoint: string): string[] {
  return fsType === "ext4" ? ["resize2fs", device] : ["xfs_growfs", "-d", mountPoint];
}

/** `stat -f` format: fundamental block size, total, free, available blocks, total and free inodes. */
export const STATFS_FORMAT = "%S %b %f %a %c %d";

const uint = v.pipe(v.string(), v.regex(/^\d+$/, "not a count"), v.transform(Number));
const StatfsSchema = v.tuple([uint, uint, uint, uint, uint, uint]);

/** Parses `stat -f -c STATFS_FORMAT` output into FsUsage. Pure. */
export function parseStatfs(text: string): FsUsage {
  const r = v.safeParse(StatfsSchema, text.trim().split(/\s+/));
  if (!r.success) throw new StorageError("internal", `stat -f printed ${JSON.stringify(text.slice(0, 200))}`);
  const [frsize, blocks, bfree, bavail, files, ffree] = r.output;
  return {
    totalBytes: blocks * frsize,
    availableBytes: bavail * frsize,
    usedBytes: (blocks - bfree) * frsize,
    totalInodes: files,
    freeInodes: ffree,
    usedInodes: files - ffree,
  };
}

/** Parses `stat -L -c %t:%T` (hex major:minor of a device node) into decimal "major:minor". */
export function parseDeviceNumber(text: string): string {
  const m = /^([0-9a-f]+):([0-9a-f]+)$/i.exec(text.trim());
  if (!m)
    throw new StorageError("internal", `stat printed ${JSON.stringify(text.slice(0, 100))}, not major:minor`);
  return `${Number.parseInt(m[1] as string, 16)}:${Number.parseInt(m[2] as string, 16)}`;
}

export interface HostMounterOptions {
  exec: Exec;
  /** Where /proc/self/mountinfo is read; rooted at "/" in production. */
  fs: HostFs;
  /** Deadline of mount, umount, blkid, stat and friends. Default 60 s. */
  commandTimeoutMs?: number;
  /** Deadline of mkfs and filesystem growth, which touch the whole device. Default 10 min. */
  formatTimeoutMs?: number;
}

/** The Mounter on host tools. Stateless apart from its options. */
export class HostMounter implements Mounter {
  readonly #exec: Exec;
  readonly #fs: HostFs;
  readonly #cmd: ExecOptions;
  readonly #format: ExecOptions;

  constructor(opts: HostMounterOptions) {
    this.#exec = opts.exec;
    this.#fs = opts.fs;
    this.#cmd = { timeoutMs: opts.commandTimeoutMs ?? 60_000 };
    this.#format = { timeoutMs: opts.formatTimeoutMs ?? 600_000 };
  }

  async mounts(): Promise<MountEntry[]> {
    return parseMountinfo(await this.#fs.readFile("/proc/self/mountinfo"));
  }

  async mountsAt(path: string): Promise<MountEntry[]> {
    return mountsAt(await this.mounts(), path);
  }

  async mount(device: string, target: string, fsType: FsType, options: readonly string[]): Promise<void> {
    await runChecked(this.#exec, mountArgv(device, target, fsType, options), this.#cmd);
  }

  async bindMount(source: string, target: string, opts: { readonly: boolean }): Promise<void> {
    await runChecked(this.#exec, ["mount", "--bind", source, target], this.#cmd);
    if (!opts.readonly) return;
    // A bind mount takes its flags from a remount; until then it is as writable as its source.
    try {
      await runChecked(this.#exec, ["mount", "-o", "remount,bind,ro", target], this.#cmd);
    } catch (err) {
      await this.#exec.run(["umount", target], this.#cmd).catch(() => undefined);
      throw err;
    }
  }

  async unmount(target: string): Promise<void> {
    await runChecked(this.#exec, ["umount", target], this.#cmd);
  }

  async syncFilesystem(path: string): Promise<void> {
    await runChecked(this.#exec, ["sync", "-f", path], this.#cmd);
  }

  async probe(device: string): Promise<DeviceContent> {
    // One direct read: blkid answers "nothing found" for a device it cannot read, too.
    const read = await this.#exec.run(
      ["dd", `if=${device}`, "of=/dev/null", "bs=4096", "count=1", "iflag=direct", "status=none"],
      this.#cmd,
    );
    if (read.code !== 0) {
      throw new StorageError("unavailable", `cannot read ${device}: ${read.stderr.trim().slice(0, 500)}`, {
        details: { device },
      });
    }
    return interpretBlkid(await this.#exec.run(blkidArgv(device), this.#cmd));
  }

  async mkfs(device: string, fsType: FsType, extraArgs: readonly string[] = []): Promise<void> {
    await runChecked(this.#exec, mkfsArgv(fsType, device, extraArgs), this.#format);
  }

  async growFs(fsType: FsType, device: string, mountPoint: string): Promise<void> {
    await runChecked(this.#exec, growFsArgv(fsType, device, mountPoint), this.#format);
  }

  async statfs(path: string): Promise<FsUsage> {
    return parseStatfs(await runChecked(this.#exec, ["stat", "-f", "-c", STATFS_FORMAT, path], this.#cmd));
  }

  async deviceSize(device: string): Promise<number> {
    const out = (await runChecked(this.#exec, ["blockdev", "--getsize64", device], this.#cmd)).trim();
    if (!/^\d+$/.test(out))
      throw new StorageError("internal", `blockdev printed ${JSON.stringify(out.slice(0, 100))}`);
    return Number(out);
  }

  async deviceNumber(path: string): Promise<string> {
    return parseDeviceNumber(await runChecked(this.#exec, ["stat", "-L", "-c", "%t:%T", path], this.#cmd));
  }

  async readOnlyView(device: string): Promise<string> {
    const loops = parseLosetupList(await runChecked(this.#exec, LOSETUP_LIST_ARGV, this.#cmd));
    const existing = loops.find(
      (l) => l.backFile === device && l.readonly && l.offset === 0 && l.sizeLimit === 0,
    );
    if (existing) return existing.name;
    return parseAttached(await runChecked(this.#exec, attachArgv(device, { readonly: true }), this.#cmd));
  }

  async setReadOnly(device: string): Promise<void> {
    await runChecked(this.#exec, ["blockdev", "--setro", device], this.#cmd);
  }

  async setReadWrite(device: string): Promise<void> {
    await runChecked(this.#exec, ["blockdev", "--setrw", device], this.#cmd);
  }

  async applyMountGroup(root: string, gid: number): Promise<void> {
    const [group, mode] = (await runChecked(this.#exec, ["stat", "-c", "%g %a", root], this.#cmd))
      .trim()
      .split(" ");
    if (Number(group) === gid && (Number.parseInt(mode ?? "0", 8) & 0o2000) !== 0) return;
    await runChecked(this.#exec, ["chgrp", "-R", "--no-dereference", String(gid), root], this.#format);
    await runChecked(this.#exec, ["chmod", "-R", "g+rwX", root], this.#format);
    await runChecked(
      this.#exec,
      ["find", root, "-xdev", "-type", "d", "-exec", "chmod", "g+s", "{}", "+"],
      this.#format,
    );
  }

  async releaseReadOnlyView(view: string): Promise<void> {
    const loops = parseLosetupList(await runChecked(this.#exec, LOSETUP_LIST_ARGV, this.#cmd));
    if (!loops.some((l) => l.name === view)) return;
    await runChecked(this.#exec, detachArgv(view), this.#cmd);
  }
}
