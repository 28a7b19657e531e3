// SpdkLvolVolumeManager.ensureSnapshots against the nvmf_tgt emulator on its socket: every lookup
// precedes the first snapshot call, the snapshot calls go out back to back, each snapshot holds
// its source's bytes at that point, a repeat takes nothing, a missing source takes nothing.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { StorageError } from "../../../lib/errors.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { type CallOptions, SpdkClient, type SpdkRpc } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { SpdkTarget } from "../../backends/spdk/target.ts";
import type { DeviceRef } from "../../backends/types.ts";
import { lvstoreNameFor } from "../../partitions/identity.ts";
import { SpdkLvolVolumeManager } from "./manager.ts";

let DRIVE: DeviceRef = { name: "node-g-simg0001", serial: "SIMG0001", pciAddress: "0000:5e:00.0" };
const MiB = 1024 * 1024;

/** Forwards to the client and records each method in the order calls were issued. */
class RecordingRpc implements SpdkRpc {
  methods: string[] = [];
  constructor(private readonly inner: SpdkClient) {}
  get connectionGeneration(): number | undefined {
    return this.inner.connectionGeneration;
  }
  call(method: string, params?: object, opts?: CallOptions): Promise<unknown> {
    this.methods.push(method);
    return this.inner.call(method, params, opts);
  }
  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.inner.serialize(key, fn);
  }
}

let root: string;
let emu: SpdkEmulator;
let client: SpdkClient;
let rpc: RecordingRpc;
let lvols: SpdkLvolVolumeManager;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-group-snap-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: DRIVE.pciAddress, serial: DRIVE.serial, model: "SIM", sizeBytes: 2 ** 30 }],
  });
  client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  rpc = new RecordingRpc(client);
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
  lvols = new SpdkLvolVolumeManager({ methods, rpc, logger: silentLogger, facts });
  DRIVE = await target.prepareDevice(DRIVE);
  await lvols.prepareLayout(DRIVE);
});

afterAll(async () => {
  await client?.close();
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

test("a group of three: lookups first, then the three snapshot calls back to back; each holds its source's bytes", async () => {
  const lvs = lvstoreNameFor(DRIVE.serial);
  const names = ["g-a", "g-b", "g-c"];
  for (const n of names) {
    await lvols.ensureVolume({ externalId: n, sizeBytes: 4 * MiB, device: DRIVE });
    await emu.bdev(`${lvs}/${n}`).write(0, Buffer.from(`before the group snapshot: ${n}`));
  }
  const items = names.map((n) => ({ device: DRIVE, lvolName: n, snapshotName: `snap-${n}` }));
  rpc.methods = [];
  const sizes = await lvols.ensureSnapshots(items);
  expect(sizes).toEqual(names.map(() => ({ sizeBytes: 4 * MiB })));
  const first = rpc.methods.indexOf("bdev_lvol_snapshot");
  expect(rpc.methods.slice(first, first + 3)).toEqual([
    "bdev_lvol_snapshot",
    "bdev_lvol_snapshot",
    "bdev_lvol_snapshot",
  ]);
  expect(rpc.methods.filter((m) => m === "bdev_lvol_snapshot")).toHaveLength(3);
  expect(rpc.methods.slice(0, first).every((m) => m === "bdev_get_bdevs")).toBe(true);
  for (const n of names)
    await emu.bdev(`${lvs}/${n}`).write(0, Buffer.from(`after the group snapshot: ${n}`));
  for (const n of names) {
    const want = Buffer.from(`before the group snapshot: ${n}`);
    expect((await emu.bdev(`${lvs}/snap-${n}`).read(0, want.length)).equals(want)).toBe(true);
  }

  // Repeating takes nothing new.
  rpc.methods = [];
  expect(await lvols.ensureSnapshots(items)).toEqual(sizes);
  expect(rpc.methods).not.toContain("bdev_lvol_snapshot");
});

test("a missing source: not-found, and no member is taken", async () => {
  await lvols.ensureVolume({ externalId: "g-d", sizeBytes: 4 * MiB, device: DRIVE });
  rpc.methods = [];
  const err = await lvols
    .ensureSnapshots([
      { device: DRIVE, lvolName: "g-d", snapshotName: "snap-g-d" },
      { device: DRIVE, lvolName: "g-missing", snapshotName: "snap-g-missing" },
    ])
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("not-found");
  expect(rpc.methods).not.toContain("bdev_lvol_snapshot");
});
