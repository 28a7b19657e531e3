// The DPU's filesystem port: mountinfo parsing and the exact argv the host
// implementation runs (a scripted Exec), including the read check before "blank" is believed.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import type { Exec, ExecResult } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { hostFilesystem, mkfsArgv, parseMountinfo } from "./host-filesystem.ts";

const MOUNTINFO = [
  "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
  "98 22 7:3 / /var/lib/distort/dpu/mounts/distort_ab rw,relatime shared:50 - ext4 /dev/nbd0 rw",
  "99 98 7:4 / /var/lib/distort/dpu/mounts/distort_ab rw master:3 - xfs /dev/nbd1 rw",
  "100 22 0:5 / /mnt/with\\040space rw - tmpfs tmpfs rw",
  "garbage line",
  "",
].join("\n");

describe("parseMountinfo", () => {
  test("mount point, type and source; escapes decoded; odd lines skipped", () => {
    expect(parseMountinfo(MOUNTINFO)).toEqual([
      { mountPoint: "/", fsType: "ext4", source: "/dev/sda1" },
      { mountPoint: "/var/lib/distort/dpu/mounts/distort_ab", fsType: "ext4", source: "/dev/nbd0" },
      { mountPoint: "/var/lib/distort/dpu/mounts/distort_ab", fsType: "xfs", source: "/dev/nbd1" },
      { mountPoint: "/mnt/with space", fsType: "tmpfs", source: "tmpfs" },
    ]);
  });
});

test("argv: mkfs without discards, mount read-only only when asked", async () => {
  expect(mkfsArgv("/dev/nbd0", "ext4")).toEqual(["mkfs.ext4", "-q", "-E", "nodiscard", "/dev/nbd0"]);
  expect(mkfsArgv("/dev/nbd0", "xfs")).toEqual(["mkfs.xfs", "-q", "-K", "/dev/nbd0"]);
  const exec = scripted({});
  const fs = hostFilesystem({ exec, fs: memFs({}) });
  await fs.mount("/dev/nbd0", "/m", "xfs", false);
  await fs.mount("/dev/nbd0", "/m", "ext4", true);
  expect(exec.argvs[0]).toEqual(["mount", "-t", "xfs", "/dev/nbd0", "/m"]);
  expect(exec.argvs[1]).toEqual(["mount", "-t", "ext4", "-o", "ro", "/dev/nbd0", "/m"]);
});

/** An Exec answering from a script keyed by argv[0], recording every argv. */
function scripted(answers: Record<string, ExecResult>): Exec & { argvs: string[][] } {
  const argvs: string[][] = [];
  return {
    argvs,
    async run(argv) {
      argvs.push([...argv]);
      return answers[argv[0] as string] ?? { code: 0, stdout: "", stderr: "" };
    },
  };
}

function memFs(files: Record<string, string>, dirs = new Set<string>(["/"])): HostFs & { dirs: Set<string> } {
  const err = (code: string) => Object.assign(new Error(code), { code });
  return {
    root: "/",
    dirs,
    readFile: async (p) => {
      if (files[p] === undefined) throw err("ENOENT");
      return files[p] as string;
    },
    writeFile: async () => {},
    readdir: async () => [],
    readlink: async () => "",
    symlink: async () => {},
    mkdir: async (p) => {
      if (dirs.has(p)) throw err("EEXIST");
      dirs.add(p);
    },
    rmdir: async (p) => {
      if (!dirs.delete(p)) throw err("ENOENT");
    },
    unlink: async () => {},
    exists: async (p) => dirs.has(p),
    isDirectory: async (p) => dirs.has(p),
  };
}

describe("hostFilesystem", () => {
  test("probe reads a block first and only then trusts blkid's 'nothing found'", async () => {
    const exec = scripted({ blkid: { code: 2, stdout: "", stderr: "" } });
    const fs = hostFilesystem({ exec, fs: memFs({}) });
    expect(await fs.probe("/dev/nbd3")).toEqual({ kind: "blank" });
    expect(exec.argvs).toEqual([
      ["dd", "if=/dev/nbd3", "of=/dev/null", "bs=4096", "count=1", "iflag=direct", "status=none"],
      ["blkid", "-p", "-o", "export", "/dev/nbd3"],
    ]);
    const dead = hostFilesystem({
      exec: scripted({
        dd: { code: 1, stdout: "", stderr: "Input/output error" },
        blkid: { code: 2, stdout: "", stderr: "" },
      }),
      fs: memFs({}),
    });
    const e = await dead.probe("/dev/nbd3").catch((x: StorageError) => x);
    expect(e).toBeInstanceOf(StorageError);
    expect((e as StorageError).kind).toBe("unavailable");
  });

  test("format, mount, unmount run the commands and fail with their stderr", async () => {
    const exec = scripted({});
    const fs = hostFilesystem({ exec, fs: memFs({}) });
    await fs.format("/dev/nbd0", "ext4");
    await fs.mount("/dev/nbd0", "/m", "ext4", true);
    await fs.unmount("/m");
    expect(exec.argvs.map((a) => a[0])).toEqual(["mkfs.ext4", "mount", "umount"]);
    const failing = hostFilesystem({
      exec: scripted({ mount: { code: 32, stdout: "", stderr: "wrong fs type" } }),
      fs: memFs({}),
    });
    const err = await failing.mount("/dev/nbd0", "/m", "xfs", false).then(
      () => undefined,
      (x: Error) => x,
    );
    expect(err?.message).toContain("wrong fs type");
  });

  test("mounts() reads /proc/self/mountinfo; directories are made with their parents and removed when empty", async () => {
    const mem = memFs({ "/proc/self/mountinfo": MOUNTINFO });
    const fs = hostFilesystem({ exec: scripted({}), fs: mem });
    expect((await fs.mounts()).length).toBe(4);
    await fs.ensureDir("/var/lib/distort/m/x");
    await fs.ensureDir("/var/lib/distort/m/x");
    expect([...mem.dirs].sort()).toEqual([
      "/",
      "/var",
      "/var/lib",
      "/var/lib/distort",
      "/var/lib/distort/m",
      "/var/lib/distort/m/x",
    ]);
    await fs.removeDir("/var/lib/distort/m/x");
    await fs.removeDir("/var/lib/distort/m/x");
    expect(mem.dirs.has("/var/lib/distort/m/x")).toBe(false);
  });
});
