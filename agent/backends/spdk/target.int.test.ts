// SpdkTarget.ensureExport against two SPDK emulators on one simulated fabric: a portal another
// target already listens on cannot be bound, and the export must fail rather than count the
// listener as repaired (SPDK answers that failed listen like a duplicate listener).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { createFabric } from "../../../lab/sim/spdk/fabric.ts";
import { StorageError } from "../../../lib/errors.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { SpdkClient } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import type { ExportSpec } from "../types.ts";
import { SpdkTarget } from "./target.ts";

let root: string;
const emulators: SpdkEmulator[] = [];
const clients: SpdkClient[] = [];
const targets: SpdkTarget[] = [];

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-target-"));
  const fabric = createFabric(join(root, "f"));
  for (const name of ["a", "b"]) {
    const emu = await startSpdkEmulator({
      socketPath: join(root, `${name}.sock`),
      dataDir: join(root, name),
      fabric,
    });
    const rpc = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
    await rpc.call("bdev_malloc_create", { name: "m0", num_blocks: 2048, block_size: 4096 });
    emulators.push(emu);
    clients.push(rpc);
    targets.push(
      new SpdkTarget({
        methods: new SpdkMethods(rpc),
        rpc,
        binder: { bind: async () => {} },
        keyFiles: dirKeyFiles(join(root, `${name}-keys`)),
        logger: silentLogger,
      }),
    );
  }
});

afterAll(async () => {
  for (const c of clients) await c.close();
  for (const e of emulators) await e.close();
  rmSync(root, { recursive: true, force: true });
});

const spec = (nqn: string): ExportSpec => ({
  nqn,
  volume: { externalId: nqn.slice(-4), backendPath: "m0", sizeBytes: 8 * 1024 * 1024 },
  transport: "tcp",
  address: "10.20.0.1",
  port: 4420,
  serialNumber: "DISTORT0001",
});

test("a portal another target holds fails the export instead of counting the listener as repaired", async () => {
  const [a, b] = targets as [SpdkTarget, SpdkTarget];
  expect(await a.ensureExport(spec("nqn.2026-02.io.distort:volume-aaaa"))).toContain("listener");

  let failure: unknown;
  await b.ensureExport(spec("nqn.2026-02.io.distort:volume-bbbb")).catch((err) => {
    failure = err;
  });
  expect(failure).toBeInstanceOf(StorageError);
  expect((failure as StorageError).kind).toBe("unavailable");
  expect((failure as StorageError).message).toContain("10.20.0.1:4420");
  expect((await b.inspectExport("nqn.2026-02.io.distort:volume-bbbb"))?.listeners).toEqual([]);

  // Once the address is free, the next pass binds it.
  await a.removeExport("nqn.2026-02.io.distort:volume-aaaa");
  expect(await b.ensureExport(spec("nqn.2026-02.io.distort:volume-bbbb"))).toEqual(["listener"]);
  expect((await b.inspectExport("nqn.2026-02.io.distort:volume-bbbb"))?.listeners).toEqual([
    { transport: "tcp", address: "10.20.0.1", port: 4420 },
  ]);
});

test("applyQos sets the four limits once, reads them back, and is a read only when they are in force", async () => {
  const t = targets[0] as SpdkTarget;
  const rpc = clients[0] as SpdkClient;
  const vol = { externalId: "qos1", backendPath: "m0", sizeBytes: 8 * 1024 * 1024 };
  const limits = { rwIosPerSec: 3000, rwMBytesPerSec: 0, rMBytesPerSec: 50, wMBytesPerSec: 20 };
  expect(await t.applyQos(vol, limits)).toEqual({ applied: limits, changed: true });
  const [b] = (await rpc.call("bdev_get_bdevs", { name: "m0" })) as { assigned_rate_limits: unknown }[];
  expect(b?.assigned_rate_limits).toEqual({
    rw_ios_per_sec: 3000,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 50,
    w_mbytes_per_sec: 20,
  });
  expect(await t.applyQos(vol, limits)).toEqual({ applied: limits, changed: false });
  // Lowering one limit to 0 clears it on the target: the call always carries the whole state.
  const cleared = { ...limits, rMBytesPerSec: 0 };
  expect(await t.applyQos(vol, cleared)).toEqual({ applied: cleared, changed: true });
  const gone = await t.applyQos({ ...vol, backendPath: "nope" }, limits).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect((gone as StorageError).kind).toBe("not-found");
  // Leave m0 unlimited for the other tests.
  await t.applyQos(vol, { rwIosPerSec: 0, rwMBytesPerSec: 0, rMBytesPerSec: 0, wMBytesPerSec: 0 });
});
