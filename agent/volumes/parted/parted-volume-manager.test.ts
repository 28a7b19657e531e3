// PartedVolumeManager against an in-memory disk that answers parted, partx, wipefs and blkdiscard the way
// the real tools do (output formats copied from parted 3.5): the exact commands run for each
// case, the error paths real disks rarely show on demand, and per-disk serialisation.
import { beforeEach, describe, expect, test } from "bun:test";
import { type ErrorKind, StorageError } from "../../../lib/errors.ts";
import type { Exec, ExecOptions, ExecResult } from "../../../lib/exec.ts";
import type { HostFs } from "../../../lib/fs.ts";
import type { DeviceRef, VolumeSpec } from "../../backends/types.ts";
import { PartedVolumeManager, partitionNode } from "./parted-volume-manager.ts";
import { MiB } from "./placement.ts";

const DEV = "/dev/nvme0n1";
const device: DeviceRef = { name: "node-a-s1", serial: "S1", pciAddress: "0000:3b:00.0", blockDevice: DEV };
const spec = (externalId: string, sizeBytes: number): VolumeSpec => ({ externalId, sizeBytes, device });

interface Part {
  number: number;
  start: number;
  end: number;
  name: string;
}

/** One 512-byte-sector disk as parted, the kernel and /dev see it. */
class FakeDisk implements Exec {
  table: "unknown" | "gpt" | "msdos" = "unknown";
  signatures: string[] = [];
  parts: Part[] = [];
  /** Partitions the kernel knows: number -> [start, size] in bytes. */
  kernel = new Map<number, [number, number]>();
  /** Partitions something holds open: the kernel refuses to drop them. */
  busy = new Set<number>();
  /** parted writes the table but cannot tell the kernel (BLKPG failed). */
  informFails = false;
  calls: string[] = [];
  /** The timeout each command was given, by command line. */
  timeouts = new Map<string, number | undefined>();

  constructor(readonly size = 256 * MiB) {}

  async run(argv: readonly string[], opts?: ExecOptions): Promise<ExecResult> {
    const cmd = argv.join(" ");
    this.calls.push(cmd);
    this.timeouts.set(cmd, opts?.timeoutMs);
    const ok = (stdout = ""): ExecResult => ({ code: 0, stdout, stderr: "" });
    const err = (stderr: string, stdout = ""): ExecResult => ({ code: 1, stdout, stderr });
    if (cmd === `parted -m -s ${DEV} unit B print free`) {
      const header = `BYT;\n${DEV}:${this.size}B:nvme:512:512:${this.table}:Fake NVMe:;\n`;
      if (this.table === "unknown") return err(`Error: ${DEV}: unrecognised disk label\n`, header);
      return ok(header + this.#rows());
    }
    if (cmd === `wipefs --no-act --json ${DEV}`) {
      return ok(
        JSON.stringify({
          signatures: this.signatures.map((type) => ({ device: "nvme0n1", offset: "0x0", type })),
        }),
      );
    }
    if (cmd === `parted -s ${DEV} mklabel gpt`) {
      this.table = "gpt";
      this.signatures = ["PMBR", "gpt"];
      return ok();
    }
    if (argv[0] === "blkdiscard") return ok();
    const mkpart = /^parted -s -a none (\S+) unit B mkpart (\S+) (\d+)B (\d+)B$/.exec(cmd);
    if (mkpart) {
      const [start, end] = [Number(mkpart[3]), Number(mkpart[4])];
      if (this.parts.some((p) => start <= p.end && end >= p.start))
        return err("Error: Can't have overlapping partitions.");
      let n = 1;
      while (this.parts.some((p) => p.number === n)) n++;
      this.parts.push({ number: n, start, end, name: mkpart[2] as string });
      if (this.informFails)
        return err("Error: Partition(s) have been written, but we have been unable to inform the kernel");
      this.kernel.set(n, [start, end - start + 1]);
      return ok();
    }
    const update = /^partx -u --nr (\d+) (\S+)$/.exec(cmd);
    if (update) {
      const p = this.parts.find((q) => q.number === Number(update[1]));
      if (p) this.kernel.set(p.number, [p.start, p.end - p.start + 1]);
      return ok();
    }
    const drop = /^partx -d --nr (\d+) (\S+)$/.exec(cmd);
    if (drop) {
      const n = Number(drop[1]);
      if (this.busy.has(n)) return err(`partx: ${DEV}: error deleting partition ${n}`);
      this.kernel.delete(n);
      return ok();
    }
    const rm = /^parted -s (\S+) rm (\d+)$/.exec(cmd);
    if (rm) {
      const n = Number(rm[2]);
      this.parts = this.parts.filter((p) => p.number !== n);
      if (this.busy.has(n))
        return err("Error: Partition(s) have been written, but we have been unable to inform the kernel");
      this.kernel.delete(n);
      return ok();
    }
    if (argv[0] === "udevadm") throw new StorageError("unavailable", "cannot run udevadm: not found");
    return err(`fake disk: unexpected command ${cmd}`);
  }

  #rows(): string {
    const first = 17408;
    const last = this.size - 16896 - 1;
    const rows: string[] = [];
    let at = first;
    for (const p of [...this.parts].sort((a, b) => a.start - b.start)) {
      if (p.start > at) rows.push(`1:${at}B:${p.start - 1}B:${p.start - at}B:free;`);
      rows.push(`${p.number}:${p.start}B:${p.end}B:${p.end - p.start + 1}B::${p.name}:;`);
      at = p.end + 1;
    }
    if (last >= at) rows.push(`1:${at}B:${last}B:${last - at + 1}B:free;`);
    return `${rows.join("\n")}\n`;
  }

  /** /dev and /sys/class/block as the kernel presents this disk's partitions. */
  fs(): HostFs {
    const nodeOf = (n: number) => partitionNode(DEV, n);
    const find = (path: string) =>
      [...this.kernel].find(([n]) => path.includes(`/${nodeOf(n).slice(5)}`) || path === nodeOf(n));
    const no = (): never => {
      throw new Error("not used");
    };
    return {
      root: "/",
      readFile: async (path) => {
        const hit = find(path);
        if (!hit) throw Object.assign(new Error(`ENOENT ${path}`), { code: "ENOENT" });
        return `${path.endsWith("/start") ? hit[1][0] / 512 : hit[1][1] / 512}\n`;
      },
      exists: async (path) => find(path) !== undefined,
      writeFile: no,
      readdir: no,
      readlink: no,
      symlink: no,
      mkdir: no,
      rmdir: no,
      unlink: no,
      isDirectory: no,
    };
  }
}

let disk: FakeDisk;
let mgr: PartedVolumeManager;

beforeEach(() => {
  disk = new FakeDisk();
  mgr = new PartedVolumeManager({ exec: disk, fs: disk.fs(), nodeTimeoutMs: 50 });
});

const PRINT = `parted -m -s ${DEV} unit B print free`;

describe("prepareLayout", () => {
  test("labels a blank disk once, checking for signatures first", async () => {
    await mgr.prepareLayout(device);
    expect(disk.calls).toEqual([
      PRINT,
      `wipefs --no-act --json ${DEV}`,
      `parted -s ${DEV} mklabel gpt`,
      PRINT,
    ]);
    disk.calls = [];
    await mgr.prepareLayout(device);
    expect(disk.calls).toEqual([PRINT]);
  });

  test("never relabels: another label is a precondition failure", async () => {
    disk.table = "msdos";
    const err = await mgr.prepareLayout(device).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("precondition");
    expect((err as StorageError).message).toContain("msdos");
    expect(disk.calls).toEqual([PRINT]);
  });

  test("an unlabelled disk with content (an LVM member) is not blank", async () => {
    disk.signatures = ["LVM2_member"];
    const err = await mgr.prepareLayout(device).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("precondition");
    expect((err as StorageError).message).toContain("LVM2_member");
    expect(disk.table).toBe("unknown");
  });

  test("a device without a kernel block device is invalid", async () => {
    const err = await mgr.prepareLayout({ ...device, blockDevice: undefined }).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("invalid");
    expect(disk.calls).toEqual([]);
  });
});

describe("ensureVolume", () => {
  beforeEach(async () => {
    await mgr.prepareLayout(device);
    disk.calls = [];
  });

  test("creates an aligned, rounded partition after zeroing its whole range", async () => {
    expect(await mgr.ensureVolume(spec("vol-a1", 10 * MiB))).toEqual({
      externalId: "vol-a1",
      backendPath: "/dev/nvme0n1p1",
      sizeBytes: 12 * MiB,
    });
    expect(disk.calls).toEqual([
      PRINT,
      `blkdiscard --force --zeroout --offset 4194304 --length 12582912 ${DEV}`,
      `parted -s -a none ${DEV} unit B mkpart vol-a1 4194304B 16777215B`,
      PRINT,
    ]);
  });

  test("zeroing a large range is given time for a drive that writes every byte (100 MiB/s)", async () => {
    const big = new FakeDisk(64 * 1024 * MiB);
    const m = new PartedVolumeManager({ exec: big, fs: big.fs(), nodeTimeoutMs: 50 });
    await m.prepareLayout(device);
    await m.ensureVolume(spec("vol-big", 40 * 1024 * MiB));
    const zero = [...big.timeouts].find(([cmd]) => cmd.startsWith("blkdiscard"));
    expect(zero?.[1]).toBe(Math.ceil((40 * 1024 * MiB) / ((100 * MiB) / 1000)));
    const small = [...disk.timeouts, ...big.timeouts].filter(([cmd]) => cmd.startsWith("wipefs"));
    expect(small.every(([, t]) => t === 60_000)).toBe(true);
  });

  test("an existing partition is found, not made twice, and a smaller request is fine", async () => {
    await mgr.ensureVolume(spec("vol-a1", 8 * MiB));
    disk.calls = [];
    expect(await mgr.ensureVolume(spec("vol-a1", 8 * MiB))).toEqual(
      await mgr.ensureVolume(spec("vol-a1", 1)),
    );
    expect(disk.calls).toEqual([PRINT, PRINT]);
    expect(disk.parts).toHaveLength(1);
  });

  test("when parted cannot tell the kernel, partx does, and udevadm missing is fine", async () => {
    disk.informFails = true;
    const v = await mgr.ensureVolume(spec("vol-a1", 4 * MiB));
    expect(v.backendPath).toBe("/dev/nvme0n1p1");
    expect(disk.calls.slice(-3)).toEqual([PRINT, `partx -u --nr 1 ${DEV}`, "udevadm settle --timeout=10"]);
  });

  test("a node that never appears is unavailable", async () => {
    disk.informFails = true;
    disk.run = (
      (orig) => async (argv: readonly string[]) =>
        argv[0] === "partx" ? { code: 1, stdout: "", stderr: "partx: failed" } : orig(argv)
    )(disk.run.bind(disk));
    const err = await mgr.ensureVolume(spec("vol-a1", 4 * MiB)).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("unavailable");
    expect((err as StorageError).message).toContain("/dev/nvme0n1p1 did not appear");
  });

  test("a stale kernel partition with another geometry is reported as such", async () => {
    disk.informFails = true;
    disk.kernel.set(1, [100 * MiB, 4 * MiB]);
    disk.busy.add(1);
    disk.run = (
      (orig) => async (argv: readonly string[]) =>
        argv[0] === "partx" ? { code: 1, stdout: "", stderr: "partx: busy" } : orig(argv)
    )(disk.run.bind(disk));
    const err = await mgr.ensureVolume(spec("vol-a1", 4 * MiB)).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("unavailable");
    expect((err as StorageError).message).toContain("older partition 1");
  });

  test.each<[string, () => Promise<unknown>, ErrorKind, string]>([
    [
      "a smaller existing partition",
      async () => {
        await mgr.ensureVolume(spec("vol-a1", 4 * MiB));
        return mgr.ensureVolume(spec("vol-a1", 5 * MiB));
      },
      "already-exists",
      "less than",
    ],
    [
      "two partitions with the name",
      async () => {
        disk.parts.push({ number: 1, start: 4 * MiB, end: 8 * MiB - 1, name: "vol-a1" });
        disk.parts.push({ number: 2, start: 8 * MiB, end: 12 * MiB - 1, name: "vol-a1" });
        return mgr.ensureVolume(spec("vol-a1", 4 * MiB));
      },
      "precondition",
      "refusing to guess",
    ],
    [
      "a disk without GPT",
      async () => {
        disk.table = "unknown";
        return mgr.ensureVolume(spec("vol-a1", 4 * MiB));
      },
      "precondition",
      "prepareLayout",
    ],
    [
      "more than the disk holds",
      () => mgr.ensureVolume(spec("vol-a1", 256 * MiB)),
      "exhausted",
      "no aligned free range",
    ],
    ["a bad externalId", () => mgr.ensureVolume(spec("ext4", 4 * MiB)), "invalid", "externalId"],
    [
      "a name too long for GPT",
      () => mgr.ensureVolume(spec(`vol-${"a".repeat(33)}`, 4 * MiB)),
      "invalid",
      "externalId",
    ],
    ["a zero size", () => mgr.ensureVolume(spec("vol-a1", 0)), "invalid", "size"],
    ["a fractional size", () => mgr.ensureVolume(spec("vol-a1", 1.5)), "invalid", "size"],
    [
      "a by-id path",
      () =>
        mgr.ensureVolume({ ...spec("vol-a1", MiB), device: { ...device, blockDevice: "/dev/disk/by-id/x" } }),
      "invalid",
      "block device",
    ],
  ])("%s", async (_name, call, kind, text) => {
    const err = await call().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe(kind);
    expect((err as StorageError).message).toContain(text);
    expect(disk.calls.filter((c) => c.includes("mkpart")).length).toBeLessThanOrEqual(1);
  });

  test("concurrent calls on one disk are serialised and never overlap", async () => {
    const vols = await Promise.all(
      ["vol-a", "vol-b", "vol-c", "vol-a"].map((id) => mgr.ensureVolume(spec(id, 4 * MiB))),
    );
    expect(vols.map((v) => v.backendPath)).toEqual([
      "/dev/nvme0n1p1",
      "/dev/nvme0n1p2",
      "/dev/nvme0n1p3",
      "/dev/nvme0n1p1",
    ]);
    expect(disk.parts.map((p) => [p.start, p.end])).toEqual([
      [4 * MiB, 8 * MiB - 1],
      [8 * MiB, 12 * MiB - 1],
      [12 * MiB, 16 * MiB - 1],
    ]);
  });
});

describe("findVolume and deleteVolume", () => {
  beforeEach(async () => {
    await mgr.prepareLayout(device);
    await mgr.ensureVolume(spec("vol-a1", 4 * MiB));
    disk.calls = [];
  });

  test("findVolume looks up by name only", async () => {
    expect(await mgr.findVolume(spec("vol-a1", 1))).toEqual({
      externalId: "vol-a1",
      backendPath: "/dev/nvme0n1p1",
      sizeBytes: 4 * MiB,
    });
    expect(await mgr.findVolume(spec("vol-zz", 1))).toBeUndefined();
    expect(disk.calls).toEqual([PRINT, PRINT]);
  });

  test("delete drops the kernel partition first, then the GPT entry; absent is done", async () => {
    await mgr.deleteVolume(spec("vol-a1", 1));
    expect(disk.calls).toEqual([PRINT, `partx -d --nr 1 ${DEV}`, `parted -s ${DEV} rm 1`, PRINT]);
    expect(disk.parts).toEqual([]);
    disk.calls = [];
    await mgr.deleteVolume(spec("vol-a1", 1));
    expect(disk.calls).toEqual([PRINT]);
  });

  test("a partition in use is busy and stays in the table and the kernel", async () => {
    disk.busy.add(1);
    const err = await mgr.deleteVolume(spec("vol-a1", 1)).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("busy");
    expect(disk.calls).toEqual([PRINT, `partx -d --nr 1 ${DEV}`]);
    expect(disk.parts).toHaveLength(1);
    expect(disk.kernel.has(1)).toBe(true);
  });
});

test("partition node names follow the kernel's rule", () => {
  expect(partitionNode("/dev/nvme0n1", 3)).toBe("/dev/nvme0n1p3");
  expect(partitionNode("/dev/loop7", 1)).toBe("/dev/loop7p1");
  expect(partitionNode("/dev/sda", 2)).toBe("/dev/sda2");
});

test("alignment must be a multiple of 1 MiB", () => {
  for (const alignBytes of [0, 512 * 1024, 3 * MiB + 1]) {
    expect(() => new PartedVolumeManager({ exec: disk, fs: disk.fs(), alignBytes })).toThrow(
      expect.objectContaining({ kind: "invalid" }),
    );
  }
  expect(() => new PartedVolumeManager({ exec: disk, fs: disk.fs(), alignBytes: MiB })).not.toThrow();
});
