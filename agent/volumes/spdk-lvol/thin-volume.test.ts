// SpdkLvolVolumeManager against the nvmf_tgt emulator: a volume is thin exactly when its spec says
// so (spec.thinProvisioning, per StorageClass), not by a node-wide switch; a thin one takes no
// clusters until written, a thick one takes them all at creation.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { SpdkClient } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { SpdkTarget } from "../../backends/spdk/target.ts";
import type { DeviceRef } from "../../backends/types.ts";
import { SpdkLvolVolumeManager } from "./manager.ts";

const MiB = 1024 * 1024;
let DRIVE: DeviceRef = { name: "node-t-simt0001", serial: "SIMT0001", pciAddress: "0000:5f:00.0" };
let root: string;
let emu: SpdkEmulator;
let client: SpdkClient;
let lvols: SpdkLvolVolumeManager;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-thin-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: DRIVE.pciAddress, serial: DRIVE.serial, model: "SIM", sizeBytes: 2 ** 30 }],
  });
  client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  const methods = new SpdkMethods(client);
  const facts = new TargetFacts({ rpc: client });
  const target = new SpdkTarget({
    methods,
    rpc: client,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
    facts,
  });
  lvols = new SpdkLvolVolumeManager({ methods, rpc: client, logger: silentLogger, facts });
  DRIVE = await target.prepareDevice(DRIVE);
  await lvols.prepareLayout(DRIVE);
});

afterAll(async () => {
  await client?.close();
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

interface LvolBdev {
  driver_specific: { lvol: { thin_provision: boolean; num_allocated_clusters: number } };
}
async function lvolOf(bdev: string) {
  const [b] = (await client.call("bdev_get_bdevs", { name: bdev })) as LvolBdev[];
  return b?.driver_specific.lvol;
}
async function freeClusters(): Promise<number> {
  const [s] = (await client.call("bdev_lvol_get_lvstores")) as { free_clusters: number }[];
  return s?.free_clusters ?? -1;
}

test("thin only for the volume whose spec asks for it", async () => {
  const before = await freeClusters();
  const thin = await lvols.ensureVolume({
    externalId: "t-thin",
    sizeBytes: 64 * MiB,
    device: DRIVE,
    thin: true,
  });
  expect(await freeClusters()).toBe(before);
  const thick = await lvols.ensureVolume({ externalId: "t-thick", sizeBytes: 64 * MiB, device: DRIVE });
  // 64 MiB in 4 MiB clusters.
  expect(await freeClusters()).toBe(before - 16);
  expect(await lvolOf(thin.backendPath)).toMatchObject({ thin_provision: true, num_allocated_clusters: 0 });
  expect(await lvolOf(thick.backendPath)).toMatchObject({
    thin_provision: false,
    num_allocated_clusters: 16,
  });
  // A repeat finds the volume as it was made (a flag on a repeat does not convert it).
  const again = await lvols.ensureVolume({
    externalId: "t-thick",
    sizeBytes: 64 * MiB,
    device: DRIVE,
    thin: true,
  });
  expect(again.backendPath).toBe(thick.backendPath);
  expect((await lvolOf(thick.backendPath))?.thin_provision).toBe(false);
});
