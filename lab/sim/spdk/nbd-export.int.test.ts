// The emulator's NBD stand-in as root with real FUSE, losetup, mkfs and mount: nbd_start_disk
// gives a loop device whose I/O is the bdev's, the errors are SPDK's, and every way out (stop,
// bdev removal, app stop) leaves no loop device or mount behind.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostExec, runChecked } from "../../../lib/exec.ts";
import { BINARIES, BUN_COMPILE_FLAGS, compileEntries } from "../../cluster/image-plan.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { rpc } from "./raw-rpc-client.ts";

const canRun =
  process.getuid?.() === 0 &&
  existsSync("/dev/fuse") &&
  Bun.which("losetup") !== null &&
  Bun.which("mkfs.ext4") !== null;

let root: string;
let mnt: string;
let emu: SpdkEmulator;

const run = (argv: string[]) => runChecked(hostExec, argv, { timeoutMs: 30_000 });

async function call(method: string, params?: unknown): Promise<{ result?: unknown; error?: unknown }> {
  const { id: _, ...reply } = await rpc(emu.socketPath, method, params);
  return reply;
}

/** Loop devices whose backing file is under the NBD mount. */
async function loopsUnder(dir: string): Promise<string[]> {
  const out = (await run(["losetup", "--list", "--json"])) || '{"loopdevices":[]}';
  const list = (JSON.parse(out) as { loopdevices: { name: string; "back-file": string | null }[] })
    .loopdevices;
  return list.filter((l) => l["back-file"]?.startsWith(`${dir}/`)).map((l) => l.name);
}

const mounted = (dir: string) =>
  readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((l) => l.split(" ")[4] === dir);

async function start(bdev: string): Promise<string> {
  const r = await call("nbd_start_disk", { bdev_name: bdev });
  expect(r.error).toBeUndefined();
  expect(r.result).toMatch(/^\/dev\/loop\d+$/);
  return r.result as string;
}

describe.skipIf(!canRun)("nbd export (root, FUSE, loop devices)", () => {
  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), "nbd-export-"));
    mnt = join(root, "nbd");
    emu = await startSpdkEmulator({
      socketPath: join(root, "spdk.sock"),
      dataDir: join(root, "data"),
      nbdMountpoint: mnt,
      rpcPollMs: 0,
    });
  });

  afterAll(async () => {
    await emu?.close();
    for (const d of await loopsUnder(mnt)) await run(["losetup", "--detach", d]).catch(() => {});
    Bun.spawnSync(["umount", "-l", mnt]);
    rmSync(root, { recursive: true, force: true });
  });

  test("bytes written with O_DIRECT to the device are the bdev's, and the other way round", async () => {
    await call("bdev_malloc_create", { name: "m0", num_blocks: 16384, block_size: 512 });
    const dev = await start("m0");
    const src = join(root, "pattern");
    await Bun.write(src, Buffer.alloc(65536, 0xa5));
    await run(["dd", `if=${src}`, `of=${dev}`, "bs=64k", "count=1", "seek=3", "oflag=direct", "status=none"]);
    const h = emu.bdev("m0");
    expect((await h.read(3 * 65536, 65536)).equals(Buffer.alloc(65536, 0xa5))).toBe(true);
    await h.write(1 << 20, Buffer.alloc(4096, 0x3c));
    const back = join(root, "back");
    await run([
      "dd",
      `if=${dev}`,
      `of=${back}`,
      "bs=4k",
      "count=1",
      "skip=256",
      "iflag=direct",
      "status=none",
    ]);
    expect(readFileSync(back).equals(Buffer.alloc(4096, 0x3c))).toBe(true);
    const size = Number((await run(["blockdev", "--getsize64", dev])).trim());
    expect(size).toBe(16384 * 512);
    expect((await call("nbd_get_disks")).result).toEqual([{ nbd_device: dev, bdev_name: "m0" }]);
    expect((await call("nbd_stop_disk", { nbd_device: dev })).result).toBe(true);
    expect(await loopsUnder(mnt)).toEqual([]);
    expect((await call("nbd_get_disks")).result).toEqual([]);
    expect((await call("bdev_malloc_delete", { name: "m0" })).result).toBe(true);
  });

  test("mkfs.ext4 and mount rw, then ro, on an exported AIO bdev; the bytes land in its file", async () => {
    const file = join(root, "aio.img");
    await run(["truncate", "-s", "64M", file]);
    await call("bdev_aio_create", { name: "a0", filename: file, block_size: 4096 });
    const dev = await start("a0");
    await run(["mkfs.ext4", "-q", "-F", dev]);
    const dir = join(root, "fs");
    await run(["mkdir", "-p", dir]);
    await run(["mount", dev, dir]);
    try {
      // Through a child process: this process serves the FUSE file under the file system, so a
      // synchronous file call here would wait on itself.
      await run(["sh", "-c", `echo "over the bdev" > ${join(dir, "hello")}`]);
    } finally {
      await run(["umount", dir]);
    }
    await run(["mount", "-o", "ro", dev, dir]);
    try {
      expect(await run(["cat", join(dir, "hello")])).toBe("over the bdev\n");
    } finally {
      await run(["umount", dir]);
    }
    expect((await call("nbd_stop_disk", { nbd_device: dev })).result).toBe(true);
    // The file system is the AIO file's: it mounts straight from the file.
    const blkid = await run(["blkid", "-o", "value", "-s", "TYPE", file]);
    expect(blkid.trim()).toBe("ext4");
    await call("bdev_aio_delete", { name: "a0" });
  });

  test("errors are SPDK's", async () => {
    await call("bdev_malloc_create", { name: "m1", num_blocks: 2048, block_size: 512 });
    expect((await call("nbd_start_disk", { bdev_name: "nope" })).error).toEqual({
      code: -19,
      message: "No such device",
    });
    expect((await call("nbd_start_disk", {})).error).toEqual({
      code: -32603,
      message: "spdk_json_decode_object failed",
    });
    expect((await call("nbd_start_disk", { bdev_name: "m1", extra: 1 })).error).toEqual({
      code: -32603,
      message: "spdk_json_decode_object failed",
    });
    expect((await call("nbd_stop_disk", { nbd_device: "/dev/nbd7" })).error).toEqual({
      code: -19,
      message: "No such device",
    });
    expect((await call("nbd_stop_disk")).error).toEqual({
      code: -32603,
      message: "spdk_json_decode_object failed",
    });
    expect((await call("nbd_get_disks", { nbd_device: "/dev/nbd7" })).error).toEqual({
      code: -19,
      message: "No such device",
    });
    const dev = await start("m1");
    expect((await call("nbd_start_disk", { bdev_name: "m1", nbd_device: dev })).error).toEqual({
      code: -16,
      message: "Device or resource busy",
    });
    expect((await call("nbd_start_disk", { bdev_name: "m1", nbd_device: "/dev/nbd0" })).error).toEqual({
      code: -19,
      message: "illegal nbd device /dev/nbd0",
    });
    expect((await call("nbd_get_disks", { nbd_device: dev })).result).toEqual([
      { nbd_device: dev, bdev_name: "m1" },
    ]);
    // SPDK opens the bdev without claiming it: it stays unclaimed and its deletion hot-removes it,
    // which stops the disk first.
    const bdevs = (await call("bdev_get_bdevs", { name: "m1" })).result as { claimed: boolean }[];
    expect(bdevs[0]?.claimed).toBe(false);
    expect((await call("bdev_malloc_delete", { name: "m1" })).result).toBe(true);
    expect((await call("nbd_get_disks")).result).toEqual([]);
    expect(await loopsUnder(mnt)).toEqual([]);
  });

  test("stopping the app with exports left detaches every loop device and unmounts", async () => {
    await call("bdev_malloc_create", { name: "m2", num_blocks: 2048, block_size: 512 });
    await call("bdev_malloc_create", { name: "m3", num_blocks: 2048, block_size: 512 });
    await start("m2");
    await start("m3");
    expect((await loopsUnder(mnt)).length).toBe(2);
    expect(mounted(mnt)).toBe(true);
    await emu.close();
    expect(await loopsUnder(mnt)).toEqual([]);
    expect(mounted(mnt)).toBe(false);
  });
});

describe.skipIf(!canRun)("the compiled nvmf_tgt, as the lab's image holds it", () => {
  test("serves NBD disks (its FUSE reader thread is in the executable) and cleans up on SIGTERM", async () => {
    const dir = mkdtempSync(join(tmpdir(), "nbd-compiled-"));
    const repo = join(import.meta.dir, "../../..");
    const exe = join(dir, "nvmf_tgt");
    const nbdDir = join(dir, "nbd");
    const sock = join(dir, "spdk.sock");
    await runChecked(
      hostExec,
      [process.execPath, ...BUN_COMPILE_FLAGS, ...compileEntries(BINARIES.nvmf_tgt), "--outfile", exe],
      { cwd: repo, timeoutMs: 120_000 },
    );
    const proc = Bun.spawn(
      [exe, "-r", sock, `--sim-data-dir=${join(dir, "data")}`, `--sim-nbd-dir=${nbdDir}`],
      {
        stdout: "ignore",
        stderr: "pipe",
      },
    );
    try {
      const deadline = Date.now() + 20_000;
      while (!(await rpc(sock, "spdk_get_version").catch(() => undefined))) {
        if (Date.now() > deadline || proc.exitCode !== null) {
          throw new Error(`compiled nvmf_tgt not answering: ${await new Response(proc.stderr).text()}`);
        }
        await Bun.sleep(100);
      }
      await rpc(sock, "bdev_malloc_create", { name: "c0", num_blocks: 2048, block_size: 512 });
      const started = await rpc(sock, "nbd_start_disk", { bdev_name: "c0" });
      expect(started.error).toBeUndefined();
      const dev = started.result as string;
      const src = join(dir, "in");
      const back = join(dir, "out");
      await Bun.write(src, Buffer.alloc(8192, 0x5a));
      await run([
        "dd",
        `if=${src}`,
        `of=${dev}`,
        "bs=4k",
        "count=2",
        "seek=5",
        "oflag=direct",
        "status=none",
      ]);
      await run([
        "dd",
        `if=${dev}`,
        `of=${back}`,
        "bs=4k",
        "count=2",
        "skip=5",
        "iflag=direct",
        "status=none",
      ]);
      expect(readFileSync(back).equals(Buffer.alloc(8192, 0x5a))).toBe(true);
      expect(await loopsUnder(nbdDir)).toEqual([dev]);
      proc.kill("SIGTERM");
      expect(await proc.exited).toBe(0);
      expect(await loopsUnder(nbdDir)).toEqual([]);
      expect(mounted(nbdDir)).toBe(false);
    } finally {
      proc.kill("SIGKILL");
      await proc.exited;
      for (const d of await loopsUnder(nbdDir)) await run(["losetup", "--detach", d]).catch(() => {});
      Bun.spawnSync(["umount", "-l", nbdDir]);
      rmSync(dir, { recursive: true, force: true });
    }
  }, 150_000);
});

describe("without the option", () => {
  test("the nbd methods are absent and nothing is mounted", async () => {
    const dir = mkdtempSync(join(tmpdir(), "nbd-off-"));
    const e = await startSpdkEmulator({
      socketPath: join(dir, "spdk.sock"),
      dataDir: join(dir, "data"),
      rpcPollMs: 0,
    });
    try {
      expect((await rpc(e.socketPath, "nbd_get_disks")).error).toEqual({
        code: -32601,
        message: "Method not found",
      });
      expect(existsSync(join(dir, "data", "nbd"))).toBe(false);
    } finally {
      await e.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
