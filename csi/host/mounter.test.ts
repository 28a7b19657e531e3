// HostMounter: the exact commands for mount, bind (with the read-only remount and its rollback),
// probe (read first, then blkid), mkfs without force, growth, statfs and device numbers; every
// command under a deadline.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../../lib/errors.ts";
import { type HostFs, hostFs } from "../../lib/fs.ts";
import {
  growFsArgv,
  HostMounter,
  mkfsArgv,
  parseDeviceNumber,
  parseStatfs,
  STATFS_FORMAT,
} from "./mounter.ts";
import { ScriptedExec } from "./scripted-exec.ts";

let root: string;
let fs: HostFs;
beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "mounter-"));
  fs = hostFs(root);
  await fs.mkdir("/proc");
  await fs.mkdir("/proc/self");
  await fs.writeFile(
    "/proc/self/mountinfo",
    "22 1 259:2 / / rw - ext4 /dev/nvme0n1p2 rw\n40 22 259:7 / /stage rw - xfs /dev/nvme3n1 rw\n",
  );
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const mounter = (exec: ScriptedExec) =>
  new HostMounter({ exec, fs, commandTimeoutMs: 111, formatTimeoutMs: 222 });

test.each<[string, string[], string[]]>([
  ["mkfs ext4 never forces", mkfsArgv("ext4", "/dev/nvme1n1"), ["mkfs.ext4", "-m0", "/dev/nvme1n1"]],
  ["mkfs xfs never forces", mkfsArgv("xfs", "/dev/nvme1n1"), ["mkfs.xfs", "/dev/nvme1n1"]],
  ["grow ext4 by device", growFsArgv("ext4", "/dev/nvme1n1", "/stage"), ["resize2fs", "/dev/nvme1n1"]],
  ["grow xfs by mount point", growFsArgv("xfs", "/dev/nvme1n1", "/stage"), ["xfs_growfs", "-d", "/stage"]],
])("%s", (_name, got, want) => {
  expect(got).toEqual(want);
});

describe("HostMounter", () => {
  test("reads the mount table through HostFs", async () => {
    const m = mounter(new ScriptedExec());
    expect((await m.mountsAt("/stage")).map((e) => e.source)).toEqual(["/dev/nvme3n1"]);
    expect(await m.mountsAt("/elsewhere")).toEqual([]);
  });

  test("read-write bind is one mount --bind", async () => {
    const exec = new ScriptedExec();
    await mounter(exec).bindMount("/stage", "/target", { readonly: false });
    expect(exec.calls.map((c) => c.argv)).toEqual([["mount", "--bind", "/stage", "/target"]]);
  });

  test("read-only bind remounts read-only, and unmounts again when that fails", async () => {
    const ok = new ScriptedExec();
    await mounter(ok).bindMount("/stage", "/target", { readonly: true });
    expect(ok.calls.map((c) => c.argv)).toEqual([
      ["mount", "--bind", "/stage", "/target"],
      ["mount", "-o", "remount,bind,ro", "/target"],
    ]);
    const failing = new ScriptedExec().on(["mount", "-o"], { code: 32, stderr: "mount: permission denied" });
    await expect(mounter(failing).bindMount("/stage", "/target", { readonly: true })).rejects.toThrow(
      StorageError,
    );
    expect(failing.calls.at(-1)?.argv).toEqual(["umount", "/target"]);
  });

  test("probe reads the device before trusting blkid's 'nothing found'", async () => {
    const exec = new ScriptedExec().on(["blkid"], { code: 2 });
    expect(await mounter(exec).probe("/dev/nvme1n1")).toEqual({ kind: "blank" });
    expect(exec.calls.map((c) => c.argv[0])).toEqual(["dd", "blkid"]);
    expect(exec.calls[0]?.argv).toContain("if=/dev/nvme1n1");
    expect(exec.calls[0]?.argv).toContain("iflag=direct");

    const unreadable = new ScriptedExec().on(["dd"], {
      code: 1,
      stderr: "dd: error reading: Input/output error",
    });
    const err = await mounter(unreadable)
      .probe("/dev/nvme1n1")
      .catch((e) => e);
    expect(err.kind).toBe("unavailable");
    expect(unreadable.calls.map((c) => c.argv[0])).toEqual(["dd"]);
  });

  test("mkfs and growth run under the format deadline, the rest under the command deadline", async () => {
    const exec = new ScriptedExec()
      .on(["stat", "-f"], { stdout: "4096 1000 400 300 640 600\n" })
      .on(["stat", "-L"], { stdout: "103:7\n" })
      .on(["blockdev"], { stdout: "1073741824\n" });
    const m = mounter(exec);
    await m.mkfs("/dev/x", "xfs");
    await m.growFs("ext4", "/dev/x", "/stage");
    await m.mount("/dev/x", "/stage", "xfs", []);
    await m.unmount("/stage");
    await m.syncFilesystem("/stage");
    expect(await m.statfs("/stage")).toEqual({
      totalBytes: 4096000,
      availableBytes: 1228800,
      usedBytes: 2457600,
      totalInodes: 640,
      freeInodes: 600,
      usedInodes: 40,
    });
    expect(await m.deviceNumber("/dev/x")).toBe("259:7");
    expect(await m.deviceSize("/dev/x")).toBe(1073741824);
    expect(exec.calls.map((c) => [c.argv[0], c.opts?.timeoutMs])).toEqual([
      ["mkfs.xfs", 222],
      ["resize2fs", 222],
      ["mount", 111],
      ["umount", 111],
      ["sync", 111],
      ["stat", 111],
      ["stat", 111],
      ["blockdev", 111],
    ]);
    expect(exec.calls[4]?.argv).toEqual(["sync", "-f", "/stage"]);
    expect(exec.calls[5]?.argv).toEqual(["stat", "-f", "-c", STATFS_FORMAT, "/stage"]);
  });

  test("read-only views are reused and released once", async () => {
    const list = JSON.stringify({
      loopdevices: [{ name: "/dev/loop4", "back-file": "/dev/nvme1n1", ro: true, offset: 0, sizelimit: 0 }],
    });
    const reuse = new ScriptedExec().on(["losetup", "--list"], { stdout: list });
    expect(await mounter(reuse).readOnlyView("/dev/nvme1n1")).toBe("/dev/loop4");
    expect(reuse.calls).toHaveLength(1);

    const fresh = new ScriptedExec()
      .on(["losetup", "--list"], { stdout: '{"loopdevices": []}' })
      .on(["losetup", "--find"], { stdout: "/dev/loop5\n" });
    expect(await mounter(fresh).readOnlyView("/dev/nvme2n1")).toBe("/dev/loop5");
    expect(fresh.calls[1]?.argv).toEqual(["losetup", "--find", "--show", "--read-only", "/dev/nvme2n1"]);

    const release = new ScriptedExec().on(["losetup", "--list"], { stdout: list });
    await mounter(release).releaseReadOnlyView("/dev/loop9");
    await mounter(release).releaseReadOnlyView("/dev/loop4");
    expect(release.argvOf("losetup").filter((a) => a[1] === "--detach")).toEqual([
      ["losetup", "--detach", "/dev/loop4"],
    ]);
  });
});

test("statfs and device number parsing reject garbage", () => {
  expect(() => parseStatfs("stat: cannot read file system information")).toThrow(StorageError);
  expect(() => parseDeviceNumber("0:0:0")).toThrow(StorageError);
  expect(parseDeviceNumber("7:1f")).toBe("7:31");
});
