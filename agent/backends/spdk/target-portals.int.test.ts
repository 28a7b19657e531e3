// SpdkTarget with several portals against the nvmf_tgt emulator on a simulated fabric: one listener
// per address on a subsystem created with ana_reporting, each kept optimized; a further portal the
// host does not have is left out (and said so by listening()), a primary one fails the export.
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
import type { ExportSpec, ListenerState } from "../types.ts";
import { NOT_LISTENING, SpdkTarget } from "./target.ts";

const A = "10.30.0.1";
const B = "10.30.1.1";
const ELSEWHERE = "10.30.9.9";

let root: string;
let emu: SpdkEmulator;
let rpc: SpdkClient;
let m: SpdkMethods;
let target: SpdkTarget;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-portals-"));
  emu = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric: createFabric(join(root, "f")),
    // The node has two addresses: a listener on any other fails as bind() would.
    hostAddresses: [A, B],
  });
  rpc = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  for (const name of ["m1", "m2", "m3"]) {
    await rpc.call("bdev_malloc_create", { name, num_blocks: 2048, block_size: 4096 });
  }
  m = new SpdkMethods(rpc);
  target = new SpdkTarget({
    methods: m,
    rpc,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
  });
});

afterAll(async () => {
  await rpc.close();
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

/** An export of bdev m<last digit of the NQN>. */
const spec = (nqn: string, address: string, moreAddresses?: string[]): ExportSpec => ({
  nqn,
  volume: { externalId: nqn.slice(-4), backendPath: `m${nqn.slice(-1)}`, sizeBytes: 8 * 1024 * 1024 },
  transport: "tcp",
  address,
  port: 4420,
  ...(moreAddresses ? { moreAddresses } : {}),
  serialNumber: "DISTORT0001",
});

const addr = (traddr: string) => ({ trtype: "TCP", adrfam: "IPv4" as const, traddr, trsvcid: "4420" });

test("two portals: two listeners, ANA reported and kept optimized; a dropped portal is withdrawn", async () => {
  const nqn = "nqn.2026-02.io.distort:volume-mp01";
  // The first export of the run also creates the TCP transport.
  const repaired = await target.ensureExport(spec(nqn, A, [B]));
  expect(repaired).toEqual(["transport", "subsystem", "namespace", "listener", `listener:${B}`]);
  const both: ListenerState[] = [
    { transport: "tcp", address: A, port: 4420, anaState: "optimized" },
    { transport: "tcp", address: B, port: 4420, anaState: "optimized" },
  ];
  expect(target.listening(nqn)).toEqual(both);
  // ana_reporting was set at creation: the target reports a state per listener.
  const listeners = await m.nvmfSubsystemGetListeners(nqn);
  expect(listeners.map((l) => [l.address.traddr, l.ana_states?.[0]?.ana_state]).sort()).toEqual([
    [A, "optimized"],
    [B, "optimized"],
  ]);

  // A state someone set by hand is put back; an exact export costs nothing more.
  await m.nvmfSubsystemListenerSetAnaState({ nqn, listen_address: addr(B), ana_state: "inaccessible" });
  expect(await target.ensureExport(spec(nqn, A, [B]))).toEqual(["ana-state"]);
  const after = await m.nvmfSubsystemGetListeners(nqn);
  expect(after.find((l) => l.address.traddr === B)?.ana_states?.[0]?.ana_state).toBe("optimized");
  expect(await target.ensureExport(spec(nqn, A, [B]))).toEqual([]);
  expect(target.listening(nqn)).toEqual(both);

  // The node no longer lists B: its listener goes, and listening() says one path is left.
  expect(await target.ensureExport(spec(nqn, A))).toEqual(["stale-listener"]);
  expect((await target.inspectExport(nqn))?.listeners).toEqual([
    { transport: "tcp", address: A, port: 4420 },
  ]);
  expect(target.listening(nqn)).toEqual([{ transport: "tcp", address: A, port: 4420 }]);
  await target.removeExport(nqn);
  expect(target.listening(nqn)).toBeUndefined();
});

test("a further portal the host does not have is left out; a primary one fails the export", async () => {
  const nqn = "nqn.2026-02.io.distort:volume-mp02";
  expect(await target.ensureExport(spec(nqn, A, [ELSEWHERE, B]))).toEqual([
    "subsystem",
    "namespace",
    "listener",
    `listener:${B}`,
  ]);
  expect(target.listening(nqn)?.map((l) => l.address)).toEqual([A, B]);
  expect((await target.inspectExport(nqn))?.listeners.map((l) => l.address).sort()).toEqual([A, B]);

  const bad = "nqn.2026-02.io.distort:volume-mp03";
  const err = await target.ensureExport(spec(bad, ELSEWHERE, [A])).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("unavailable");
  expect((err as StorageError).details.reason).toBe(NOT_LISTENING);
  expect((err as StorageError).message).toContain(`${ELSEWHERE}:4420`);
  expect(target.listening(bad)).toBeUndefined();
  await target.removeExport(nqn);
  await target.removeExport(bad);
});
