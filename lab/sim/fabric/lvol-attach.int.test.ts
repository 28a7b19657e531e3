// End to end over real loop devices: an emulated nvmf_tgt with a simulated drive exports thick
// lvols (lvstore on the drive, namespace 1, TCP listener on a SimFabric, the host allowed), and
// the lab initiator attaches them over their extent of the drive file. mkfs.ext4, mount, write,
// unmount, disconnect, reconnect, mount: the file is intact and the emulator reads the same bytes.
// A host not in the ACL is refused; a mapped lvol grows in place (the device follows on rescan)
// but is not moved (the emulator sees the loop device in sysfs); disconnected, it moves with its
// filesystem. A mounted lvol snapshotted (frozen around it) keeps its device and filesystem, and
// a clone of the snapshot (a file of its own) mounts with the files as they were at the snapshot,
// each side's later writes invisible to the other. Needs root, util-linux and e2fsprogs.
import { afterAll, beforeAll, expect, test } from "bun:test";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostExec, runChecked } from "../../../lib/exec.ts";
import { spdkRpcBackingResolver } from "./namespace-backing.ts";
import { SimNvmeInitiator } from "./sim-initiator.ts";
import { type ExportSpec, startTestTarget, type TestTarget } from "./test-target.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:0f3e2d1c-4b5a-4697-8a8b-9c0d1e2f3a4b";
const STRANGER = "nqn.2014-08.org.nvmexpress:uuid:99999999-8888-4777-8666-555555555555";
const sh = (...argv: string[]) => runChecked(hostExec, argv, { timeoutMs: 60_000 });

const spec = (n: number, sizeBytes = 32 * MIB): ExportSpec => ({
  nqn: `nqn.2026-01.io.distort:int-lvol-${n}`,
  sizeBytes,
  hosts: [HOST],
  uuid: `22222222-3333-4444-8555-${String(n).padStart(12, "0")}`,
  trsvcid: String(4450 + n),
});
const params = (s: ExportSpec, hostNqn = HOST) => ({
  transport: "tcp" as const,
  address: "127.0.0.1",
  port: Number(s.trsvcid),
  nqn: s.nqn,
  hostNqn,
});

let root: string;
let target: TestTarget;
let initiator: SimNvmeInitiator;
let driveFile: string;

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("the lvol attach test needs root (losetup, mkfs, mount)");
  for (const tool of ["losetup", "mkfs.ext4", "mount", "umount", "blockdev", "fsfreeze"]) {
    if ((await hostExec.run(["sh", "-c", `command -v ${tool}`])).code !== 0) {
      throw new Error(`${tool} is missing; on Debian: apt-get install -y util-linux e2fsprogs`);
    }
  }
  root = mkdtempSync(join(tmpdir(), "lvol-attach-"));
  target = await startTestTarget({
    drives: [{ pciAddress: "0000:d8:00.0", serial: "LABINT01", model: "Sim NVMe", sizeBytes: 512 * MIB }],
  });
  driveFile = join(target.dir, "d", "drives", "0000_d8_00.0.img");
  initiator = new SimNvmeInitiator({
    fabric: target.fabric,
    stateDir: join(root, "initiator"),
    exec: hostExec,
    backing: spdkRpcBackingResolver(target.rpc),
  });
});

/** Loop devices over `file` (default: the drive file), whatever attached them. */
async function loopsOverDrive(file = driveFile): Promise<string[]> {
  const out = await hostExec.run(["losetup", "--associated", file, "--noheadings", "--output", "NAME"]);
  return out.stdout
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "");
}

/** Loop devices over any file of the target's directory (the drive, lvol files). */
async function loopsOverTarget(): Promise<string[]> {
  const out = await hostExec.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"]);
  return out.stdout
    .split("\n")
    .map((l) => l.trim().split(/\s+/))
    .filter(([, file]) => target !== undefined && file?.startsWith(target.dir) === true)
    .map(([name]) => name as string);
}

afterAll(async () => {
  try {
    const mounts = readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((l) => l.split(" ")[4])
      .filter((m): m is string => root !== undefined && m?.startsWith(root) === true)
      .reverse();
    for (const m of mounts) await hostExec.run(["umount", "-l", m]);
    for (const dev of await loopsOverTarget()) await hostExec.run(["losetup", "--detach", dev]);
  } finally {
    initiator?.close();
    await target?.close();
    if (root) rmSync(root, { recursive: true, force: true });
  }
});

async function mounted<T>(device: string, dir: string, fn: () => Promise<T>): Promise<T> {
  mkdirSync(dir, { recursive: true });
  await sh("mount", "-t", "ext4", device, dir);
  try {
    return await fn();
  } finally {
    await sh("umount", dir);
  }
}

function readDevice(device: string, length: number): Buffer {
  const fd = openSync(device, "r");
  try {
    const out = Buffer.alloc(length);
    readSync(fd, out, 0, length, 0);
    return out;
  } finally {
    closeSync(fd);
  }
}

const deviceSize = async (device: string) => Number((await sh("blockdev", "--getsize64", device)).trim());
type Extent = { filename: string; offset: number; length: number };
const extentOf = async (bdev: string) =>
  (
    (await target.rpc.call("bdev_get_bdevs", { name: bdev })) as {
      driver_specific: { sim_extent?: Extent };
    }[]
  )[0]?.driver_specific.sim_extent;

test("a host not in the ACL is refused and nothing is attached", async () => {
  const s = spec(1);
  await target.exportLvol(s, "acl");
  const err = await initiator.connect(params(s, STRANGER)).catch((e) => e);
  expect(err.kind).toBe("unavailable");
  expect(err.message).toContain(`host ${STRANGER} not allowed`);
  expect(await loopsOverDrive()).toEqual([]);
  expect(await initiator.findNamespaceDevice(s.nqn)).toBeUndefined();
});

test("mkfs, mount, write, disconnect, reconnect, mount: the file is intact; resize in place or refused", async () => {
  const s = spec(2);
  const bdev = await target.exportLvol(s, "data");
  // A neighbour right after it, so growing beyond in place would mean moving.
  const next = spec(3);
  await target.exportLvol(next, "neighbour");
  const dir = join(root, "mnt");
  try {
    await initiator.connect(params(s));
    const device = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    expect(device).toMatch(/^\/dev\/loop\d+$/);
    expect(await loopsOverDrive()).toEqual([device]);
    expect(await deviceSize(device)).toBe(32 * MIB);
    await sh("mkfs.ext4", "-q", "-F", device);
    await mounted(device, dir, async () => {
      writeFileSync(join(dir, "hello.txt"), "kept across reconnects\n");
    });
    // What the loop device wrote is what the target serves.
    expect((await target.emulator.bdev(bdev).read(0, 64 * 1024)).equals(readDevice(device, 64 * 1024))).toBe(
      true,
    );

    await initiator.disconnect(s.nqn);
    expect(await loopsOverDrive()).toEqual([]);
    await initiator.connect(params(s));
    const again = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    await mounted(again, dir, async () => {
      expect(readFileSync(join(dir, "hello.txt"), "utf8")).toBe("kept across reconnects\n");

      // Mapped by a loop device: moving it is refused (the emulator sees the device in sysfs).
      const e = (await extentOf(bdev)) as Extent;
      const busy = await target.rpc.call("bdev_lvol_resize", { name: bdev, size_in_mib: 48 }).then(
        () => "resized",
        (x: Error) => x.message,
      );
      expect(busy).toContain("Device or resource busy");
      expect(await extentOf(bdev)).toEqual(e);
      expect(readFileSync(join(dir, "hello.txt"), "utf8")).toBe("kept across reconnects\n");
    });
  } finally {
    await hostExec.run(["umount", dir]);
    await initiator.disconnect(s.nqn);
  }
  expect(await loopsOverDrive()).toEqual([]);

  // Disconnected, it moves past the neighbour with its filesystem.
  const before = (await extentOf(bdev)) as Extent;
  await target.rpc.call("bdev_lvol_resize", { name: bdev, size_in_mib: 48 });
  const after = (await extentOf(bdev)) as Extent;
  expect(after.offset).not.toBe(before.offset);
  expect(after.length).toBe(48 * MIB);
  try {
    await initiator.connect(params(s));
    const moved = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    expect(await deviceSize(moved)).toBe(48 * MIB);
    await mounted(moved, dir, async () => {
      expect(readFileSync(join(dir, "hello.txt"), "utf8")).toBe("kept across reconnects\n");
    });
  } finally {
    await hostExec.run(["umount", dir]);
    await initiator.disconnect(s.nqn);
  }
  expect(await loopsOverDrive()).toEqual([]);
});

test("a mounted lvol that grows in place is followed on rescan", async () => {
  // Bigger than the hole the move above left: it lands last on the drive, free space after it.
  const s = spec(4, 40 * MIB);
  const bdev = await target.exportLvol(s, "grows");
  const dir = join(root, "mnt-grow");
  try {
    await initiator.connect(params(s));
    const device = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    await sh("mkfs.ext4", "-q", "-F", device);
    await mounted(device, dir, async () => {
      writeFileSync(join(dir, "a.txt"), "before the resize\n");
      const e = (await extentOf(bdev)) as Extent;
      await target.rpc.call("bdev_lvol_resize", { name: bdev, size_in_mib: 64 });
      // In place: a mapped lvol never moves.
      expect(await extentOf(bdev)).toEqual({ ...e, length: 64 * MIB });
      for (let i = 0; i < 100 && (await deviceSize(device)) !== 64 * MIB; i++) {
        await initiator.rescan(s.nqn);
        await Bun.sleep(10);
      }
      expect(await deviceSize(device)).toBe(64 * MIB);
      expect(await initiator.findNamespaceDevice(s.nqn, s.uuid)).toBe(device);
      writeFileSync(join(dir, "b.txt"), "after the resize\n");
    });
    await mounted(device, dir, async () => {
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("before the resize\n");
      expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("after the resize\n");
    });
  } finally {
    await hostExec.run(["umount", dir]);
    await initiator.disconnect(s.nqn);
  }
  expect(await loopsOverDrive()).toEqual([]);
});

test("a mounted lvol snapshotted keeps its device; a clone of the snapshot mounts with the bytes it had", async () => {
  const src = spec(5);
  const bdev = await target.exportLvol(src, "source");
  const dir = join(root, "mnt-src");
  const cloneDir = join(root, "mnt-clone");
  const restored = spec(6);
  try {
    await initiator.connect(params(src));
    const device = (await initiator.findNamespaceDevice(src.nqn, src.uuid)) as string;
    await sh("mkfs.ext4", "-q", "-F", device);
    mkdirSync(dir, { recursive: true });
    await sh("mount", "-t", "ext4", device, dir);
    try {
      writeFileSync(join(dir, "a.txt"), "before the snapshot\n");
      const before = (await extentOf(bdev)) as Extent;
      // Frozen, the filesystem's dirty state is in the drive file's page cache, which the
      // emulator's copy reads: the snapshot is a clean image.
      await sh("fsfreeze", "--freeze", dir);
      try {
        await target.rpc.call("bdev_lvol_snapshot", { lvol_name: bdev, snapshot_name: "source-snap" });
      } finally {
        await sh("fsfreeze", "--unfreeze", dir);
      }
      // The origin did not move: the mounted device goes on showing (and writing) it.
      expect(await extentOf(bdev)).toEqual(before);
      writeFileSync(join(dir, "a.txt"), "after the snapshot\n");
      writeFileSync(join(dir, "b.txt"), "only on the source\n");
      await sh("sync", "-f", join(dir, "a.txt"));
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("after the snapshot\n");

      // Restore: a clone of the snapshot, exported and attached like any volume.
      const clone = (await target.rpc.call("bdev_lvol_clone", {
        snapshot_name: "lvs0/source-snap",
        clone_name: "restored",
      })) as string;
      await target.rpc.call("nvmf_create_subsystem", { nqn: restored.nqn });
      await target.rpc.call("nvmf_subsystem_add_ns", {
        nqn: restored.nqn,
        namespace: { bdev_name: clone, nsid: 1, uuid: restored.uuid },
      });
      await target.rpc.call("nvmf_subsystem_add_listener", {
        nqn: restored.nqn,
        listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.1", trsvcid: restored.trsvcid },
      });
      await target.rpc.call("nvmf_subsystem_add_host", { nqn: restored.nqn, host: HOST });
      await initiator.connect(params(restored));
      const cloneDevice = (await initiator.findNamespaceDevice(restored.nqn, restored.uuid)) as string;
      const cloneExtent = (await extentOf(clone)) as Extent;
      expect(cloneExtent.filename).not.toBe(driveFile);
      expect(await loopsOverDrive(cloneExtent.filename)).toEqual([cloneDevice]);
      expect(await deviceSize(cloneDevice)).toBe(32 * MIB);
      // The same filesystem UUID as the source: ext4 mounts both at once all the same.
      await mounted(cloneDevice, cloneDir, async () => {
        expect(readFileSync(join(cloneDir, "a.txt"), "utf8")).toBe("before the snapshot\n");
        expect(existsSync(join(cloneDir, "b.txt"))).toBe(false);
        writeFileSync(join(cloneDir, "c.txt"), "only on the clone\n");
      });
      // Unmounted, what the loop device shows is what the target serves.
      expect(
        (await target.emulator.bdev(clone).read(0, 256 * 1024)).equals(readDevice(cloneDevice, 256 * 1024)),
      ).toBe(true);
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("after the snapshot\n");
      expect(existsSync(join(dir, "c.txt"))).toBe(false);
    } finally {
      await hostExec.run(["umount", dir]);
    }
    // The source, mounted again from scratch, kept everything written after the snapshot.
    await mounted(device, dir, async () => {
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("after the snapshot\n");
      expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("only on the source\n");
    });
  } finally {
    await hostExec.run(["umount", cloneDir]);
    await initiator.disconnect(src.nqn);
    await initiator.disconnect(restored.nqn);
  }
  expect(await loopsOverTarget()).toEqual([]);
});
