// What one partition's pass costs against the nvmf_tgt emulator, counted per RPC: a re-verify reads
// only its own subsystem, a replay after a target restart checks the drive and transport once, and
// DH-CHAP keys are collected as soon as a keyed host is revoked, rotated (nvmf_subsystem_set_keys,
// the host staying admitted) or removed, and only then.
import { afterAll, beforeAll, beforeEach, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { StorageError } from "../../../lib/errors.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { type CallOptions, SpdkClient, type SpdkRpc } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { SpdkLvolVolumeManager } from "../../volumes/spdk-lvol/manager.ts";
import type { DeviceRef, HostKeys } from "../types.ts";
import { SpdkTarget } from "./target.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:0d4c1d0e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const DRIVE: DeviceRef = { name: "node-t-simt0001", serial: "SIMT0001", pciAddress: "0000:5e:00.0" };
const MiB = 1024 * 1024;

/** Forwards to the client and counts calls; `failNext` makes the next call of a method fail. */
class RecordingRpc implements SpdkRpc {
  calls: Array<{ method: string; params: Record<string, unknown> | undefined }> = [];
  failNext: string | undefined;
  constructor(private readonly inner: SpdkClient) {}
  get connectionGeneration(): number | undefined {
    return this.inner.connectionGeneration;
  }
  call(method: string, params?: object, opts?: CallOptions): Promise<unknown> {
    this.calls.push({ method, params: params as Record<string, unknown> | undefined });
    if (this.failNext === method) {
      this.failNext = undefined;
      return Promise.reject(new StorageError("unavailable", `${method}: injected failure`));
    }
    return this.inner.call(method, params, opts);
  }
  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.inner.serialize(key, fn);
  }
  count(method: string, filtered?: boolean): number {
    return this.calls.filter(
      (c) => c.method === method && (filtered === undefined || (c.params?.nqn !== undefined) === filtered),
    ).length;
  }
}

let root: string;
let emu: SpdkEmulator;
let client: SpdkClient;
let rpc: RecordingRpc;
let target: SpdkTarget;
let lvols: SpdkLvolVolumeManager;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "spdk-target-unit-"));
  emu = await startSpdkEmulator({
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: DRIVE.pciAddress, serial: DRIVE.serial, model: "SIM", sizeBytes: 2 ** 30 }],
    // The backend's calls and their order, not the target's 8 ms per call: rpc-clock.test.ts
    // covers the clock, and integration tests, the labs and the benches run on it.
    rpcPollMs: 0,
  });
  client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  rpc = new RecordingRpc(client);
  const methods = new SpdkMethods(rpc);
  // One set of facts for both, as the agent wires them.
  const facts = new TargetFacts({ rpc });
  target = new SpdkTarget({
    methods,
    rpc,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
    facts,
  });
  lvols = new SpdkLvolVolumeManager({ methods, rpc, logger: silentLogger, facts });
});

afterAll(async () => {
  await client?.close();
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

beforeEach(() => {
  rpc.calls = [];
});

const nqnOf = (i: number | string) => `nqn.2026-02.io.distort:volume-vol-${i}`;

/** The backend calls of one partition's provision/verify pass, in the controller's order. */
async function pass(i: number | string, hosts: string[] = [], keys?: HostKeys): Promise<string[]> {
  const device = await target.prepareDevice(DRIVE);
  await lvols.prepareLayout(device);
  const volume = await lvols.ensureVolume({ externalId: `vol-${i}`, sizeBytes: 4 * MiB, device });
  const repaired = await target.ensureExport({
    nqn: nqnOf(i),
    volume,
    transport: "tcp",
    address: "127.0.0.1",
    port: 4420,
    serialNumber: `SN${i}`,
  });
  await target.setHosts(nqnOf(i), hosts, keys);
  return repaired;
}

/** A DH-HMAC-CHAP secret in its exchange form: 32 random bytes plus their CRC-32, base64. */
function secret(): string {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const crc = Buffer.alloc(4);
  crc.writeUInt32LE(Bun.hash.crc32(key) >>> 0);
  return `DHHC-1:00:${Buffer.concat([Buffer.from(key), crc]).toString("base64")}:`;
}

const dhchapKeys = async () =>
  (await new SpdkMethods(client).keyringGetKeys()).map((k) => k.name).filter((n) => n.startsWith("dhchap-"));

const N = 12;

test("a verify pass of an intact export reads its own subsystem twice and nothing node-wide", async () => {
  for (let i = 0; i < N; i++) await pass(i);
  rpc.calls = [];
  for (let i = 0; i < N; i++) expect(await pass(i)).toEqual([]);
  // Per pass: nvmf_get_subsystems for its NQN (ensureExport, setHosts) and its lvol's bdev.
  expect(rpc.count("nvmf_get_subsystems", true)).toBe(2 * N);
  expect(rpc.count("nvmf_get_subsystems", false)).toBe(0);
  expect(rpc.count("bdev_get_bdevs")).toBe(N);
  expect(rpc.calls).toHaveLength(3 * N);
});

test("after a target restart the replay checks the drive, lvstore and transport once, not per export", async () => {
  await emu.crash();
  await emu.restart();
  // The first call may still go out on the dead connection and fail; the agent retries that pass.
  await pass(0).catch(() => pass(0));
  for (let i = 1; i < N; i++) expect(await pass(i)).toContain("subsystem");
  // The pass that re-attaches the drive forgets what held before it: one more controller check.
  expect(rpc.count("bdev_nvme_get_controllers")).toBeLessThanOrEqual(2);
  expect(rpc.count("bdev_nvme_attach_controller")).toBe(1);
  expect(rpc.count("bdev_wait_for_examine")).toBe(1);
  expect(rpc.count("bdev_lvol_get_lvstores")).toBe(1);
  expect(rpc.count("nvmf_get_transports")).toBe(1);
  expect(rpc.count("nvmf_create_transport")).toBe(1);
  // One key collection for the new target, whatever the number of exports.
  expect(rpc.count("nvmf_get_subsystems", false)).toBe(1);
  const state = emu.state();
  for (let i = 0; i < N; i++) {
    const s = state.subsystems.find((x) => x.nqn === nqnOf(i));
    expect(s?.namespaces).toHaveLength(1);
    expect(s?.listeners).toHaveLength(1);
  }
});

test("a failed pass forgets what was verified: the next pass checks the drive and transport again", async () => {
  await pass(0);
  rpc.calls = [];
  rpc.failNext = "nvmf_get_subsystems";
  await expect(pass(0)).rejects.toThrow("injected failure");
  await pass(0);
  expect(rpc.count("bdev_nvme_get_controllers")).toBe(1);
  expect(rpc.count("bdev_wait_for_examine")).toBe(1);
  expect(rpc.count("nvmf_get_transports")).toBe(1);
});

test("DH-CHAP keys: collected when a keyed host is revoked, rotated or removed, and only then", async () => {
  const [s1, s2, s3] = [secret(), secret(), secret()];
  await pass("ka", [HOST], new Map([[HOST, s1]]));
  await pass("kb", [HOST], new Map([[HOST, s2]]));
  const [keyA, keyB] = [await hostKey(nqnOf("ka")), await hostKey(nqnOf("kb"))];
  expect(await dhchapKeys()).toEqual(expect.arrayContaining([keyA, keyB]));

  // Re-verifying keyed exports neither lists every subsystem nor touches the keyring.
  rpc.calls = [];
  await pass("ka", [HOST], new Map([[HOST, s1]]));
  await pass("kb", [HOST], new Map([[HOST, s2]]));
  expect(rpc.count("nvmf_get_subsystems", false)).toBe(0);
  expect(rpc.count("keyring_get_keys")).toBe(0);

  // Revoked: its key goes at once (keyring and file); the other export's key stays.
  await target.setHosts(nqnOf("ka"), []);
  expect(await dhchapKeys()).toEqual([keyB]);
  expect(existsSync(join(root, "keys", keyA))).toBe(false);
  expect(existsSync(join(root, "keys", keyB))).toBe(true);

  // Rotated: the new key is loaded and swapped in (the host stays admitted, so its connected
  // controllers stay), then the old one goes.
  rpc.calls = [];
  await target.setHosts(nqnOf("kb"), [HOST], new Map([[HOST, s3]]));
  const keyB2 = await hostKey(nqnOf("kb"));
  expect(keyB2).not.toBe(keyB);
  expect(rpc.count("nvmf_subsystem_remove_host")).toBe(0);
  expect(rpc.count("nvmf_subsystem_add_host")).toBe(0);
  const order = rpc.calls.map((c) => c.method);
  expect(order.indexOf("keyring_file_add_key")).toBeLessThan(order.indexOf("nvmf_subsystem_set_keys"));
  expect(order.indexOf("nvmf_subsystem_set_keys")).toBeLessThan(order.indexOf("keyring_file_remove_key"));
  expect(rpc.calls.find((c) => c.method === "nvmf_subsystem_set_keys")?.params).toEqual({
    nqn: nqnOf("kb"),
    host: HOST,
    dhchap_key: keyB2,
  });
  expect(await dhchapKeys()).toEqual([keyB2]);
  expect(existsSync(join(root, "keys", keyB))).toBe(false);

  // Removing an export without keyed hosts leaves the collection alone.
  rpc.calls = [];
  await target.removeExport(nqnOf("ka"));
  expect(rpc.count("nvmf_get_subsystems", false)).toBe(0);

  // Removed with its keyed host: nothing secret stays behind.
  await target.removeExport(nqnOf("kb"));
  expect(await dhchapKeys()).toEqual([]);
  expect(existsSync(join(root, "keys", keyB2))).toBe(false);
});

test("bidirectional: the host is admitted with dhchap_key and dhchap_ctrlr_key, both 0600 files, both collected", async () => {
  const [h1, c1, c2] = [secret(), secret(), secret()];
  await pass("kd", [HOST], new Map([[HOST, { secret: h1, ctrlSecret: c1 }]]));
  const [sub] = await new SpdkMethods(client).nvmfGetSubsystems(nqnOf("kd"));
  const admitted = sub?.hosts.find((h) => h.nqn === HOST);
  expect(admitted?.dhchap_key).toBeString();
  expect(admitted?.dhchap_ctrlr_key).toBeString();
  expect(admitted?.dhchap_ctrlr_key).not.toBe(admitted?.dhchap_key);
  const files = [admitted?.dhchap_key, admitted?.dhchap_ctrlr_key].map((n) =>
    join(root, "keys", n as string),
  );
  expect(files.map((f) => statSync(f).mode & 0o777)).toEqual([0o600, 0o600]);
  expect(files.map((f) => readFileSync(f, "utf8"))).toEqual([h1, c1]);
  expect(await dhchapKeys()).toEqual(
    expect.arrayContaining([admitted?.dhchap_key, admitted?.dhchap_ctrlr_key]),
  );

  // Re-verifying the same keys changes nothing.
  rpc.calls = [];
  await pass("kd", [HOST], new Map([[HOST, { secret: h1, ctrlSecret: c1 }]]));
  expect(rpc.count("nvmf_subsystem_add_host")).toBe(0);

  // A new controller key alone is swapped in with the unchanged host key (set_keys sets both;
  // one left out would be cleared) and the old controller key goes.
  rpc.calls = [];
  await target.setHosts(nqnOf("kd"), [HOST], new Map([[HOST, { secret: h1, ctrlSecret: c2 }]]));
  expect(rpc.count("nvmf_subsystem_remove_host")).toBe(0);
  expect(rpc.calls.find((c) => c.method === "nvmf_subsystem_set_keys")?.params).toMatchObject({
    dhchap_key: admitted?.dhchap_key,
  });
  const [after] = await new SpdkMethods(client).nvmfGetSubsystems(nqnOf("kd"));
  const again = after?.hosts.find((h) => h.nqn === HOST);
  expect(again?.dhchap_key).toBe(admitted?.dhchap_key as string);
  expect(again?.dhchap_ctrlr_key).not.toBe(admitted?.dhchap_ctrlr_key as string);
  expect(existsSync(files[1] as string)).toBe(false);

  await target.removeExport(nqnOf("kd"));
  expect(await dhchapKeys()).toEqual([]);
});

test("a key installed for a host that was not admitted is collected by a later pass", async () => {
  await pass("kc");
  rpc.failNext = "nvmf_subsystem_add_host";
  await expect(target.setHosts(nqnOf("kc"), [HOST], new Map([[HOST, secret()]]))).rejects.toThrow(
    "injected failure",
  );
  expect(await dhchapKeys()).toHaveLength(1);
  // Any export's next pass, even an unkeyed one, collects it.
  await pass(0);
  expect(await dhchapKeys()).toEqual([]);
});

async function hostKey(nqn: string): Promise<string> {
  const [s] = await new SpdkMethods(client).nvmfGetSubsystems(nqn);
  const key = s?.hosts.find((h) => h.nqn === HOST)?.dhchap_key;
  if (!key) throw new Error(`${nqn} admits ${HOST} without a key`);
  return key;
}
