// The FUSE block files against the real kernel: losetup, mkfs.ext4, mount, dd, blkdiscard and
// fsck on a loop device over a served file, errors and stalls of the handler, abort, close, and a
// server killed with SIGKILL. Needs root and /dev/fuse. This process serves the mounts, so it
// touches them only through child processes (a synchronous call here would wait on itself).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BlockFileServer, mountBlockFiles } from "./block-files.ts";
import { Errno } from "./fuse-abi.ts";
import { MemoryBlockHandler } from "./memory-block-handler.ts";

const canRun = process.getuid?.() === 0 && existsSync("/dev/fuse");
const MiB = 1 << 20;
// Each test runs several real commands (mkfs, mount, fsck) on a machine that may be loaded.
const SLOW = 120_000;

interface Ran {
  code: number;
  out: string;
  err: string;
}

/** Runs a shell command in a child process (never blocking this thread), killed after `timeoutMs`. */
async function sh(cmd: string, timeoutMs = 60_000): Promise<Ran> {
  const p = Bun.spawn(["bash", "-c", cmd], { stdout: "pipe", stderr: "pipe" });
  const t = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  clearTimeout(t);
  return { code, out: out.trim(), err: err.trim() };
}

async function ok(cmd: string, timeoutMs?: number): Promise<string> {
  const r = await sh(cmd, timeoutMs);
  if (r.code !== 0) throw new Error(`${cmd} failed (${r.code}): ${r.err}`);
  return r.out;
}

/** Polls `f` until it returns true, failing after `ms`. */
async function until(what: string, f: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(20);
  }
}

const mounted = (mp: string) =>
  readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((l) => l.split(" ")[4] === mp);

const root = canRun ? mkdtempSync(join(tmpdir(), "distort-fuse-")) : "";
const loops: string[] = [];
const mountpoints: string[] = [];
const servers: BlockFileServer[] = [];

function dir(name: string): string {
  const d = join(root, name);
  mkdirSync(d, { recursive: true });
  return d;
}

async function serve(name: string): Promise<BlockFileServer> {
  const s = await mountBlockFiles({ mountpoint: dir(name) });
  servers.push(s);
  return s;
}

async function attachLoop(file: string): Promise<string> {
  const dev = await ok(`losetup --find --show --direct-io=off ${file}`);
  loops.push(dev);
  return dev;
}

async function detachLoop(dev: string): Promise<void> {
  await sh(`losetup -d ${dev}`);
  loops.splice(loops.indexOf(dev), 1);
}

afterAll(async () => {
  if (!canRun) return;
  for (const mp of mountpoints.reverse()) await sh(`umount ${mp} || umount -l ${mp}`);
  for (const s of servers) await s.close();
  for (const d of loops) await sh(`losetup -d ${d}`);
  for (const d of readdirSync(root)) await sh(`umount -l ${join(root, d)} 2>/dev/null`);
  await sh(`rm -rf --one-file-system ${root}`);
});

describe.skipIf(!canRun)("FUSE block files", () => {
  let server: BlockFileServer;
  beforeAll(async () => {
    server = await serve("main");
  }, SLOW);

  test(
    "a file served from memory reads back what was written, and disappears when removed",
    async () => {
      const h = new MemoryBlockHandler(4 * MiB);
      server.add("mem", h);
      const file = join(server.mountpoint, "mem");
      expect(server.names()).toContain("mem");
      expect(await ok(`stat -c %s ${file}`)).toBe(String(4 * MiB));
      await ok(`dd if=/dev/urandom of=${root}/src bs=1M count=4 status=none`);
      await ok(`dd if=${root}/src of=${file} bs=256k oflag=direct conv=notrunc status=none`);
      const sums = (await ok(`sha256sum < ${root}/src; sha256sum < ${file}`)).split("\n");
      expect(sums[0]).toBe(sums[1] as string);
      expect(new Bun.CryptoHasher("sha256").update(h.bytes).digest("hex")).toBe(
        sums[0]?.split(" ")[0] as string,
      );
      // An unaligned read is widened to sectors for the handler and cut back for the reader.
      expect(await ok(`dd if=${file} bs=7 skip=3 count=1 status=none | od -An -tx1 | tr -d ' \\n'`)).toBe(
        Buffer.from(h.bytes.subarray(21, 28)).toString("hex"),
      );
      expect(await ok(`ls ${server.mountpoint}`)).toContain("mem");
      expect(() => server.add("mem", h)).toThrow();
      server.remove("mem");
      expect(server.names()).not.toContain("mem");
      expect((await sh(`cat ${file} > /dev/null`)).err).toContain("No such file");
    },
    SLOW,
  );

  test(
    "ext4 on a loop device over a served file survives umount and remount, fsck clean",
    async () => {
      const h = new MemoryBlockHandler(96 * MiB);
      server.add("ext4", h);
      const dev = await attachLoop(join(server.mountpoint, "ext4"));
      await ok(`mkfs.ext4 -q -F ${dev}`);
      const mp = dir("ext4-mnt");
      await ok(`mount ${dev} ${mp}`);
      mountpoints.push(mp);
      await ok(`dd if=/dev/urandom of=${mp}/data bs=1M count=8 status=none conv=fsync`);
      const before = await ok(`sha256sum < ${mp}/data`);
      await ok(`umount ${mp}`);
      await ok(`blockdev --flushbufs ${dev}`);
      const writesBefore = h.counts.writes;
      await ok(`mount ${dev} ${mp}`);
      expect(await ok(`sha256sum < ${mp}/data`)).toBe(before);
      await ok(`umount ${mp}`);
      mountpoints.pop();
      expect(h.counts.writes).toBeGreaterThanOrEqual(writesBefore);
      const fsck = await sh(`e2fsck -fn ${dev}`);
      expect(fsck.code).toBe(0);
      await detachLoop(dev);
      server.remove("ext4");
    },
    SLOW,
  );

  test(
    "flush arrives as flush(): fsync of the loop device, and sync of ext4 on it",
    async () => {
      const h = new MemoryBlockHandler(64 * MiB);
      server.add("flush", h);
      const dev = await attachLoop(join(server.mountpoint, "flush"));
      await ok(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct conv=fsync status=none`);
      expect(h.counts.flushes).toBeGreaterThan(0);
      await ok(`mkfs.ext4 -q -F ${dev}`);
      const mp = dir("flush-mnt");
      await ok(`mount ${dev} ${mp}`);
      mountpoints.push(mp);
      const flushes = h.counts.flushes;
      await ok(`echo hello > ${mp}/f && sync`);
      expect(h.counts.flushes).toBeGreaterThan(flushes);
      await ok(`umount ${mp}`);
      mountpoints.pop();
      await detachLoop(dev);
      server.remove("flush");
    },
    SLOW,
  );

  test(
    "a handler failing with EIO fails dd oflag=direct on the loop device; recovering, writes work again",
    async () => {
      const h = new MemoryBlockHandler(8 * MiB);
      server.add("eio", h);
      const dev = await attachLoop(join(server.mountpoint, "eio"));
      h.fail = Errno.EIO;
      const r = await sh(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct status=none`);
      expect(r.code).not.toBe(0);
      expect(r.err).toContain("Input/output error");
      h.fail = undefined;
      await ok(`dd if=/dev/urandom of=${dev} bs=4k count=1 seek=5 oflag=direct status=none`);
      expect(h.bytes.subarray(5 * 4096, 6 * 4096).some((b) => b !== 0)).toBe(true);
      await detachLoop(dev);
      server.remove("eio");
    },
    SLOW,
  );

  test(
    "blkdiscard on the loop device reaches discard(); blkdiscard -z reads back zeroes",
    async () => {
      const h = new MemoryBlockHandler(16 * MiB);
      server.add("discard", h);
      const dev = await attachLoop(join(server.mountpoint, "discard"));
      h.bytes.fill(0xab);
      await ok(`blkdiscard -o ${MiB} -l ${2 * MiB} ${dev}`);
      expect(h.counts.discards).toBeGreaterThan(0);
      expect(h.counts.discardedBytes).toBe(2 * MiB);
      expect(h.bytes.subarray(MiB, 3 * MiB).every((b) => b === 0)).toBe(true);
      expect(h.bytes[MiB - 1]).toBe(0xab);
      expect(h.bytes[3 * MiB]).toBe(0xab);
      await ok(`blkdiscard -z -o ${4 * MiB} -l ${MiB} ${dev}`);
      expect(h.counts.writeZeroes).toBeGreaterThan(0);
      expect(h.bytes.subarray(4 * MiB, 5 * MiB).every((b) => b === 0)).toBe(true);
      expect(h.bytes[5 * MiB]).toBe(0xab);
      await detachLoop(dev);
      server.remove("discard");
    },
    SLOW,
  );

  test(
    "a handler that stalls does not hold up reads of another file",
    async () => {
      const slow = new MemoryBlockHandler(MiB);
      const fast = new MemoryBlockHandler(MiB);
      fast.bytes.fill(7);
      let release = () => {};
      slow.gate = new Promise<void>((r) => {
        release = r;
      });
      server.add("slow", slow);
      server.add("fast", fast);
      const stalled = sh(
        `dd if=${join(server.mountpoint, "slow")} bs=4k count=1 iflag=direct status=none | wc -c`,
      );
      await until("the slow read to reach its handler", () => slow.inFlight > 0);
      for (let i = 0; i < 3; i++) {
        expect(
          await ok(
            `dd if=${join(server.mountpoint, "fast")} bs=4k count=1 skip=${i} iflag=direct status=none | od -An -tu1 | head -1 | awk '{print $1}'`,
          ),
        ).toBe("7");
      }
      expect(slow.inFlight).toBe(1);
      release();
      expect((await stalled).out).toBe("4096");
      server.remove("slow");
      server.remove("fast");
    },
    SLOW,
  );

  test(
    "close() unmounts, ends the connection and closes /dev/fuse",
    async () => {
      const s = await serve("close");
      s.add("x", new MemoryBlockHandler(MiB));
      const mp = s.mountpoint;
      expect(mounted(mp)).toBe(true);
      const fuseFds = () =>
        readdirSync("/proc/self/fd").filter((fd) => {
          try {
            return readlinkSync(`/proc/self/fd/${fd}`) === "/dev/fuse";
          } catch {
            return false;
          }
        }).length;
      const fdsBefore = fuseFds();
      await s.close();
      await s.close();
      expect(mounted(mp)).toBe(false);
      expect(await Promise.race([s.ended.then(() => "ended"), Bun.sleep(1000).then(() => "pending")])).toBe(
        "ended",
      );
      expect(fuseFds()).toBe(fdsBefore - 1);
      expect(() => s.add("y", new MemoryBlockHandler(MiB))).toThrow();
    },
    SLOW,
  );

  test(
    "close() of a busy mount detaches it and fails the loop device's I/O instead of hanging it",
    async () => {
      const s = await serve("close-busy");
      s.add("x", new MemoryBlockHandler(MiB));
      const dev = await attachLoop(join(s.mountpoint, "x"));
      await ok(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct status=none`);
      await s.close();
      expect(mounted(s.mountpoint)).toBe(false);
      const r = await sh(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct status=none`);
      expect(r.code).not.toBe(0);
      expect(r.err).toContain("Input/output error");
      await detachLoop(dev);
    },
    SLOW,
  );

  test(
    "abort() fails a writer stuck on a stalled handler with EIO",
    async () => {
      const s = await serve("abort");
      const h = new MemoryBlockHandler(MiB);
      s.add("hung", h);
      // Attaching sends a flush (FSYNC), so the handler stalls only once the loop device exists.
      const dev = await attachLoop(join(s.mountpoint, "hung"));
      h.gate = new Promise<void>(() => {}); // never answers from now on
      const writer = sh(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct status=none`);
      await until("the write to reach the handler", () => h.inFlight > 0);
      await s.abort();
      const r = await writer;
      expect(r.code).not.toBe(0);
      expect(r.err).toContain("Input/output error");
      await detachLoop(dev);
      await s.close();
      expect(mounted(s.mountpoint)).toBe(false);
    },
    SLOW,
  );

  test(
    "kill -9 of the serving process fails I/O and leaves a mount that umount cleans",
    async () => {
      const mp = dir("killed");
      const child = Bun.spawn(
        [process.execPath, join(import.meta.dir, "serve-memory-files.ts"), mp, `disk:${8 * MiB}`],
        {
          stdin: "pipe",
          stdout: "pipe",
          stderr: "inherit",
        },
      );
      const reader = child.stdout.getReader();
      const first = await reader.read();
      expect(new TextDecoder().decode(first.value)).toContain("ready");
      const dev = await attachLoop(join(mp, "disk"));
      await ok(`dd if=/dev/urandom of=${dev} bs=4k count=4 oflag=direct status=none`);
      child.kill("SIGKILL");
      await child.exited;
      const w = await sh(`dd if=/dev/zero of=${dev} bs=4k count=1 oflag=direct status=none`);
      expect(w.code).not.toBe(0);
      expect(w.err).toContain("Input/output error");
      const c = await sh(`cat ${mp}/disk > /dev/null`);
      expect(c.code).not.toBe(0);
      expect(c.err).toContain("Transport endpoint is not connected");
      await detachLoop(dev);
      await until(
        "umount of the dead mount",
        async () => (await sh(`umount ${mp}`)).code === 0 || !mounted(mp),
      );
      expect(mounted(mp)).toBe(false);
    },
    SLOW,
  );
});
