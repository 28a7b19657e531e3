// End to end over the lab's block path: an emulated nvmf_tgt with a simulated drive exports thick
// lvols (lvstore on the drive, namespace 1, TCP listener on a SimFabric, the host allowed), and the
// lab's NVMe-oF host daemon attaches them (a FUSE file per namespace under a loop device, every
// block a command over the fabric), each a process of its own. mkfs.ext4, mount, write, unmount,
// disconnect, reconnect, mount: the file is intact, and a second controller reading over the
// fabric sees the bytes the device shows. A host not in the ACL is refused; a mounted lvol grows
// (in place, or moved past a neighbour with its bytes, as the target pleases) and the device
// follows on rescan. A mounted lvol snapshotted (frozen around it) keeps its device and
// filesystem, and a clone of the snapshot mounts with the files as they were at the snapshot, each
// side's later writes invisible to the other. Needs root, util-linux and e2fsprogs.
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
import { connectController, createFabric } from "../spdk/fabric.ts";
import type { HostControlInitiator } from "./host-control.ts";
import { type ExportSpec, startTestTargetProcess, type TestTargetProcess } from "./test-target.ts";

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
let target: TestTargetProcess;
let initiator: HostControlInitiator;

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("the lvol attach test needs root (losetup, mkfs, mount)");
  for (const tool of ["losetup", "mkfs.ext4", "mount", "umount", "blockdev", "fsfreeze"]) {
    if ((await hostExec.run(["sh", "-c", `command -v ${tool}`])).code !== 0) {
      throw new Error(`${tool} is missing; on Debian: apt-get install -y util-linux e2fsprogs`);
    }
  }
  root = mkdtempSync(join(tmpdir(), "lvol-attach-"));
  target = await startTestTargetProcess({
    drives: [{ pciAddress: "0000:d8:00.0", serial: "LABINT01", model: "Sim NVMe", sizeBytes: 512 * MIB }],
  });
  initiator = await target.startHost("worker");
});

afterAll(async () => {
  try {
    const mounts = readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((l) => l.split(" ")[4])
      .filter((m): m is string => root !== undefined && m?.startsWith(root) === true)
      .reverse();
    for (const m of mounts) await hostExec.run(["umount", "-l", m]);
  } finally {
    // The host daemon detaches its loop devices as it stops.
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

/**
 * The first `length` bytes of namespace 1 of `s` as the target serves them: read by a controller
 * of its own over the fabric, not through the host daemon's device.
 */
async function servedBytes(s: ExportSpec, length: number): Promise<Buffer> {
  const ctrl = await connectController(createFabric(target.fabricDir), {
    trtype: "TCP",
    traddr: "127.0.0.1",
    trsvcid: s.trsvcid as string,
    subnqn: s.nqn,
    hostnqn: HOST,
    hostid: "0f3e2d1c-4b5a-4697-8a8b-000000000099",
  });
  try {
    return await ctrl.read(1, 0, length);
  } finally {
    ctrl.close();
  }
}

const deviceSize = async (device: string) => Number((await sh("blockdev", "--getsize64", device)).trim());

/** Rescans `s` until its device shows `bytes` (the size change reaches the host asynchronously too). */
async function rescanUntil(s: ExportSpec, device: string, bytes: number): Promise<void> {
  const deadline = Date.now() + 20_000;
  while ((await deviceSize(device)) !== bytes) {
    if (Date.now() > deadline) throw new Error(`${device} never showed ${bytes} bytes`);
    await initiator.rescan(s.nqn);
    await Bun.sleep(50);
  }
}

test("a host not in the ACL is refused and nothing is attached", async () => {
  const s = spec(1);
  await target.exportLvol(s, "acl");
  const err = await initiator.connect(params(s, STRANGER)).catch((e) => e);
  expect(err.kind).toBe("unavailable");
  expect(err.message).toContain(`host ${STRANGER} not allowed`);
  expect(await initiator.list()).toEqual([]);
  expect(await initiator.findNamespaceDevice(s.nqn)).toBeUndefined();
});

test("mkfs, mount, write, disconnect, reconnect, mount: the file is intact and the target serves what the device shows", async () => {
  const s = spec(2);
  await target.exportLvol(s, "data");
  const dir = join(root, "mnt");
  try {
    await initiator.connect(params(s));
    const device = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    expect(device).toMatch(/^\/dev\/loop\d+$/);
    expect(await deviceSize(device)).toBe(32 * MIB);
    await sh("mkfs.ext4", "-q", "-F", device);
    await mounted(device, dir, async () => {
      writeFileSync(join(dir, "hello.txt"), "kept across reconnects\n");
    });
    // What the loop device wrote is what the target serves to anyone allowed.
    const shown = readDevice(device, 64 * 1024);
    expect(shown.some((b) => b !== 0)).toBe(true);
    expect((await servedBytes(s, 64 * 1024)).equals(shown)).toBe(true);

    await initiator.disconnect(s.nqn);
    expect(await initiator.findNamespaceDevice(s.nqn)).toBeUndefined();
    expect(await target.rpc.call("nvmf_subsystem_get_controllers", { nqn: s.nqn })).toEqual([]);
    await initiator.connect(params(s));
    const again = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    await mounted(again, dir, async () => {
      expect(readFileSync(join(dir, "hello.txt"), "utf8")).toBe("kept across reconnects\n");
    });
  } finally {
    await hostExec.run(["umount", dir]);
    await initiator.disconnect(s.nqn);
  }
});

test("a mounted lvol that grows, past a neighbour or in place, is followed on rescan with its bytes", async () => {
  const s = spec(4);
  const bdev = await target.exportLvol(s, "grows");
  // A neighbour right after it: growing means the target moves it (SPDK's blobstore keeps no
  // contiguity anyway); the host sees only a larger namespace.
  await target.exportLvol(spec(3), "neighbour");
  const dir = join(root, "mnt-grow");
  try {
    await initiator.connect(params(s));
    const device = (await initiator.findNamespaceDevice(s.nqn, s.uuid)) as string;
    await sh("mkfs.ext4", "-q", "-F", device);
    await mounted(device, dir, async () => {
      writeFileSync(join(dir, "a.txt"), "before the resize\n");
      await sh("sync", "-f", join(dir, "a.txt"));
      await target.rpc.call("bdev_lvol_resize", { name: bdev, size_in_mib: 48 });
      await rescanUntil(s, device, 48 * MIB);
      expect(await initiator.findNamespaceDevice(s.nqn, s.uuid)).toBe(device);
      writeFileSync(join(dir, "b.txt"), "after the first resize\n");
      await sh("sync", "-f", join(dir, "b.txt"));
      await target.rpc.call("bdev_lvol_resize", { name: bdev, size_in_mib: 64 });
      await rescanUntil(s, device, 64 * MIB);
      writeFileSync(join(dir, "c.txt"), "after the second resize\n");
    });
    await mounted(device, dir, async () => {
      expect(readFileSync(join(dir, "a.txt"), "utf8")).toBe("before the resize\n");
      expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("after the first resize\n");
      expect(readFileSync(join(dir, "c.txt"), "utf8")).toBe("after the second resize\n");
    });
  } finally {
    await hostExec.run(["umount", dir]);
    await initiator.disconnect(s.nqn);
  }
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
      // Frozen, the filesystem has written everything through the device to the target: the
      // snapshot is a clean image.
      await sh("fsfreeze", "--freeze", dir);
      try {
        await target.rpc.call("bdev_lvol_snapshot", { lvol_name: bdev, snapshot_name: "source-snap" });
      } finally {
        await sh("fsfreeze", "--unfreeze", dir);
      }
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
      expect(cloneDevice).not.toBe(device);
      expect(await deviceSize(cloneDevice)).toBe(32 * MIB);
      // The same filesystem UUID as the source: ext4 mounts both at once all the same.
      await mounted(cloneDevice, cloneDir, async () => {
        expect(readFileSync(join(cloneDir, "a.txt"), "utf8")).toBe("before the snapshot\n");
        expect(existsSync(join(cloneDir, "b.txt"))).toBe(false);
        writeFileSync(join(cloneDir, "c.txt"), "only on the clone\n");
      });
      // Unmounted, what the clone's device shows is what the target serves.
      expect((await servedBytes(restored, 256 * 1024)).equals(readDevice(cloneDevice, 256 * 1024))).toBe(
        true,
      );
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
  expect(await initiator.list()).toEqual([]);
});
