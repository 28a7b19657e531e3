// Nothing of another tenant's data, on the SPDK path, against the nvmf_tgt emulator: a drive that
// holds a partition table or a filesystem gets no lvstore (DriveNotBlank) until it is wiped, the
// clear method follows the drive's DLFEAT, and a drive whose serial is not the expected one is
// detached again. Drive contents are written with the real mkfs.ext4 and parted.
import { afterAll, afterEach, expect, test } from "bun:test";
import { closeSync, ftruncateSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import type { SimDrive } from "../../../lab/sim/spdk/sim-drive.ts";
import { StorageError } from "../../../lib/errors.ts";
import { hostExec, runChecked } from "../../../lib/exec.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { type CallOptions, SpdkClient, type SpdkRpc } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { SpdkTarget } from "../../backends/spdk/target.ts";
import type { DeviceRef } from "../../backends/types.ts";
import { lvstoreNameFor } from "../../partitions/identity.ts";
import { blkidImageProbe, edgeRegions, identifyNamespace, READ_CHUNK } from "./drive-probe.ts";
import { DRIVE_NOT_BLANK, SpdkLvolVolumeManager } from "./manager.ts";

const MiB = 1024 * 1024;
const SIZE = 256 * MiB;
const PCI = "0000:5e:00.0";

/** Records every call and its params. */
class RecordingRpc implements SpdkRpc {
  calls: Array<{ method: string; params: Record<string, unknown> | undefined }> = [];
  constructor(private readonly inner: SpdkClient) {}
  get connectionGeneration(): number | undefined {
    return this.inner.connectionGeneration;
  }
  call(method: string, params?: object, opts?: CallOptions): Promise<unknown> {
    this.calls.push({ method, params: params as Record<string, unknown> | undefined });
    return this.inner.call(method, params, opts);
  }
  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.inner.serialize(key, fn);
  }
  params(method: string) {
    return this.calls.filter((c) => c.method === method).map((c) => c.params);
  }
}

interface Rig {
  emu: SpdkEmulator;
  client: SpdkClient;
  rpc: RecordingRpc;
  target: SpdkTarget;
  lvols: SpdkLvolVolumeManager;
  image: string;
}

const roots: string[] = [];
let rig: Rig | undefined;

/** An emulator with one drive whose backing file `prepare` may fill first (with real tools). */
async function start(drive: Partial<SimDrive>, prepare?: (image: string) => Promise<void>): Promise<Rig> {
  const root = mkdtempSync(join(tmpdir(), "spdk-drive-probe-"));
  roots.push(root);
  const dataDir = join(root, "data");
  mkdirSync(join(dataDir, "drives"), { recursive: true });
  const image = join(dataDir, "drives", `${PCI.replaceAll(":", "_")}.img`);
  const fd = openSync(image, "w");
  ftruncateSync(fd, SIZE);
  closeSync(fd);
  await prepare?.(image);
  const emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir,
    drives: [{ pciAddress: PCI, serial: "PROBE001", model: "SIM", sizeBytes: SIZE, ...drive }],
  });
  const client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  const rpc = new RecordingRpc(client);
  const methods = new SpdkMethods(rpc);
  const facts = new TargetFacts({ rpc });
  const target = new SpdkTarget({
    methods,
    rpc,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
    facts,
  });
  const lvols = new SpdkLvolVolumeManager({
    methods,
    rpc,
    logger: silentLogger,
    facts,
    probe: blkidImageProbe(hostExec, root),
  });
  rig = { emu, client, rpc, target, lvols, image };
  return rig;
}

afterEach(async () => {
  await rig?.client.close();
  await rig?.emu.close();
  rig = undefined;
});

afterAll(() => {
  for (const r of roots) rmSync(r, { recursive: true, force: true });
});

const DRIVE: DeviceRef = { name: "node-t-probe001", serial: "PROBE001", pciAddress: PCI };
const sh = (...argv: string[]) => runChecked(hostExec, argv, { timeoutMs: 60_000 });

function zeroFirstMiB(image: string) {
  const fd = openSync(image, "r+");
  writeSync(fd, Buffer.alloc(MiB), 0, MiB, 0);
  closeSync(fd);
}

for (const [what, prepare, holds] of [
  ["an ext4 filesystem", (img: string) => sh("mkfs.ext4", "-q", "-F", img).then(() => {}), "ext4"],
  ["a GPT partition table", (img: string) => sh("parted", "-s", img, "mklabel", "gpt").then(() => {}), "gpt"],
] as const) {
  test(`a drive holding ${what} gets no lvstore until it is wiped`, async () => {
    const r = await start({}, prepare);
    const device = await r.target.prepareDevice(DRIVE);
    const err = await r.lvols.prepareLayout(device).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("precondition");
    expect((err as StorageError).details.reason).toBe(DRIVE_NOT_BLANK);
    expect((err as StorageError).message).toContain(holds);
    expect((err as StorageError).message).toContain("wipe it explicitly");
    expect(r.rpc.params("bdev_lvol_create_lvstore")).toEqual([]);
    expect(r.emu.state().lvstores).toEqual([]);
    // The operator wipes the drive (here: the signatures' MiB; for GPT also the backup at the end).
    zeroFirstMiB(r.image);
    if (holds === "gpt") {
      const fd = openSync(r.image, "r+");
      writeSync(fd, Buffer.alloc(MiB), 0, MiB, SIZE - MiB);
      closeSync(fd);
    }
    await r.lvols.prepareLayout(device);
    expect(r.emu.state().lvstores.map((s) => s.name)).toEqual([lvstoreNameFor(DRIVE.serial)]);
  }, 60_000);
}

test("the probe reads the first and the last MiB through bdev_nvme_send_cmd", async () => {
  const r = await start({}, async (img) => {
    const fd = openSync(img, "r+");
    writeSync(fd, Buffer.alloc(MiB, 0x11), 0, MiB, 0);
    writeSync(fd, Buffer.alloc(MiB, 0x22), 0, MiB, SIZE - MiB);
    closeSync(fd);
  });
  const device = await r.target.prepareDevice(DRIVE);
  const bdev = device.bdevName as string;
  const id = await identifyNamespace(r.rpc, bdev);
  expect(id).toEqual({ numBlocks: SIZE / 4096, blockSize: 4096, dlfeat: 0x09 });
  const regions = await edgeRegions(r.rpc, bdev, id);
  expect(regions.map((x) => x.offset)).toEqual([0, SIZE - MiB]);
  expect(regions[0]?.data.equals(Buffer.alloc(MiB, 0x11))).toBe(true);
  expect(regions[1]?.data.equals(Buffer.alloc(MiB, 0x22))).toBe(true);
  expect(r.rpc.params("bdev_nvme_send_cmd").length).toBe(1 + (2 * MiB) / READ_CHUNK);
});

test("a drive whose deallocated blocks read as zeros (DLFEAT 001b) is cleared with unmap", async () => {
  const r = await start({ dlfeat: 0x09 });
  const device = await r.target.prepareDevice(DRIVE);
  await r.lvols.prepareLayout(device);
  await r.lvols.ensureVolume({ externalId: "vol-a", sizeBytes: 8 * MiB, device });
  expect(r.rpc.params("bdev_lvol_create_lvstore")[0]?.clear_method).toBe("unmap");
  expect(r.rpc.params("bdev_lvol_create")[0]?.clear_method).toBe("unmap");
});

test("a drive that does not say deallocated blocks read as zeros is cleared with write_zeroes", async () => {
  const r = await start({ dlfeat: 0x00 });
  const device = await r.target.prepareDevice(DRIVE);
  await r.lvols.prepareLayout(device);
  await r.lvols.ensureVolume({ externalId: "vol-a", sizeBytes: 8 * MiB, device });
  await r.lvols.ensureVolume({ externalId: "vol-b", sizeBytes: 8 * MiB, device });
  expect(r.rpc.params("bdev_lvol_create_lvstore")[0]?.clear_method).toBe("write_zeroes");
  expect(r.rpc.params("bdev_lvol_create").map((p) => p?.clear_method)).toEqual([
    "write_zeroes",
    "write_zeroes",
  ]);
  // Identify once per drive and target, not per volume.
  const identifies = r.rpc.params("bdev_nvme_send_cmd").filter((p) => p?.cmd_type === "admin");
  expect(identifies.length).toBe(2); // the blank check and the clear method
});

test("a drive reporting another serial is refused and detached again", async () => {
  const r = await start({ serial: "SWAPPED1" });
  const err = await r.target.prepareDevice(DRIVE).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).details.reason).toBe("SerialMismatch");
  expect((err as StorageError).message).toContain("reports serial SWAPPED1");
  expect(r.emu.state().nvmeControllers).toEqual([]);
  expect(r.emu.state().lvstores).toEqual([]);
});
