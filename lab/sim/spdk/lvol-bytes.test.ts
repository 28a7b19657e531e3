// The bytes of lvols, through the RPC socket and the emulator's files (BdevHandle.fileExtent): snapshots are
// point in time also for writes made straight into the origin's file (as a loop device makes
// them), clones start with their snapshot's bytes and diverge, thin lvols and clones are sparse
// files of their own that grow and shrink, deletes and merges free what they should, SPDK's
// accounting is unchanged throughout, a restart finds everything, and metadata from before lvols
// had homes is upgraded with the bytes kept.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import {
  closeSync,
  existsSync,
  fstatSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const CS = 4 * MIB;
let root: string;
let emu: SpdkEmulator;
let s: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-lvol-bytes-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [
      { pciAddress: "0000:6a:00.0", serial: "PHLJ0003", model: "Sim NVMe", sizeBytes: 256 * MIB },
      { pciAddress: "0000:6b:00.0", serial: "PHLJ0004", model: "Sim NVMe", sizeBytes: 64 * MIB },
    ],
  });
  s = emu.socketPath;
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "6a:00.0" });
  await call(s, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

type Extent = { filename: string; offset: number; length: number };
type LvolJson = {
  thin_provision: boolean;
  snapshot: boolean;
  clone: boolean;
  base_snapshot?: string;
  clones?: string[];
  num_allocated_clusters: number;
};
type BdevJson = { num_blocks: number; driver_specific: { lvol: LvolJson } };

const bdevJson = async (name: string) => ((await call(s, "bdev_get_bdevs", { name })) as BdevJson[])[0];
/** Where the emulator keeps the bdev's bytes (lab-side; no RPC reply says it). */
const extentOf = async (name: string): Promise<Extent> => {
  const e = emu.bdev(name).fileExtent();
  if (e === undefined) throw new Error(`${name} has no file extent`);
  return { filename: e.path, offset: e.offset, length: e.length };
};
const lvolOf = async (name: string) => (await bdevJson(name))?.driver_specific.lvol as LvolJson;
const freeClusters = async (lvs = "lvs0") =>
  ((await call(s, "bdev_lvol_get_lvstores", { lvs_name: lvs })) as { free_clusters: number }[])[0]
    ?.free_clusters as number;
const create = (name: string, mib: number, thin = false) =>
  call(s, "bdev_lvol_create", { lvs_name: "lvs0", lvol_name: name, size_in_mib: mib, thin_provision: thin });
const lvsDir = () => join(root, "data", "lvols", (emu.state().lvstores[0] as { uuid: string }).uuid);

/** Reads bytes of an extent straight from its file, as a loop device would. */
function readExtent(e: Extent, at: number, n: number): Buffer {
  const fd = openSync(e.filename, "r");
  try {
    const out = Buffer.alloc(n);
    readSync(fd, out, 0, n, e.offset + at);
    return out;
  } finally {
    closeSync(fd);
  }
}
/** Writes bytes into an extent straight through its file, as a loop device would. */
function writeExtent(e: Extent, at: number, data: Buffer): void {
  const fd = openSync(e.filename, "r+");
  try {
    writeSync(fd, data, 0, data.length, e.offset + at);
  } finally {
    closeSync(fd);
  }
}
const text = (t: string) => Buffer.from(t);

describe("snapshots and clones", () => {
  test("a snapshot is point in time: later writes to the origin, by file or by bdev, never reach it", async () => {
    await create("origin", 12);
    const e = await extentOf("lvs0/origin");
    // Written before the snapshot: one part as a loop device would, one through the target.
    writeExtent(e, 0, text("loop before"));
    await emu.bdev("lvs0/origin").write(CS + 5, text("bdev before"));
    const free = await freeClusters();
    await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs0/origin", snapshot_name: "snap" });
    // The origin's extent did not move; SPDK's accounting moved its clusters to the snapshot.
    expect(await extentOf("lvs0/origin")).toEqual(e);
    expect(await lvolOf("lvs0/origin")).toMatchObject({
      thin_provision: true,
      clone: true,
      base_snapshot: "snap",
      num_allocated_clusters: 0,
    });
    expect(await lvolOf("lvs0/snap")).toMatchObject({
      snapshot: true,
      clones: ["origin"],
      num_allocated_clusters: 3,
    });
    expect(await freeClusters()).toBe(free);

    writeExtent(e, 0, text("loop after!"));
    await emu.bdev("lvs0/origin").write(CS + 5, text("bdev after!"));
    const snap = emu.bdev("lvs0/snap");
    expect((await snap.read(0, 11)).toString()).toBe("loop before");
    expect((await snap.read(CS + 5, 11)).toString()).toBe("bdev before");
    expect((await snap.read(2 * CS, CS)).equals(Buffer.alloc(CS))).toBe(true);
    const origin = emu.bdev("lvs0/origin");
    expect((await origin.read(0, 11)).toString()).toBe("loop after!");
    expect(readExtent(e, CS + 5, 11).toString()).toBe("bdev after!");
    // The emulator's write into a cluster the origin had not allocated allocates it (copy on
    // write, for the accounting); the loop device's write did not go through the target.
    expect((await lvolOf("lvs0/origin")).num_allocated_clusters).toBe(1);
    expect(await freeClusters()).toBe(free - 1);
    // The snapshot is a file of its own, shown nowhere (read-only), and refuses writes.
    expect(emu.bdev("lvs0/snap").fileExtent()).toBeUndefined();
    expect(Object.keys((await bdevJson("lvs0/snap"))?.driver_specific ?? {})).toEqual(["lvol"]);
    await expect(snap.write(0, text("x"))).rejects.toThrow();
  });

  test("a clone starts with its snapshot's bytes and diverges on its own", async () => {
    await call(s, "bdev_lvol_clone", { snapshot_name: "lvs0/snap", clone_name: "clone" });
    const c = await extentOf("lvs0/clone");
    const uuid = emu.state().lvols.find((l) => l.name === "clone")?.uuid;
    expect(c).toEqual({ filename: join(lvsDir(), `${uuid}.img`), offset: 0, length: 12 * MIB });
    expect(readExtent(c, 0, 11).toString()).toBe("loop before");
    expect(readExtent(c, CS + 5, 11).toString()).toBe("bdev before");
    // Sparse: only what the snapshot holds was written (a few blocks, not 12 MiB).
    expect(statSync(c.filename).blocks * 512).toBeLessThan(CS);
    writeExtent(c, 0, text("clone wrote"));
    await emu.bdev("lvs0/clone").write(2 * CS, text("clone bdev"));
    expect((await emu.bdev("lvs0/clone").read(0, 11)).toString()).toBe("clone wrote");
    expect((await emu.bdev("lvs0/snap").read(0, 11)).toString()).toBe("loop before");
    expect((await emu.bdev("lvs0/origin").read(0, 11)).toString()).toBe("loop after!");
    expect((await emu.bdev("lvs0/snap").read(2 * CS, 10)).equals(Buffer.alloc(10))).toBe(true);
    expect(await lvolOf("lvs0/clone")).toMatchObject({
      clone: true,
      base_snapshot: "snap",
      num_allocated_clusters: 1,
    });
    expect((await lvolOf("lvs0/snap")).clones).toEqual(["origin", "clone"]);
  });

  test("a clone grows and shrinks as its file; bytes cut off read as zeros when it grows again", async () => {
    const c = await extentOf("lvs0/clone");
    await call(s, "bdev_lvol_resize", { name: "lvs0/clone", size_in_mib: 20 });
    expect(await extentOf("lvs0/clone")).toEqual({ ...c, length: 20 * MIB });
    expect(statSync(c.filename).size).toBe(20 * MIB);
    expect((await emu.bdev("lvs0/clone").read(12 * MIB, 8 * MIB)).equals(Buffer.alloc(8 * MIB))).toBe(true);
    await emu.bdev("lvs0/clone").write(16 * MIB, text("tail"));
    await call(s, "bdev_lvol_resize", { name: "lvs0/clone", size_in_mib: 12 });
    expect(statSync(c.filename).size).toBe(12 * MIB);
    await call(s, "bdev_lvol_resize", { name: "lvs0/clone", size_in_mib: 20 });
    expect((await emu.bdev("lvs0/clone").read(16 * MIB, 4)).equals(Buffer.alloc(4))).toBe(true);
    expect((await emu.bdev("lvs0/clone").read(0, 11)).toString()).toBe("clone wrote");
  });

  test("deleting a clone removes its file; deleting the snapshot merges it without touching the origin", async () => {
    const c = await extentOf("lvs0/clone");
    const e = await extentOf("lvs0/origin");
    expect((await rpc(s, "bdev_lvol_delete", { name: "lvs0/snap" })).error?.message).toBe(
      "Operation not permitted",
    );
    await call(s, "bdev_lvol_delete", { name: "lvs0/clone" });
    expect(existsSync(c.filename)).toBe(false);
    const free = await freeClusters();
    await call(s, "bdev_lvol_delete", { name: "lvs0/snap" });
    // SPDK's merge: the origin takes the snapshot's clusters it had not rewritten (2 of 3) and the
    // cluster it rewrote frees the snapshot's copy; no bytes move.
    expect(await lvolOf("lvs0/origin")).toMatchObject({
      clone: false,
      thin_provision: true,
      num_allocated_clusters: 3,
    });
    expect(await freeClusters()).toBe(free + 1);
    expect(await extentOf("lvs0/origin")).toEqual(e);
    expect(readExtent(e, 0, 11).toString()).toBe("loop after!");
    expect((await emu.bdev("lvs0/origin").read(CS + 5, 11)).toString()).toBe("bdev after!");
    expect(readdirSync(lvsDir())).toEqual([]);
  });
});

describe("thin lvols", () => {
  test("live in a sparse file of their own and allocate clusters on first write", async () => {
    const free = await freeClusters();
    await create("thin", 64, true);
    const t = await extentOf("lvs0/thin");
    expect(t).toMatchObject({ offset: 0, length: 64 * MIB });
    expect(t.filename.startsWith(lvsDir())).toBe(true);
    expect(statSync(t.filename).blocks).toBe(0);
    await emu.bdev("lvs0/thin").write(5 * MIB, text("thin!"));
    expect(readExtent(t, 5 * MIB, 5).toString()).toBe("thin!");
    writeExtent(t, 9 * MIB, text("by file"));
    expect((await emu.bdev("lvs0/thin").read(9 * MIB, 7)).toString()).toBe("by file");
    expect((await lvolOf("lvs0/thin")).num_allocated_clusters).toBe(1);
    expect(await freeClusters()).toBe(free - 1);
  });

  test("an unmap punches the lvol's own file: zeros read back, no cluster is allocated, no zeros written", async () => {
    await create("trim", 64, true);
    const t = await extentOf("lvs0/trim");
    const bdev = emu.bdev("lvs0/trim");
    await bdev.write(CS, Buffer.alloc(CS, 0x7e));
    const free = await freeClusters();
    const blocks = statSync(t.filename).blocks;
    expect(blocks).toBeGreaterThanOrEqual(CS / 512);
    // mkfs.ext4's discard of the whole device: before, the target wrote it as zeros.
    await bdev.unmap(0, 64 * MIB);
    expect((await bdev.read(CS, CS)).equals(Buffer.alloc(CS))).toBe(true);
    expect(readExtent(t, CS, 4096).equals(Buffer.alloc(4096))).toBe(true);
    expect(statSync(t.filename).blocks).toBeLessThan(blocks);
    expect((await lvolOf("lvs0/trim")).num_allocated_clusters).toBe(1);
    expect(await freeClusters()).toBe(free);
    await call(s, "bdev_lvol_delete", { name: "lvs0/trim" });
  });

  test("an unmap of a thick lvol zeros its run of drive clusters and nothing around it", async () => {
    await create("thick-trim", 8);
    const e = await extentOf("lvs0/thick-trim");
    const bdev = emu.bdev("lvs0/thick-trim");
    await bdev.write(0, Buffer.alloc(2 * CS, 0x3c));
    await bdev.unmap(4096, CS);
    expect((await bdev.read(0, 4096)).equals(Buffer.alloc(4096, 0x3c))).toBe(true);
    expect((await bdev.read(4096, CS)).equals(Buffer.alloc(CS))).toBe(true);
    expect(readExtent(e, 4096 + CS, 4096).equals(Buffer.alloc(4096, 0x3c))).toBe(true);
    // A snapshot refuses it, as it refuses writes.
    await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs0/thick-trim", snapshot_name: "trim-snap" });
    await expect(emu.bdev("lvs0/trim-snap").unmap(0, 4096)).rejects.toThrow();
    await call(s, "bdev_lvol_delete", { name: "lvs0/thick-trim" });
    await call(s, "bdev_lvol_delete", { name: "lvs0/trim-snap" });
  });
});

describe("restart", () => {
  test("after a crash every lvol is found again at the same extent with the same bytes; stray files go", async () => {
    await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs0/thin", snapshot_name: "thin-snap" });
    await call(s, "bdev_lvol_clone", { snapshot_name: "lvs0/thin-snap", clone_name: "thin-clone" });
    await emu.bdev("lvs0/thin-clone").write(0, text("clone of thin"));
    const names = ["origin", "thin", "thin-clone"];
    const extents = await Promise.all(names.map((n) => extentOf(`lvs0/${n}`)));
    const before = emu.state().lvols;
    const free = await freeClusters();
    const dir = lvsDir();
    await emu.crash();
    // A file left by a crash between creating it and persisting its lvol.
    writeFileSync(join(dir, "00000000-0000-4000-8000-000000000000.img"), "stray");
    await emu.restart();
    await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "6a:00.0" });
    expect(emu.state().lvols).toEqual(before);
    expect(await freeClusters()).toBe(free);
    expect(await Promise.all(names.map((n) => extentOf(`lvs0/${n}`)))).toEqual(extents);
    expect((await emu.bdev("lvs0/origin").read(0, 11)).toString()).toBe("loop after!");
    expect((await emu.bdev("lvs0/thin-snap").read(5 * MIB, 5)).toString()).toBe("thin!");
    expect((await emu.bdev("lvs0/thin-clone").read(0, 13)).toString()).toBe("clone of thin");
    expect((await emu.bdev("lvs0/thin-clone").read(9 * MIB, 7)).toString()).toBe("by file");
    expect(readdirSync(dir).sort()).toHaveLength(3);
    expect(existsSync(join(dir, "00000000-0000-4000-8000-000000000000.img"))).toBe(false);
  });

  test("deleting the lvstore removes its directory of lvol files", async () => {
    const dir = lvsDir();
    expect(existsSync(dir)).toBe(true);
    await call(s, "bdev_lvol_delete_lvstore", { lvs_name: "lvs0" });
    expect(existsSync(dir)).toBe(false);
  });
});

describe("metadata from before lvols had homes", () => {
  test("is upgraded on load: bytes copied into files, a contiguous thick lvol left in place", async () => {
    // What the emulator used to write: a thick lvol at clusters 1-2, a snapshot at 3-4 whose second
    // cluster was never written, and its origin (a thin clone) that rewrote cluster 1 into 5.
    const md = {
      format: "distort-sim-lvstore",
      version: 1,
      uuid: "6d7a2c1e-5b3f-4a9d-8e2f-0c1b2a394857",
      name: "oldlvs",
      clusterSize: CS,
      blockSize: 4096,
      totalClusters: 16,
      mdClusters: 1,
      lvols: [
        {
          uuid: "0e0f7b4a-1111-4c2d-9e3f-000000000001",
          name: "thick",
          thin: false,
          snapshot: false,
          parent: null,
          cloneSeq: 0,
          numClusters: 2,
          clusters: [[0, 1, 2]],
          written: [[0, 2, 0]],
        },
        {
          uuid: "0e0f7b4a-1111-4c2d-9e3f-000000000002",
          name: "snap",
          thin: false,
          snapshot: true,
          parent: null,
          cloneSeq: 1,
          numClusters: 2,
          clusters: [[0, 3, 2]],
          written: [[0, 1, 0]],
        },
        {
          uuid: "0e0f7b4a-1111-4c2d-9e3f-000000000003",
          name: "orig",
          thin: true,
          snapshot: false,
          parent: "0e0f7b4a-1111-4c2d-9e3f-000000000002",
          cloneSeq: 2,
          numClusters: 2,
          clusters: [[1, 5, 1]],
          written: [[1, 1, 0]],
        },
      ],
    };
    const json = Buffer.from(JSON.stringify(md));
    const head = Buffer.alloc(16);
    head.write("DSTLVS01", 0, "latin1");
    head.writeUInt32LE(json.length, 8);
    head.writeUInt32LE(Bun.hash.crc32(json), 12);
    const drive = join(root, "data", "drives", "0000_6b_00.0.img");
    const fd = openSync(drive, "r+");
    try {
      const put = (at: number, b: Buffer) => writeSync(fd, b, 0, b.length, at);
      put(0, Buffer.concat([head, json]));
      put(1 * CS, text("thick 0"));
      put(2 * CS, text("thick 1"));
      put(3 * CS, text("snap 0"));
      put(4 * CS, text("never written: reads as zeros"));
      put(5 * CS, text("orig 1"));
      expect(fstatSync(fd).size).toBe(64 * MIB);
    } finally {
      closeSync(fd);
    }
    await call(s, "bdev_nvme_attach_controller", { name: "Nvme1", trtype: "PCIe", traddr: "6b:00.0" });
    const read = (lvol: string, at: number, n: number) => emu.bdev(`oldlvs/${lvol}`).read(at, n);
    expect((await read("thick", 0, 7)).toString()).toBe("thick 0");
    expect((await read("thick", CS, 7)).toString()).toBe("thick 1");
    expect((await read("snap", 0, 6)).toString()).toBe("snap 0");
    expect((await read("snap", CS, 6)).equals(Buffer.alloc(6))).toBe(true);
    expect((await read("orig", 0, 6)).toString()).toBe("snap 0");
    expect((await read("orig", CS, 6)).toString()).toBe("orig 1");
    expect((await extentOf("oldlvs/thick")).offset).toBe(CS);
    expect((await extentOf("oldlvs/orig")).filename).toEndWith("0e0f7b4a-1111-4c2d-9e3f-000000000003.img");
    expect(await lvolOf("oldlvs/orig")).toMatchObject({
      clone: true,
      base_snapshot: "snap",
      num_allocated_clusters: 1,
    });
    expect(await freeClusters("oldlvs")).toBe(15 - 5);
    // Upgraded on the drive: the next load reads homes (the old clusters may now be reused).
    await call(s, "bdev_nvme_detach_controller", { name: "Nvme1" });
    await call(s, "bdev_nvme_attach_controller", { name: "Nvme1", trtype: "PCIe", traddr: "6b:00.0" });
    await call(s, "bdev_lvol_create", { lvs_name: "oldlvs", lvol_name: "new", size_in_mib: 8 });
    expect((await extentOf("oldlvs/new")).offset).toBe(3 * CS);
    expect((await read("orig", CS, 6)).toString()).toBe("orig 1");
    expect((await read("snap", 0, 6)).toString()).toBe("snap 0");
  });
});
