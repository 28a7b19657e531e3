// Crash points: for every change CreateDevice and DeleteDevice make (a record write, a SNAP
// mutation, a host command), the plugin dies right after that change took effect and before it
// saw the reply; a fresh plugin on the same state and SNAP is then asked the same call again. It
// must converge with no duplicate and no leak: one controller with every path, one key, or, after
// a delete, nothing at all. Block mode (DH-HMAC-CHAP, two paths) always; Filesystem mode as root.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AccessMode, StoragePluginService } from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { type SpdkEmulator, startSpdkEmulator } from "../lab/sim/spdk/emulator.ts";
import { createFabric } from "../lab/sim/spdk/fabric.ts";
import { StorageError } from "../lib/errors.ts";
import { type Exec, hostExec, runChecked } from "../lib/exec.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { silentLogger } from "../lib/log.ts";
import { type CallOptions, SpdkClient, type SpdkRpc } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { parseDpuConfig } from "./config.ts";
import { parseMountinfo } from "./devices/host-filesystem.ts";
import { mountDirFor, namesFor } from "./devices/names.ts";
import { ALTERNATE_PORTALS_KEY, StorageParameterKeys } from "./devices/request.ts";
import type { DeviceRecord, DeviceStore } from "./devices/state-store.ts";
import { type RunningDpu, runDpu } from "./main.ts";
import { exportOnTarget, loopBlockDevices, mapSecretReader } from "./testing.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:7c6b5a49-3827-4165-a4b3-c2d1e0f9a8b7";
// A valid DH-HMAC-CHAP secret (nvme gen-dhchap-key; check-dhchap-key: CRC ff1c9c56): the target now
// authenticates the initiator with it.
const SECRET = "DHHC-1:00:9gb8PYK0rmteVJT0wi+Kpv1Z5AXoNQAD0KKp/JiQgzNWnBz/:";
const NS = "distort-system";
const canRunFs = process.getuid?.() === 0 && Bun.which("losetup") !== null;

const SNAP_MUTATIONS = new Set([
  "bdev_nvme_attach_controller",
  "bdev_nvme_detach_controller",
  "keyring_file_add_key",
  "keyring_file_remove_key",
  "fsdev_aio_create",
  "fsdev_aio_delete",
]);
const HOST_MUTATIONS = /^(losetup --find|losetup --detach|mkfs|mount|umount)/;

/** Counts changes as they take effect and kills the plugin (every later call fails) after the Nth. */
class CrashSwitch {
  changes = 0;
  dead = false;
  readonly log: string[] = [];
  constructor(private readonly crashAfter: number) {}

  check(): void {
    if (this.dead) throw new StorageError("unavailable", "plugin process is dead (crash injected)");
  }

  /** Called after a change took effect. */
  changed(what: string): void {
    this.log.push(what);
    if (++this.changes === this.crashAfter) {
      this.dead = true;
      throw new StorageError("unavailable", `crash injected after ${what}`);
    }
  }
}

function crashingRpc(inner: SpdkRpc, sw: CrashSwitch): SpdkRpc {
  return {
    async call(method: string, params?: object, opts?: CallOptions) {
      sw.check();
      const out = await inner.call(method, params, opts);
      if (SNAP_MUTATIONS.has(method)) sw.changed(method);
      return out;
    },
    serialize: (key, fn) => inner.serialize(key, fn),
  };
}

function crashingExec(inner: Exec, sw: CrashSwitch): Exec {
  return {
    async run(argv, opts) {
      sw.check();
      const r = await inner.run(argv, opts);
      if (r.code === 0 && HOST_MUTATIONS.test(argv.join(" "))) {
        sw.changed(argv[1]?.startsWith("--") ? `${argv[0]} ${argv[1]}` : String(argv[0]));
      }
      return r;
    },
  };
}

function crashingStore(inner: DeviceStore, sw: CrashSwitch): DeviceStore {
  return {
    async get(id) {
      sw.check();
      return inner.get(id);
    },
    async list() {
      sw.check();
      return inner.list();
    },
    check: async () => inner.check(),
    async put(r: DeviceRecord) {
      sw.check();
      await inner.put(r);
      sw.changed(`record ${r.phase}`);
    },
    async delete(id) {
      sw.check();
      await inner.delete(id);
      sw.changed("record delete");
    },
  };
}

let root: string;
let target: SpdkEmulator;
let snap: SpdkEmulator;
let targetClient: SpdkClient;
let snapClient: SpdkClient;
let tm: SpdkMethods;
const secrets = new Map([[`${NS}/chap/secret`, SECRET]]);

async function withPlugin<T>(
  crashAfter: number,
  fn: (c: GrpcJsClient) => Promise<T>,
): Promise<{ out?: T; err?: string; sw: CrashSwitch }> {
  const sw = new CrashSwitch(crashAfter);
  const exec = crashingExec(hostExec, sw);
  const plugin: RunningDpu = await runDpu(
    parseDpuConfig({
      DISTORT_DPU_SOCKET: join(root, "dpu.sock"),
      DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
      DISTORT_DPU_HOST_NQN: HOST,
      DISTORT_DPU_STATE_DIR: join(root, "state"),
      DISTORT_DPU_KEY_DIR: join(root, "keys"),
      DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
      DISTORT_DPU_SECRET_NAMESPACE: NS,
      DISTORT_HEALTH_HOST: "127.0.0.1",
      DISTORT_HEALTH_PORT: "0",
    }),
    silentLogger,
    {
      kube: null,
      secrets: mapSecretReader(secrets),
      exec,
      wrapSnapRpc: (rpc) => crashingRpc(rpc, sw),
      wrapStore: (s) => crashingStore(s, sw),
      blockDevices: loopBlockDevices({ exec, snap: crashingRpc(snapClient, sw), target: targetClient }),
    },
  );
  await plugin.initialised;
  const client = new GrpcJsClient(plugin.address);
  try {
    return { out: await fn(client), sw };
  } catch (err) {
    if (!(err instanceof GrpcCallError)) throw err;
    return { err: `${err.code}:${err.details}`, sw };
  } finally {
    client.close();
    await plugin.stop();
  }
}

let seq = 0;

async function lvolVolume(): Promise<{ ctx: Record<string, string>; file?: string }> {
  const n = ++seq;
  const nqn = `nqn.2026-02.io.distort:crash-${n}`;
  const lvol = await tm.bdevLvolCreate({
    lvs_name: "lvs0",
    lvol_name: `c${n}`,
    size_in_mib: 4,
    thin_provision: true,
  });
  await exportOnTarget(tm, {
    nqn,
    bdevName: lvol,
    listeners: [
      { trtype: "TCP", adrfam: "ipv4", traddr: "10.30.0.1", trsvcid: String(6000 + n) },
      { trtype: "TCP", adrfam: "ipv6", traddr: "fd00:30::1", trsvcid: String(6000 + n) },
    ],
    hosts: [{ nqn: HOST, dhchapKey: "tkey" }],
  });
  return {
    ctx: {
      [VolumeContextKeys.nqn]: nqn,
      [VolumeContextKeys.portalIP]: "10.30.0.1",
      [VolumeContextKeys.portalPort]: String(6000 + n),
      [VolumeContextKeys.transport]: "tcp",
      [VolumeContextKeys.namespaceUUID]: lvol,
      [ALTERNATE_PORTALS_KEY]: "fd00:30::1",
    },
  };
}

async function fileVolume(): Promise<{ ctx: Record<string, string>; file?: string }> {
  const n = ++seq;
  const file = join(root, `f${n}.img`);
  writeFileSync(file, "");
  await runChecked(hostExec, ["truncate", "-s", "64M", file]);
  const bdev = await tm.bdevAioCreate({ name: `aio${n}`, filename: file, block_size: 4096 });
  const nqn = `nqn.2026-02.io.distort:crashfs-${n}`;
  await exportOnTarget(tm, {
    nqn,
    bdevName: bdev,
    listeners: [{ trtype: "TCP", adrfam: "ipv4", traddr: "10.31.0.1", trsvcid: String(6000 + n) }],
    hosts: [{ nqn: HOST }],
  });
  return {
    ctx: {
      [VolumeContextKeys.nqn]: nqn,
      [VolumeContextKeys.portalIP]: "10.31.0.1",
      [VolumeContextKeys.portalPort]: String(6000 + n),
      [VolumeContextKeys.transport]: "tcp",
    },
    file,
  };
}

const PARAMS = {
  [StorageParameterKeys.dhchapSecretName]: "chap",
  [StorageParameterKeys.dhchapSecretKey]: "secret",
};

function createReq(volumeId: string, ctx: Record<string, string>, mode: "Block" | "Filesystem") {
  return {
    volumeId,
    accessModes: [AccessMode.RWO],
    volumeMode: mode,
    volumeContext: ctx,
    storageParameters: mode === "Block" ? PARAMS : {},
  };
}

async function loopsOver(file: string): Promise<number> {
  const text = (await runChecked(hostExec, ["losetup", "--list", "--json"])) || "{}";
  const j = JSON.parse(text) as { loopdevices?: { "back-file": string | null }[] };
  return (j.loopdevices ?? []).filter((l) => l["back-file"] === file).length;
}

async function mountsAt(dir: string): Promise<number> {
  return parseMountinfo(await readFile("/proc/self/mountinfo", "utf8")).filter((m) => m.mountPoint === dir)
    .length;
}

/** The volume's device is whole and single: one controller with every path, one key, one record. */
async function assertCreated(volumeId: string, mode: "Block" | "Filesystem", c: GrpcJsClient): Promise<void> {
  const names = namesFor(volumeId);
  const s = snap.state();
  const ctrls = s.nvmeControllers.filter((x) => x.name === names.controller);
  expect(ctrls).toHaveLength(1);
  const detail = await new SpdkMethods(snapClient).bdevNvmeGetControllers(names.controller);
  expect(detail[0]?.ctrlrs).toHaveLength(mode === "Block" ? 2 : 1);
  expect(s.keys.filter((k) => k.name === names.key)).toHaveLength(mode === "Block" ? 1 : 0);
  expect(s.nvmeControllers.filter((x) => x.hostnqn === HOST)).toHaveLength(1);
  const deviceName = mode === "Block" ? names.bdev : names.fsdev;
  const d = await c.unary(StoragePluginService.method.getDevice, { volumeId, deviceName });
  expect(d.volumeMode).toBe(mode);
  if (mode === "Filesystem") {
    expect(s.fsdevs).toEqual([{ name: names.fsdev, rootPath: mountDirFor(join(root, "mnt"), names) }]);
    expect(await mountsAt(mountDirFor(join(root, "mnt"), names))).toBe(1);
  }
}

/** Nothing of the volume is left anywhere. */
async function assertGone(volumeId: string, file?: string): Promise<void> {
  const names = namesFor(volumeId);
  const s = snap.state();
  expect(s.nvmeControllers).toEqual([]);
  expect(s.keys).toEqual([]);
  expect(s.fsdevs).toEqual([]);
  expect(await Bun.file(join(root, "keys", names.key)).exists()).toBe(false);
  expect(await mountsAt(mountDirFor(join(root, "mnt"), names))).toBe(0);
  if (file) expect(await loopsOver(file)).toBe(0);
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "dpucr-"));
  const fabric = createFabric(join(root, "f"));
  target = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "S5E", model: "Sim", sizeBytes: 256 * MIB }],
  });
  snap = await startSpdkEmulator({ socketPath: join(root, "snap.sock"), dataDir: join(root, "s"), fabric });
  targetClient = new SpdkClient({ socketPath: target.socketPath, logger: silentLogger });
  snapClient = new SpdkClient({ socketPath: snap.socketPath, logger: silentLogger });
  tm = new SpdkMethods(targetClient);
  await tm.bdevNvmeAttachController({ name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  await tm.bdevLvolCreateLvstore({ bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  const keyPath = join(root, "tkey");
  writeFileSync(keyPath, SECRET, { mode: 0o600 });
  await tm.keyringFileAddKey({ name: "tkey", path: keyPath });
});

afterAll(async () => {
  for (const m of parseMountinfo(await readFile("/proc/self/mountinfo", "utf8")).reverse()) {
    if (m.mountPoint.startsWith(root)) await hostExec.run(["umount", "-l", m.mountPoint]);
  }
  const j = JSON.parse((await hostExec.run(["losetup", "--list", "--json"])).stdout || "{}") as {
    loopdevices?: { name: string; "back-file": string | null }[];
  };
  for (const l of j.loopdevices ?? [])
    if (l["back-file"]?.startsWith(root)) await hostExec.run(["losetup", "--detach", l.name]);
  await snapClient.close();
  await targetClient.close();
  await snap.close();
  await target.close();
  rmSync(root, { recursive: true, force: true });
});

/** Runs every crash point of CreateDevice, then of DeleteDevice, for one kind of volume. */
async function crashSeries(
  mode: "Block" | "Filesystem",
  newVolume: () => Promise<{ ctx: Record<string, string>; file?: string }>,
) {
  const points: string[] = [];
  for (let n = 1; ; n++) {
    const volumeId = `${mode}-create-${n}`;
    const { ctx, file } = await newVolume();
    const req = createReq(volumeId, ctx, mode);
    const first = await withPlugin(n, (c) => c.unary(StoragePluginService.method.createDevice, req));
    if (!first.sw.dead) {
      // Fewer changes than n: every point is covered. This device came up whole; remove it.
      expect(first.err).toBeUndefined();
      await withPlugin(0, async (c) => {
        await assertCreated(volumeId, mode, c);
        await c.unary(StoragePluginService.method.deleteDevice, {
          volumeId,
          deviceName: first.out?.deviceName ?? "",
        });
      });
      await assertGone(volumeId, file);
      break;
    }
    points.push(`create after ${first.sw.log.at(-1)}`);
    const again = await withPlugin(0, async (c) => {
      const r = await c.unary(StoragePluginService.method.createDevice, req);
      await assertCreated(volumeId, mode, c);
      await c.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName: r.deviceName });
    });
    expect(again.err).toBeUndefined();
    // Formatted at most once, attached once per path, whatever the point of the crash.
    const all = [...first.sw.log, ...again.sw.log];
    expect(all.filter((x) => x.startsWith("mkfs")).length).toBeLessThanOrEqual(1);
    expect(all.filter((x) => x === "bdev_nvme_attach_controller").length).toBe(mode === "Block" ? 2 : 1);
    await assertGone(volumeId, file);
  }
  for (let n = 1; ; n++) {
    const volumeId = `${mode}-delete-${n}`;
    const { ctx, file } = await newVolume();
    const req = createReq(volumeId, ctx, mode);
    const names = namesFor(volumeId);
    const deviceName = mode === "Block" ? names.bdev : names.fsdev;
    const made = await withPlugin(0, (c) => c.unary(StoragePluginService.method.createDevice, req));
    expect(made.err).toBeUndefined();
    const first = await withPlugin(n, (c) =>
      c.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName }),
    );
    if (!first.sw.dead) {
      expect(first.err).toBeUndefined();
      await assertGone(volumeId, file);
      break;
    }
    points.push(`delete after ${first.sw.log.at(-1)}`);
    const again = await withPlugin(0, async (c) => {
      await c.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName });
      const get = await c
        .unary(StoragePluginService.method.getDevice, { volumeId, deviceName })
        .catch((e: GrpcCallError) => e.code);
      expect(get).toBe(5);
    });
    expect(again.err).toBeUndefined();
    await assertGone(volumeId, file);
  }
  return points;
}

test("Block with DH-HMAC-CHAP and two paths: every crash point converges", async () => {
  const points = await crashSeries("Block", lvolVolume);
  // record, key, path 1, path 2, record ready; detach, key, record delete.
  expect(points).toEqual([
    "create after record creating",
    "create after keyring_file_add_key",
    "create after bdev_nvme_attach_controller",
    "create after bdev_nvme_attach_controller",
    "create after record ready",
    "delete after bdev_nvme_detach_controller",
    "delete after keyring_file_remove_key",
    "delete after record delete",
  ]);
});

describe.skipIf(!canRunFs)("Filesystem (root)", () => {
  test("every crash point converges: no second mkfs, mount, loop device or fsdev", async () => {
    const points = await crashSeries("Filesystem", fileVolume);
    expect(points).toEqual([
      "create after record creating",
      "create after bdev_nvme_attach_controller",
      "create after losetup --find",
      "create after mkfs.ext4",
      "create after mount",
      "create after fsdev_aio_create",
      "create after record ready",
      "delete after fsdev_aio_delete",
      "delete after umount",
      "delete after losetup --detach",
      "delete after bdev_nvme_detach_controller",
      "delete after record delete",
    ]);
  });
});
