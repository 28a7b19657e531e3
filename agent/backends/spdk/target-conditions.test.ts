// Node conditions SpdkTarget must name clearly, against the emulator: a portal the storage node
// does not have (SPDK v25.05.1 refuses the listener with -32602 "Invalid parameters", as bind()
// fails), and a drive that is not at its PCI address for SPDK (attach -19 over PCIe).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { StorageError } from "../../../lib/errors.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { SpdkClient } from "../../../lib/spdk/client.ts";
import { SpdkError } from "../../../lib/spdk/errors.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { SpdkLvolVolumeManager } from "../../volumes/spdk-lvol/manager.ts";
import { type DeviceRef, DRIVE_MISSING, type ExportSpec } from "../types.ts";
import { SpdkTarget } from "./target.ts";

const DRIVE: DeviceRef = { name: "node-l-siml0001", serial: "SIML0001", pciAddress: "0000:5e:00.0" };
const PORTAL = "127.0.0.7";
const ELSEWHERE = "10.200.0.9";

let root: string;
let emu: SpdkEmulator;
let client: SpdkClient;
let target: SpdkTarget;
let lvols: SpdkLvolVolumeManager;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-listener-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: DRIVE.pciAddress, serial: DRIVE.serial, model: "SIM", sizeBytes: 2 ** 30 }],
    hostAddresses: [PORTAL],
  });
  client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  const methods = new SpdkMethods(client);
  const facts = new TargetFacts({ rpc: client });
  target = new SpdkTarget({
    methods,
    rpc: client,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
    facts,
  });
  lvols = new SpdkLvolVolumeManager({ methods, rpc: client, logger: silentLogger, facts });
});

afterAll(async () => {
  await client?.close();
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

async function spec(id: string, address: string): Promise<ExportSpec> {
  const device = await target.prepareDevice(DRIVE);
  await lvols.prepareLayout(device);
  const volume = await lvols.ensureVolume({ externalId: `vol-${id}`, sizeBytes: 4 << 20, device });
  return {
    nqn: `nqn.2026-02.io.distort:volume-vol-${id}`,
    volume,
    transport: "tcp",
    address,
    port: 4420,
    serialNumber: `SN${id}`,
  };
}

test("the emulator refuses a listener on an address its host does not have, as SPDK does", async () => {
  await target.ensureExport(await spec("a1", PORTAL));
  const err = await client
    .call("nvmf_subsystem_add_listener", {
      nqn: "nqn.2026-02.io.distort:volume-vol-a1",
      listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: ELSEWHERE, trsvcid: "4420" },
    })
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(SpdkError);
  expect((err as SpdkError).code).toBe(-32602);
  expect((err as SpdkError).spdkMessage).toBe("Invalid parameters");
});

test("ensureExport on a portal the node does not have fails unavailable, naming the address", async () => {
  const s = await spec("b2", ELSEWHERE);
  const err = await target.ensureExport(s).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("unavailable");
  expect((err as StorageError).message).toContain(`${ELSEWHERE}:4420`);
  expect((err as StorageError).message).toContain("not configured on this host");
  // The subsystem exists but lists no listener: nothing pretends the export is reachable.
  const subs = await new SpdkMethods(client).nvmfGetSubsystems(s.nqn);
  expect(subs[0]?.listen_addresses).toEqual([]);
  // Corrected to the node's portal, the same export converges.
  expect(await target.ensureExport({ ...s, address: PORTAL })).toContain("listener");
});

test("a drive missing at its PCI address is not-found with the DriveMissing reason, not 'nothing listens'", async () => {
  const gone: DeviceRef = { name: "node-l-siml0002", serial: "SIML0002", pciAddress: "0000:af:00.0" };
  const err = await target.prepareDevice(gone).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("not-found");
  expect((err as StorageError).transient).toBe(false);
  expect((err as StorageError).details.reason).toBe(DRIVE_MISSING);
  expect((err as StorageError).message).toContain("0000:af:00.0");
  expect((err as StorageError).message).toContain("not bound to a driver SPDK can use");
  expect((err as StorageError).message).not.toContain("listening");
});
