// PartedVolumeManager with real parted, partx, dd and mkfs on a loop device over a sparse file:
// volumes survive a manager restart, deletion and re-creation keep every other partition intact,
// sizes and alignment are exact, a new partition reads as zeros over its whole range, a disk that
// is not blank is never relabelled, and a partition in use is never deleted. Needs root and
// Debian's parted, util-linux, e2fsprogs.
import { afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { mkdir, mkdtemp, open, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { StorageError } from "../../../lib/errors.ts";
import { hostExec, runChecked } from "../../../lib/exec.ts";
import { hostFs } from "../../../lib/fs.ts";
import type { DeviceRef, VolumeSpec } from "../../backends/types.ts";
import { parsePartedPrint } from "./parted-output.ts";
import { PartedVolumeManager } from "./parted-volume-manager.ts";
import { MiB } from "./placement.ts";
import { parseWipefs } from "./signatures.ts";

const DISK_BYTES = 512 * MiB;
const sh = (...argv: string[]) => runChecked(hostExec, argv, { timeoutMs: 60_000 });

let dir: string;
let dev: string;
let device: DeviceRef;
const mounts: string[] = [];

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("parted integration tests need root (losetup, partx, mount)");
  for (const tool of ["parted", "partx", "losetup", "wipefs", "mkfs.ext4", "blkid"]) {
    const r = await hostExec.run(["sh", "-c", `command -v ${tool}`]);
    if (r.code !== 0)
      throw new Error(`${tool} is missing; on Debian: apt-get install -y parted util-linux e2fsprogs`);
  }
});

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "parted-int-"));
  const img = join(dir, "disk.img");
  await writeFile(img, "");
  const fh = await open(img, "r+");
  await fh.truncate(DISK_BYTES);
  await fh.close();
  // --partscan so the kernel makes partition nodes, as it does for an NVMe namespace.
  dev = (await sh("losetup", "--find", "--show", "--partscan", img)).trim();
  device = { name: "loop-disk", serial: "LOOPSERIAL", pciAddress: "0000:00:00.0", blockDevice: dev };
});

afterEach(async () => {
  // Always detach, even after a failed test: unmount what we mounted, then release the loop device.
  for (const m of mounts.splice(0).reverse()) {
    const r = await hostExec.run(["umount", m]);
    if (r.code !== 0) await hostExec.run(["umount", "-l", m]);
  }
  // Forget the name once detached: the kernel hands it to the next attacher, maybe not us.
  if (dev) await hostExec.run(["losetup", "--detach", dev]);
  dev = "";
  await rm(dir, { recursive: true, force: true });
});

const manager = () => new PartedVolumeManager({ exec: hostExec, fs: hostFs("/") });
const spec = (externalId: string, sizeBytes: number): VolumeSpec => ({ externalId, sizeBytes, device });

async function table() {
  return parsePartedPrint(await sh("parted", "-m", "-s", dev, "unit", "B", "print"));
}

/** The kernel's view of a partition node: start and size in bytes. */
async function kernelGeometry(node: string): Promise<{ start: number; size: number }> {
  const sys = `/sys/class/block/${basename(node)}`;
  return {
    start: Number((await readFile(`${sys}/start`, "utf8")).trim()) * 512,
    size: Number((await sh("blockdev", "--getsize64", node)).trim()),
  };
}

async function writeMarker(node: string, text: string): Promise<void> {
  const fh = await open(node, "r+");
  try {
    await fh.write(Buffer.from(text), 0, text.length, 2 * MiB);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function readMarker(node: string, length: number): Promise<string> {
  const fh = await open(node, "r");
  try {
    const buf = Buffer.alloc(length);
    await fh.read(buf, 0, length, 2 * MiB);
    return buf.toString();
  } finally {
    await fh.close();
  }
}

async function mountAt(node: string): Promise<string> {
  const at = join(dir, `mnt-${basename(node)}-${mounts.length}-${Date.now()}`);
  await mkdir(at);
  await sh("mount", node, at);
  mounts.push(at);
  return at;
}

async function unmount(at: string): Promise<void> {
  await sh("umount", at);
  mounts.splice(mounts.indexOf(at), 1);
}

test("three volumes survive a restart; delete and re-create keep the others intact", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const ptuuid = (await sh("blkid", "-p", "-s", "PTUUID", "-o", "value", dev)).trim();
  expect(ptuuid).toMatch(/^[0-9a-f-]{36}$/);
  await mgr.prepareLayout(device);
  expect((await sh("blkid", "-p", "-s", "PTUUID", "-o", "value", dev)).trim()).toBe(ptuuid);

  const a = await mgr.ensureVolume(spec("vol-a", 10 * MiB));
  const b = await mgr.ensureVolume(spec("vol-b", 4 * MiB));
  const c = await mgr.ensureVolume(spec("vol-c", 1));
  expect([a, b, c]).toEqual([
    { externalId: "vol-a", backendPath: `${dev}p1`, sizeBytes: 12 * MiB },
    { externalId: "vol-b", backendPath: `${dev}p2`, sizeBytes: 4 * MiB },
    { externalId: "vol-c", backendPath: `${dev}p3`, sizeBytes: 4 * MiB },
  ]);
  expect(await kernelGeometry(a.backendPath)).toEqual({ start: 4 * MiB, size: 12 * MiB });
  expect(await kernelGeometry(b.backendPath)).toEqual({ start: 16 * MiB, size: 4 * MiB });
  expect(await kernelGeometry(c.backendPath)).toEqual({ start: 20 * MiB, size: 4 * MiB });
  await writeMarker(a.backendPath, "volume-a-data");
  await writeMarker(c.backendPath, "volume-c-data");

  // A new manager (an agent restart) finds all three by name.
  const after = manager();
  expect(await Promise.all(["vol-a", "vol-b", "vol-c"].map((id) => after.findVolume(spec(id, 1))))).toEqual([
    a,
    b,
    c,
  ]);
  expect(await after.ensureVolume(spec("vol-a", 10 * MiB))).toEqual(a);
  expect((await table()).partitions).toHaveLength(3);

  // Leave a filesystem in the middle volume, then delete it.
  await sh("mkfs.ext4", "-q", b.backendPath);
  expect(parseWipefs(await sh("wipefs", "--no-act", "--json", b.backendPath)).map((x) => x.type)).toEqual([
    "ext4",
  ]);
  await after.deleteVolume(spec("vol-b", 4 * MiB));
  expect(await after.findVolume(spec("vol-b", 1))).toBeUndefined();
  expect(await hostFs("/").exists(b.backendPath)).toBe(false);
  await after.deleteVolume(spec("vol-b", 4 * MiB));

  // Re-created with the same externalId it fills the hole, and shows no trace of the old filesystem.
  const b2 = await after.ensureVolume(spec("vol-b", 4 * MiB));
  expect(b2).toEqual(b);
  expect(await kernelGeometry(b2.backendPath)).toEqual({ start: 16 * MiB, size: 4 * MiB });
  expect(parseWipefs(await sh("wipefs", "--no-act", "--json", b2.backendPath))).toEqual([]);
  expect(await after.ensureVolume(spec("vol-b", 4 * MiB))).toEqual(b2);

  // The neighbours' data is untouched, and the table is exactly three aligned, disjoint partitions.
  expect(await readMarker(a.backendPath, 13)).toBe("volume-a-data");
  expect(await readMarker(c.backendPath, 13)).toBe("volume-c-data");
  const parts = (await table()).partitions.sort((x, y) => x.start - y.start);
  expect(parts.map((p) => [p.name, p.start, p.sizeBytes])).toEqual([
    ["vol-a", 4 * MiB, 12 * MiB],
    ["vol-b", 16 * MiB, 4 * MiB],
    ["vol-c", 20 * MiB, 4 * MiB],
  ]);
  for (let i = 1; i < parts.length; i++) {
    expect((parts[i]?.start ?? 0) > (parts[i - 1]?.end ?? 0)).toBe(true);
  }
});

test("a created partition is real: mkfs.ext4, mount, write, read back", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const v = await mgr.ensureVolume(spec("vol-fs", 64 * MiB));
  await sh("mkfs.ext4", "-q", "-L", "vol-fs", v.backendPath);
  const at = await mountAt(v.backendPath);
  await writeFile(join(at, "hello.txt"), "written through the partition\n");
  await unmount(at);
  const again = await mountAt(v.backendPath);
  expect(await readFile(join(again, "hello.txt"), "utf8")).toBe("written through the partition\n");
  expect((await sh("blkid", "-p", "-s", "LABEL", "-o", "value", v.backendPath)).trim()).toBe("vol-fs");
});

test("a new partition reads as zeros over its whole range, whatever a deleted one left there", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const old = await mgr.ensureVolume(spec("vol-old", 64 * MiB));
  // The earlier tenant fills its volume with non-zero bytes (not only headers at the edges).
  const fh = await open(old.backendPath, "r+");
  try {
    const chunk = Buffer.alloc(4 * MiB, 0xa5);
    for (let off = 0; off < old.sizeBytes; off += chunk.length) await fh.write(chunk, 0, chunk.length, off);
    await fh.sync();
  } finally {
    await fh.close();
  }
  const oldStart = (await kernelGeometry(old.backendPath)).start;
  await mgr.deleteVolume(spec("vol-old", 64 * MiB));
  // First fit puts the new volume on the same range.
  const fresh = await mgr.ensureVolume(spec("vol-new", 64 * MiB));
  expect(await kernelGeometry(fresh.backendPath)).toEqual({ start: oldStart, size: old.sizeBytes });
  const rd = await open(fresh.backendPath, "r");
  try {
    const buf = Buffer.alloc(4 * MiB);
    const zeros = Buffer.alloc(4 * MiB);
    const dirty: number[] = [];
    for (let off = 0; off < fresh.sizeBytes; off += buf.length) {
      await rd.read(buf, 0, buf.length, off);
      if (!buf.equals(zeros)) dirty.push(off / MiB);
    }
    // MiB offsets of 4 MiB chunks still holding the old bytes: none.
    expect(dirty).toEqual([]);
  } finally {
    await rd.close();
  }
});

test("a partition in use is never deleted; others change around it", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const a = await mgr.ensureVolume(spec("vol-a", 8 * MiB));
  await sh("mkfs.ext4", "-q", a.backendPath);
  const at = await mountAt(a.backendPath);
  // While vol-a is mounted, other partitions can still come and go.
  const b = await mgr.ensureVolume(spec("vol-b", 8 * MiB));
  await mgr.deleteVolume(spec("vol-b", 1));
  expect(await hostFs("/").exists(b.backendPath)).toBe(false);
  const err = await mgr.deleteVolume(spec("vol-a", 1)).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("busy");
  expect(await mgr.findVolume(spec("vol-a", 1))).toEqual(a);
  expect(await hostFs("/").exists(a.backendPath)).toBe(true);
  await unmount(at);
  await mgr.deleteVolume(spec("vol-a", 1));
  expect((await table()).partitions).toEqual([]);
});

test("a partition held open (as nvmet holds an exported one) is busy, and stays in table and kernel", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const a = await mgr.ensureVolume(spec("vol-a", 8 * MiB));
  // nvmet opens the block device without claiming it exclusively; parted alone would drop the
  // GPT entry and leave the kernel using a range the next volume could be given.
  const holder = Bun.spawn(["sh", "-c", `exec 3<>${a.backendPath}; echo ready; exec sleep 60`], {
    stdout: "pipe",
  });
  try {
    const reader = holder.stdout.getReader();
    await reader.read();
    reader.releaseLock();
    const err = await mgr.deleteVolume(spec("vol-a", 1)).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("busy");
    expect((await table()).partitions.map((p) => p.name)).toEqual(["vol-a"]);
    expect(await kernelGeometry(a.backendPath)).toEqual({ start: 4 * MiB, size: 8 * MiB });
  } finally {
    holder.kill();
    await holder.exited;
  }
  await mgr.deleteVolume(spec("vol-a", 1));
  expect((await table()).partitions).toEqual([]);
  expect(await hostFs("/").exists(a.backendPath)).toBe(false);
});

describe("never relabels a disk that is not blank", () => {
  test("an msdos label stays", async () => {
    await sh("parted", "-s", dev, "mklabel", "msdos");
    const err = await manager()
      .prepareLayout(device)
      .catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("precondition");
    expect((await table()).disk.table).toBe("msdos");
  });

  test("a filesystem on the whole disk stays", async () => {
    await sh("mkfs.ext4", "-q", dev);
    const err = await manager()
      .prepareLayout(device)
      .catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("precondition");
    expect((await sh("blkid", "-p", "-s", "TYPE", "-o", "value", dev)).trim()).toBe("ext4");
  });

  test("an existing GPT and its partitions are kept and worked around", async () => {
    await sh("parted", "-s", dev, "mklabel", "gpt");
    await sh(
      "parted",
      "-s",
      "-a",
      "none",
      dev,
      "unit",
      "B",
      "mkpart",
      "other",
      `${4 * MiB}B`,
      `${8 * MiB - 1}B`,
    );
    const mgr = manager();
    await mgr.prepareLayout(device);
    const v = await mgr.ensureVolume(spec("vol-x", 4 * MiB));
    expect(v.backendPath).toBe(`${dev}p2`);
    expect((await table()).partitions.map((p) => [p.name, p.start])).toEqual([
      ["other", 4 * MiB],
      ["vol-x", 8 * MiB],
    ]);
  });
});

test("more than the disk holds is exhausted and creates nothing", async () => {
  const mgr = manager();
  await mgr.prepareLayout(device);
  const err = await mgr.ensureVolume(spec("vol-big", DISK_BYTES)).catch((e: unknown) => e);
  expect((err as StorageError).kind).toBe("exhausted");
  expect((await table()).partitions).toEqual([]);
});
