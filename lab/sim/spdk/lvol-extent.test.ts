// Lvols as file extents, driven through the RPC socket: a thick lvol is one run of clusters on the
// drive file (also after a delete left a hole), thin lvols and clones are files of their own (read
// with the lab-side BdevHandle.fileExtent; bdev_get_bdevs prints only SPDK's fields); the file's
// bytes at the extent ARE the lvol's bytes (both ways), a resize grows in place or relocates with
// the bytes, and relocated lvols come back after a crash.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
let root: string;
let emu: SpdkEmulator;
let s: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-extent-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: "0000:5e:00.0", serial: "PHLJ0002", model: "Sim NVMe", sizeBytes: 256 * MIB }],
  });
  s = emu.socketPath;
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "5e:00.0" });
  await call(s, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

type Extent = { filename: string; offset: number; length: number };
type BdevJson = { name: string; driver_specific: Record<string, unknown> };

const bdevJson = async (name: string) => ((await call(s, "bdev_get_bdevs", { name })) as BdevJson[])[0];
/** Where the emulator keeps the bdev's bytes (lab-side; no RPC reply says it). */
const extentOf = async (name: string): Promise<Extent | undefined> => {
  const e = emu.bdev(name).fileExtent();
  return e === undefined ? undefined : { filename: e.path, offset: e.offset, length: e.length };
};
const create = (name: string, mib: number, thin = false) =>
  call(s, "bdev_lvol_create", { lvs_name: "lvs0", lvol_name: name, size_in_mib: mib, thin_provision: thin });
const resize = (name: string, mib: number) => rpc(s, "bdev_lvol_resize", { name, size_in_mib: mib });

function readFile(e: Extent, at: number, n: number): Buffer {
  const fd = openSync(e.filename, "r");
  try {
    const out = Buffer.alloc(n);
    readSync(fd, out, 0, n, e.offset + at);
    return out;
  } finally {
    closeSync(fd);
  }
}
function writeFile(e: Extent, at: number, data: Buffer): void {
  const fd = openSync(e.filename, "r+");
  try {
    writeSync(fd, data, 0, data.length, e.offset + at);
  } finally {
    closeSync(fd);
  }
}

test("thick lvols are one extent of the drive file each; a delete's hole is reused first-fit", async () => {
  // Nothing in a reply says where bytes are: the drive's driver_specific is SPDK's alone.
  expect(Object.keys((await bdevJson("Nvme0n1"))?.driver_specific ?? {})).toEqual(["nvme", "mp_policy"]);
  await create("a", 8);
  await create("b", 12);
  await create("c", 8);
  const [a, b, c] = [await extentOf("lvs0/a"), await extentOf("lvs0/b"), await extentOf("lvs0/c")];
  const file = join(root, "data", "drives", "0000_5e_00.0.img");
  expect(a).toMatchObject({ filename: file, length: 8 * MIB });
  expect(b).toEqual({ filename: file, offset: (a?.offset ?? 0) + 8 * MIB, length: 12 * MIB });
  expect(c).toEqual({ filename: file, offset: (b?.offset ?? 0) + 12 * MIB, length: 8 * MIB });
  // driver_specific is SPDK's lvol object alone.
  expect(Object.keys((await bdevJson("lvs0/a"))?.driver_specific ?? {})).toEqual(["lvol"]);

  // Dirty b's clusters on the drive, delete it, create d in the hole: d reads zeros, both ways.
  await emu.bdev("lvs0/b").write(0, Buffer.alloc(12 * MIB, 0xee));
  expect(await call(s, "bdev_lvol_delete", { name: "lvs0/b" })).toBe(true);
  await create("d", 8);
  const d = await extentOf("lvs0/d");
  expect(d).toEqual({ filename: file, offset: (b as Extent).offset, length: 8 * MIB });
  expect((await emu.bdev("lvs0/d").read(0, 8 * MIB)).equals(Buffer.alloc(8 * MIB))).toBe(true);
  expect(readFile(d as Extent, 0, 8 * MIB).equals(Buffer.alloc(8 * MIB))).toBe(true);
  // The deleted lvol's tail cluster (not reused by d) was deallocated too.
  expect(readFile(b as Extent, 8 * MIB, 4 * MIB).equals(Buffer.alloc(4 * MIB))).toBe(true);
});

test("the file at the extent holds the lvol's bytes, in both directions", async () => {
  const d = (await extentOf("lvs0/d")) as Extent;
  const data = Buffer.alloc(3 * MIB);
  for (let i = 0; i < data.length; i++) data[i] = (i * 7) & 0xff;
  // Across a cluster boundary, through the emulator's data path.
  await emu.bdev("lvs0/d").write(3 * MIB, data);
  expect(readFile(d, 3 * MIB, data.length).equals(data)).toBe(true);
  // Written into the file (as a loop device would), read through the emulator.
  writeFile(d, 7 * MIB, Buffer.from("from the loop device"));
  expect((await emu.bdev("lvs0/d").read(7 * MIB, 20)).toString()).toBe("from the loop device");
  // A partial write through the emulator keeps the file's other bytes of that cluster.
  await emu.bdev("lvs0/d").write(7 * MIB + 100, Buffer.from("!"));
  expect(readFile(d, 7 * MIB, 20).toString()).toBe("from the loop device");
});

test("thin lvols and clones print their own file, an origin keeps its extent, snapshots print none", async () => {
  await create("thin", 8, true);
  await emu.bdev("lvs0/thin").write(0, Buffer.from("x"));
  await create("base", 4);
  const base = (await extentOf("lvs0/base")) as Extent;
  await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs0/base", snapshot_name: "snap" });
  await call(s, "bdev_lvol_clone", { snapshot_name: "lvs0/snap", clone_name: "clone" });
  const lvs = (emu.state().lvstores[0] as { uuid: string }).uuid;
  const own = (name: string) => {
    const uuid = emu.state().lvols.find((l) => l.name === name)?.uuid;
    return join(root, "data", "lvols", lvs, `${uuid}.img`);
  };
  expect(await extentOf("lvs0/thin")).toEqual({ filename: own("thin"), offset: 0, length: 8 * MIB });
  expect(readFile((await extentOf("lvs0/thin")) as Extent, 0, 1).toString()).toBe("x");
  // The origin's bytes stay where a loop device over it would be looking.
  expect(await extentOf("lvs0/base")).toEqual(base);
  expect(await extentOf("lvs0/clone")).toEqual({ filename: own("clone"), offset: 0, length: 4 * MIB });
  // A snapshot is read-only: no extent a loop device could write through.
  expect(await extentOf("lvs0/snap")).toBeUndefined();
  const aio = join(root, "aio.img");
  writeFileSync(aio, Buffer.alloc(8192));
  await call(s, "bdev_aio_create", { name: "aio0", filename: aio, block_size: 4096 });
  expect(await extentOf("aio0")).toEqual({ filename: aio, offset: 0, length: 8192 });
  expect(Object.keys((await bdevJson("aio0"))?.driver_specific ?? {})).toEqual(["aio"]);
  await call(s, "bdev_aio_delete", { name: "aio0" });
});

test("resize grows in place when it can and relocates with the bytes when it cannot", async () => {
  // The most recent lvol on the store is at the end: it grows in place.
  await create("tail", 4);
  const t0 = (await extentOf("lvs0/tail")) as Extent;
  await emu.bdev("lvs0/tail").write(4 * MIB - 5, Buffer.from("tail!"));
  expect((await resize("lvs0/tail", 12)).result).toBe(true);
  const t1 = (await extentOf("lvs0/tail")) as Extent;
  expect(t1).toEqual({ ...t0, length: 12 * MIB });
  expect(readFile(t1, 4 * MIB - 5, 5).toString()).toBe("tail!");
  expect((await emu.bdev("lvs0/tail").read(4 * MIB, 8 * MIB)).equals(Buffer.alloc(8 * MIB))).toBe(true);

  // d is boxed in by c: it moves, its bytes with it; the old place is deallocated.
  const d0 = (await extentOf("lvs0/d")) as Extent;
  const before = await emu.bdev("lvs0/d").read(0, 8 * MIB);
  expect((await resize("lvs0/d", 16)).result).toBe(true);
  const d1 = (await extentOf("lvs0/d")) as Extent;
  expect(d1.offset).not.toBe(d0.offset);
  expect(d1.length).toBe(16 * MIB);
  expect((await emu.bdev("lvs0/d").read(0, 8 * MIB)).equals(before)).toBe(true);
  expect(readFile(d1, 0, 8 * MIB).equals(before)).toBe(true);
  expect(readFile(d1, 8 * MIB, 8 * MIB).equals(Buffer.alloc(8 * MIB))).toBe(true);
  expect(readFile(d0, 0, 8 * MIB).equals(Buffer.alloc(8 * MIB))).toBe(true);
  expect(emu.state().lvols.find((l) => l.name === "d")?.sizeBytes).toBe(16 * MIB);
});

test("an lvol grows in place into the free clusters after it, moves beyond them, and shrinks in place", async () => {
  const a = (await extentOf("lvs0/a")) as Extent;
  const free = emu.state().lvstores[0]?.freeClusters;
  // a is followed by d's old place (now free, 8 MiB): in place up to 16 MiB.
  expect((await resize("lvs0/a", 16)).result).toBe(true);
  expect(await extentOf("lvs0/a")).toEqual({ ...a, length: 16 * MIB });
  expect(emu.state().lvstores[0]?.freeClusters).toBe((free ?? 0) - 2);
  // Beyond that it moves (a live lvol on a real target resizes all the same: its bdev is open
  // over the fabric, never mapped underneath).
  expect((await resize("lvs0/a", 64)).result).toBe(true);
  const moved = (await extentOf("lvs0/a")) as Extent;
  expect(moved.offset).not.toBe(a.offset);
  expect((await resize("lvs0/a", 4)).result).toBe(true);
  expect(await extentOf("lvs0/a")).toEqual({ ...moved, length: 4 * MIB });
});

test("relocated lvols come back at their new place, with their bytes, after a crash", async () => {
  const before = await extentOf("lvs0/d");
  const bytes = await emu.bdev("lvs0/d").read(3 * MIB, 3 * MIB);
  await emu.crash();
  await emu.restart();
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "5e:00.0" });
  expect(await extentOf("lvs0/d")).toEqual(before);
  expect((await emu.bdev("lvs0/d").read(3 * MIB, 3 * MIB)).equals(bytes)).toBe(true);
});
