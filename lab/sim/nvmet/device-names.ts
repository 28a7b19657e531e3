// The lab kernel node's block device names: its drives are loop devices over sparse files, but the
// agent sees them as the nvme driver names them (/dev/nvme0n1, partitions /dev/nvme0n1p2), as on a
// real node. These helpers map those names to the loop devices for every port the agent and the
// simulated nvmet use: file access (/dev nodes, partition sysfs), commands (parted, blkdiscard,
// partx) and nvmet's device_path. Modules nvmet needs are "loaded": the nvmet process is the module.
import { join } from "node:path";
import * as v from "valibot";
import type { Exec, ExecOptions, ExecResult } from "../../../lib/exec.ts";
import { type HostFs, hostFs } from "../../../lib/fs.ts";

/** Namespace disk name ("nvme0n1") -> loop device name ("loop7"). */
export type DeviceNames = Readonly<Record<string, string>>;

const DeviceNamesSchema = v.record(
  v.pipe(v.string(), v.regex(/^nvme\d+n\d+$/, "keys must be namespace disk names like nvme0n1")),
  v.pipe(v.string(), v.regex(/^loop\d+$/, "values must be loop device names like loop7")),
);

/** Parses the JSON the lab writes for a node (a device-map file); throws on anything else. */
export function parseDeviceNames(text: string): DeviceNames {
  return v.parse(DeviceNamesSchema, JSON.parse(text));
}

const DEV = /^\/dev\/(nvme\d+n\d+)(p\d+)?$/;
// Partitions only: the whole disk's sysfs directory is the simulated one (PCIe parent, nvme
// attributes), while a partition made by parted exists only in the real kernel's view.
const SYS_PART = /^\/sys\/class\/block\/(nvme\d+n\d+)(p\d+)(\/.*)?$/;

/**
 * The real host path behind `path` when it names one of the node's disks or their partitions
 * (/dev/nvme0n1 -> /dev/loop7, /dev/nvme0n1p2 -> /dev/loop7p2, /sys/class/block/nvme0n1p2/start
 * -> /sys/class/block/loop7p2/start); undefined for every other path. Pure.
 */
export function realDevicePath(names: DeviceNames, path: string): string | undefined {
  const d = DEV.exec(path);
  if (d?.[1] && names[d[1]]) return `/dev/${names[d[1]]}${d[2] ?? ""}`;
  const s = SYS_PART.exec(path);
  if (s?.[1] && names[s[1]]) return `/sys/class/block/${names[s[1]]}${s[2]}${s[3] ?? ""}`;
  return undefined;
}

/**
 * A HostFs that sends the node's disk paths (realDevicePath) to the real host and everything else
 * to `inner` (the node's simulated sysfs and configfs). root stays inner's, so symlinks in
 * configfs resolve as before.
 */
export function deviceNamedFs(inner: HostFs, names: DeviceNames): HostFs {
  const real = hostFs("/");
  const at = (p: string): [HostFs, string] => {
    const r = realDevicePath(names, p);
    return r ? [real, r] : [inner, p];
  };
  return {
    root: inner.root,
    readFile: (p) => at(p)[0].readFile(at(p)[1]),
    writeFile: (p, d) => at(p)[0].writeFile(at(p)[1], d),
    readdir: (p) => at(p)[0].readdir(at(p)[1]),
    readlink: (p) => at(p)[0].readlink(at(p)[1]),
    symlink: (t, p) => at(p)[0].symlink(t, at(p)[1]),
    mkdir: (p) => at(p)[0].mkdir(at(p)[1]),
    rmdir: (p) => at(p)[0].rmdir(at(p)[1]),
    unlink: (p) => at(p)[0].unlink(at(p)[1]),
    exists: (p) => at(p)[0].exists(at(p)[1]),
    isDirectory: (p) => at(p)[0].isDirectory(at(p)[1]),
  };
}

/** nvmet and its transports: built into the lab node's "kernel" (the simulated nvmet process). */
const NVMET_MODULE = /^nvmet(-tcp|-rdma)?$/;

/**
 * An Exec that rewrites every argument naming one of the node's disks to its loop device, and
 * answers `modprobe nvmet`, `nvmet-tcp` and `nvmet-rdma` as loaded without touching the real
 * kernel (which may have a real nvmet module nobody here should load).
 */
export function deviceNamedExec(inner: Exec, names: DeviceNames): Exec {
  return {
    run(argv: readonly string[], opts?: ExecOptions): Promise<ExecResult> {
      if (argv.length === 2 && argv[0] === "modprobe" && NVMET_MODULE.test(argv[1] ?? "")) {
        return Promise.resolve({ code: 0, stdout: "", stderr: "" });
      }
      return inner.run(
        argv.map((a) => realDevicePath(names, a) ?? a),
        opts,
      );
    },
  };
}

/** nvmet's resolveDevice for the node: a device_path naming a disk opens its loop device, other paths under `root`. */
export function nvmetDeviceResolver(names: DeviceNames, root: string): (devicePath: string) => string {
  return (p) => realDevicePath(names, p) ?? join(root, p);
}
