// mount(2) and umount2(2) through bun:ffi, for mounting a FUSE connection on an open /dev/fuse
// descriptor without a setuid helper, and the fusectl file system that can abort a connection.

import { dlopen, read } from "bun:ffi";
import { readFileSync, writeFileSync } from "node:fs";
import { LibcError } from "../spdk/libc.ts";

const SYMBOLS = {
  mount: { args: ["ptr", "ptr", "ptr", "u64", "ptr"], returns: "i32" },
  umount2: { args: ["ptr", "i32"], returns: "i32" },
  __errno_location: { args: [], returns: "ptr" },
} as const;

type Libc = ReturnType<typeof dlopen<typeof SYMBOLS>>["symbols"];
const CANDIDATES = ["libc.so.6", `libc.musl-${process.arch === "arm64" ? "aarch64" : "x86_64"}.so.1`];
let loaded: Libc | undefined;

function libc(): Libc {
  if (loaded) return loaded;
  for (const name of CANDIDATES) {
    try {
      loaded = dlopen(name, SYMBOLS).symbols;
      return loaded;
    } catch {
      // try the next name
    }
  }
  throw new Error("libc is not available to bun:ffi on this host");
}

function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`, "utf8");
}

function errno(c: Libc): number {
  const p = c.__errno_location();
  return p === null ? 0 : read.i32(p, 0);
}

export const MS_NOSUID = 2;
export const MS_NODEV = 4;
export const MNT_DETACH = 2;
export const EBUSY = 16;
export const EINVAL = 22;
export const ENOENT = 2;

/** mount(2). Throws LibcError with the errno on failure. Blocks the calling thread while it runs. */
export function mount(source: string, target: string, fstype: string, flags: number, data: string): void {
  const c = libc();
  if (c.mount(cstr(source), cstr(target), cstr(fstype), flags, cstr(data)) !== 0) {
    throw new LibcError(`mount ${fstype} on ${target}`, errno(c));
  }
}

/** umount2(2). Throws LibcError with the errno (EBUSY, EINVAL for "not a mount point", ...). */
export function umount2(target: string, flags: number): void {
  const c = libc();
  if (c.umount2(cstr(target), flags) !== 0) throw new LibcError(`umount ${target}`, errno(c));
}

/** Undoes the octal escapes (\040 for a space, ...) of a path in /proc/self/mountinfo. */
function unescapeMountPath(p: string): string {
  return p.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
}

/** One line of /proc/self/mountinfo, the fields used here. */
export interface MountInfo {
  /** st_dev of the mount's file system, as "major:minor". */
  dev: string;
  mountpoint: string;
  fstype: string;
}

/** The mounts of this process's mount namespace, in mount order. */
export function mountTable(text = readFileSync("/proc/self/mountinfo", "utf8")): MountInfo[] {
  const out: MountInfo[] = [];
  for (const line of text.split("\n")) {
    const f = line.split(" ");
    const sep = f.indexOf("-");
    if (f.length < 10 || sep < 6) continue;
    out.push({
      dev: f[2] as string,
      mountpoint: unescapeMountPath(f[4] as string),
      fstype: f[sep + 1] as string,
    });
  }
  return out;
}

/**
 * The fusectl connection number of the FUSE mount on `mountpoint` (its st_dev as the kernel
 * encodes it, which for the anonymous devices FUSE uses is the minor number), read from
 * /proc/self/mountinfo so the mount itself is never touched (a stat would wait on the server).
 * Undefined when nothing is mounted there.
 */
export function fuseConnectionId(mountpoint: string, table = mountTable()): number | undefined {
  const m = table.filter((e) => e.mountpoint === mountpoint && e.fstype.startsWith("fuse")).at(-1);
  if (!m) return undefined;
  const [major, minor] = m.dev.split(":").map(Number) as [number, number];
  return major * 2 ** 20 + minor;
}

const FUSECTL = "/sys/fs/fuse/connections";

/**
 * Aborts FUSE connection `id` through fusectl (mounting fusectl first when it is not): every
 * pending and future request of it fails, the server's next read of /dev/fuse fails. Throws
 * when fusectl cannot be mounted or the connection does not exist.
 */
export function abortFuseConnection(id: number): void {
  if (!mountTable().some((e) => e.fstype === "fusectl")) {
    try {
      mount("fusectl", FUSECTL, "fusectl", 0, "");
    } catch (err) {
      // Another process may have mounted it in between.
      if (!(err instanceof LibcError && err.errno === EBUSY)) throw err;
    }
  }
  writeFileSync(`${FUSECTL}/${id}/abort`, "1");
}
