// Filesystem volume mode over the real socket, as root, with real losetup, blkid, mkfs and mount:
// SNAP (an emulator) attaches the volume, the DPU kernel sees it as a loop device over the
// target's file-backed namespace (SNAP's NBD export stands in), the plugin formats it only when
// blank, mounts it, and hands the directory to SNAP with fsdev_aio_create.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AccessMode, StoragePluginService } from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { type SpdkEmulator, startSpdkEmulator } from "../lab/sim/spdk/emulator.ts";
import { createFabric } from "../lab/sim/spdk/fabric.ts";
import { type Exec, hostExec, runChecked } from "../lib/exec.ts";
import { hostFs } from "../lib/fs.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { parseDpuConfig } from "./config.ts";
import { parseMountinfo } from "./devices/host-filesystem.ts";
import { mountDirFor, namesFor } from "./devices/names.ts";
import { StorageParameterKeys } from "./devices/request.ts";
import { type RunningDpu, runDpu } from "./main.ts";
import { exportOnTarget, loopBlockDevices } from "./testing.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:5a1f0c2e-7d3b-4e6a-9c8d-1b2a3c4d5e6f";
const canRun = process.getuid?.() === 0 && Bun.which("losetup") !== null && Bun.which("mkfs.xfs") !== null;

let root: string;
let target: SpdkEmulator;
let snap: SpdkEmulator;
let targetClient: SpdkClient;
let snapClient: SpdkClient;
let tm: SpdkMethods;
let plugin: RunningDpu;
let client: GrpcJsClient;
const commands: string[][] = [];
let seq = 0;

/** hostExec that records every argv, to count mkfs runs. */
const recordingExec: Exec = {
  run(argv, opts) {
    commands.push([...argv]);
    return hostExec.run(argv, opts);
  },
};

async function startPlugin(): Promise<void> {
  const cfg = parseDpuConfig({
    DISTORT_DPU_SOCKET: join(root, "dpu.sock"),
    DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
    DISTORT_DPU_HOST_NQN: HOST,
    DISTORT_DPU_STATE_DIR: join(root, "state"),
    DISTORT_DPU_KEY_DIR: join(root, "keys"),
    DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
    DISTORT_HEALTH_HOST: "127.0.0.1",
    DISTORT_HEALTH_PORT: "0",
  });
  plugin = await runDpu(cfg, silentLogger, {
    kube: null,
    exec: recordingExec,
    blockDevices: loopBlockDevices({ exec: hostExec, snap: snapClient, target: targetClient }),
  });
  await plugin.initialised;
  client = new GrpcJsClient(plugin.address);
}

async function stopPlugin(): Promise<void> {
  client.close();
  await plugin.stop();
}

/** A volume whose target namespace is an AIO bdev over a sparse file (what a loop device can show). */
async function fileVolume(sizeMiB: number): Promise<Record<string, string>> {
  const n = ++seq;
  const file = join(root, `vol${n}.img`);
  writeFileSync(file, "");
  await runChecked(hostExec, ["truncate", "-s", `${sizeMiB}M`, file]);
  const bdev = await tm.bdevAioCreate({ name: `aio${n}`, filename: file, block_size: 4096 });
  const nqn = `nqn.2026-02.io.distort:fs-${n}`;
  await exportOnTarget(tm, {
    nqn,
    bdevName: bdev,
    listeners: [{ trtype: "TCP", adrfam: "ipv4", traddr: "192.168.60.10", trsvcid: String(5000 + n) }],
    hosts: [{ nqn: HOST }],
  });
  return {
    [VolumeContextKeys.nqn]: nqn,
    [VolumeContextKeys.portalIP]: "192.168.60.10",
    [VolumeContextKeys.portalPort]: String(5000 + n),
    [VolumeContextKeys.transport]: "tcp",
  };
}

const create = (
  volumeId: string,
  volumeContext: Record<string, string>,
  o: { modes?: AccessMode[]; params?: Record<string, string> } = {},
) =>
  client.unary(StoragePluginService.method.createDevice, {
    volumeId,
    accessModes: o.modes ?? [AccessMode.RWO],
    volumeMode: "Filesystem",
    volumeContext,
    storageParameters: o.params ?? {},
  });
const del = (volumeId: string) =>
  client.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName: namesFor(volumeId).fsdev });

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return "OK";
  } catch (err) {
    if (!(err instanceof GrpcCallError)) throw err;
    return `${err.code}:${err.details}`;
  }
}

async function mountsAt(dir: string) {
  return parseMountinfo(await readFile("/proc/self/mountinfo", "utf8")).filter((m) => m.mountPoint === dir);
}
const dirOf = (volumeId: string) => mountDirFor(join(root, "mnt"), namesFor(volumeId));
const mkfsRuns = () => commands.filter((c) => c[0]?.startsWith("mkfs")).length;

describe.skipIf(!canRun)("Filesystem volume mode (root, loop devices)", () => {
  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), "dpufs-"));
    const fabric = createFabric(join(root, "f"));
    target = await startSpdkEmulator({ socketPath: join(root, "t.sock"), dataDir: join(root, "t"), fabric });
    snap = await startSpdkEmulator({ socketPath: join(root, "snap.sock"), dataDir: join(root, "s"), fabric });
    targetClient = new SpdkClient({ socketPath: target.socketPath, logger: silentLogger });
    snapClient = new SpdkClient({ socketPath: snap.socketPath, logger: silentLogger });
    tm = new SpdkMethods(targetClient);
    await startPlugin();
  });

  afterAll(async () => {
    await stopPlugin().catch(() => {});
    // Whatever a failed test left: mounts under our root, then loop devices over our files.
    for (const m of parseMountinfo(await readFile("/proc/self/mountinfo", "utf8")).reverse()) {
      if (m.mountPoint.startsWith(root)) await hostExec.run(["umount", "-l", m.mountPoint]);
    }
    const loops = JSON.parse((await hostExec.run(["losetup", "--list", "--json"])).stdout || "{}") as {
      loopdevices?: { name: string; "back-file": string | null }[];
    };
    for (const l of loops.loopdevices ?? []) {
      if (l["back-file"]?.startsWith(root)) await hostExec.run(["losetup", "--detach", l.name]);
    }
    await snapClient.close();
    await targetClient.close();
    await snap.close();
    await target.close();
    rmSync(root, { recursive: true, force: true });
  });

  test("a blank volume is formatted, mounted and exposed as an fsdev over the mount", async () => {
    const ctx = await fileVolume(64);
    const before = mkfsRuns();
    const { deviceName } = await create("fs-a", ctx);
    const names = namesFor("fs-a");
    expect(deviceName).toBe(names.fsdev);
    const dir = dirOf("fs-a");
    expect(snap.state().fsdevs).toContainEqual({ name: names.fsdev, rootPath: dir });
    const [m] = await mountsAt(dir);
    expect(m?.fsType).toBe("ext4");
    expect(m?.source).toMatch(/^\/dev\/loop\d+$/);
    expect(mkfsRuns()).toBe(before + 1);
    // The filesystem is on the volume as SNAP sees it over the fabric: ext4's magic at 1080.
    expect([...(await snap.bdev(names.bdev).read(1024 + 56, 2))]).toEqual([0x53, 0xef]);
    await writeFile(join(dir, "marker"), "kept");
    await runChecked(hostExec, ["sync", "-f", join(dir, "marker")]);
    const d = await client.unary(StoragePluginService.method.getDevice, { volumeId: "fs-a", deviceName });
    expect(d.volumeMode).toBe("Filesystem");
    expect(d.volumeContext).toEqual(ctx);
  });

  test("CreateDevice again, and after a plugin restart, mounts nothing twice and never reformats", async () => {
    const ctx = (
      await client.unary(StoragePluginService.method.getDevice, {
        volumeId: "fs-a",
        deviceName: namesFor("fs-a").fsdev,
      })
    ).volumeContext;
    const before = mkfsRuns();
    expect((await create("fs-a", ctx)).deviceName).toBe(namesFor("fs-a").fsdev);
    await stopPlugin();
    await startPlugin();
    expect((await create("fs-a", ctx)).deviceName).toBe(namesFor("fs-a").fsdev);
    expect(mkfsRuns()).toBe(before);
    expect(await mountsAt(dirOf("fs-a"))).toHaveLength(1);
    expect(await readFile(join(dirOf("fs-a"), "marker"), "utf8")).toBe("kept");
    const listed = await client.unary(StoragePluginService.method.listDevices, { maxEntries: 0 });
    expect(listed.entries).toContainEqual(
      expect.objectContaining({ volumeId: "fs-a", deviceName: namesFor("fs-a").fsdev }),
    );
  });

  test("DeleteDevice removes the fsdev, unmounts, frees the loop device and detaches; the data stays", async () => {
    const ctx = (
      await client.unary(StoragePluginService.method.getDevice, {
        volumeId: "fs-a",
        deviceName: namesFor("fs-a").fsdev,
      })
    ).volumeContext;
    await del("fs-a");
    expect(snap.state().fsdevs).toEqual([]);
    expect(await mountsAt(dirOf("fs-a"))).toEqual([]);
    expect(await hostFs("/").exists(dirOf("fs-a"))).toBe(false);
    expect(snap.state().nvmeControllers).toEqual([]);
    const loops = (await runChecked(hostExec, ["losetup", "--list", "--json"])) || "{}";
    expect(loops).not.toContain(join(root, "vol1.img"));
    await del("fs-a");
    // The next device of the volume mounts the existing filesystem as it is.
    const before = mkfsRuns();
    await create("fs-a", ctx);
    expect(mkfsRuns()).toBe(before);
    expect(await readFile(join(dirOf("fs-a"), "marker"), "utf8")).toBe("kept");
    await del("fs-a");
  });

  test("read-only (ROX): a blank volume is refused, a formatted one is mounted read-only", async () => {
    const blank = await fileVolume(64);
    const r = await code(create("fs-ro-blank", blank, { modes: [AccessMode.ROX] }));
    expect(r).toStartWith("9:");
    expect(r).toContain("holds no filesystem and is read-only");
    await del("fs-ro-blank");
    const ctx = await fileVolume(64);
    await create("fs-ro", ctx);
    await del("fs-ro");
    await create("fs-ro", ctx, { modes: [AccessMode.ROX] });
    let error = "";
    await writeFile(join(dirOf("fs-ro"), "x"), "y").catch((e: NodeJS.ErrnoException) => {
      error = e.code ?? "";
    });
    expect(error).toBe("EROFS");
    await del("fs-ro");
  });

  test("fsType xfs formats xfs; a volume holding xfs is never reformatted as ext4", async () => {
    const ctx = await fileVolume(320);
    await create("fs-x", ctx, { params: { [StorageParameterKeys.fsType]: "xfs" } });
    expect((await mountsAt(dirOf("fs-x")))[0]?.fsType).toBe("xfs");
    await del("fs-x");
    const r = await code(create("fs-x", ctx, { params: { [StorageParameterKeys.fsType]: "ext4" } }));
    expect(r).toStartWith("9:");
    expect(r).toContain("already holds xfs");
    await del("fs-x");
    // Without a preference the existing xfs is mounted.
    await create("fs-x", ctx);
    expect((await mountsAt(dirOf("fs-x")))[0]?.fsType).toBe("xfs");
    await del("fs-x");
  });
});
