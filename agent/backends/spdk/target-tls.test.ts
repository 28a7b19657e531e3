// TLS exports on the SPDK backend against the emulator: a v25.05.1 target is refused with the
// reason before anything is created; on v26.01 the host's PSK goes in a
// 0600 keyring file and add_host names it, a pass with the same PSK keeps the host, a new PSK
// re-admits it, and revoking collects the unused key and its file.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "../../../lab/sim/spdk/emulator.ts";
import { StorageError } from "../../../lib/errors.ts";
import { dirKeyFiles } from "../../../lib/key-files.ts";
import { silentLogger } from "../../../lib/log.ts";
import { generateInterchangePsk } from "../../../lib/nvme/tls-psk.ts";
import { SpdkClient } from "../../../lib/spdk/client.ts";
import { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { TLS_UNSUPPORTED } from "../types.ts";
import { SpdkTarget } from "./target.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:0d4c1d0e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const NQN = "nqn.2026-02.io.distort:volume-vol-tls";

let root: string;
let emu: SpdkEmulator | undefined;
let client: SpdkClient | undefined;
afterEach(async () => {
  await client?.close();
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

async function setup(version: "25.05.1" | "26.01") {
  root = mkdtempSync(join(tmpdir(), "spdk-target-tls-"));
  emu = await startSpdkEmulator({
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    rpcPollMs: 0,
    spdkVersion: version,
  });
  client = new SpdkClient({ socketPath: emu.socketPath, logger: silentLogger });
  const methods = new SpdkMethods(client);
  await client.call("bdev_malloc_create", { name: "m0", num_blocks: 2048, block_size: 4096 });
  const target = new SpdkTarget({
    methods,
    rpc: client,
    binder: { bind: async () => {} },
    keyFiles: dirKeyFiles(join(root, "keys")),
    logger: silentLogger,
  });
  const spec = {
    nqn: NQN,
    volume: { externalId: "vol-tls", backendPath: "m0", sizeBytes: 8 * 1024 * 1024 },
    transport: "tcp" as const,
    address: "127.0.0.1",
    port: 4420,
    serialNumber: "SNTLS",
    tls: true,
  };
  return { target, spec, methods };
}

test("v25.05.1: refused with reason TLSUnsupported naming the fix; no subsystem made", async () => {
  const { target, spec, methods } = await setup("25.05.1");
  const err = await target.ensureExport(spec).catch((e) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).details.reason).toBe(TLS_UNSUPPORTED);
  expect((err as StorageError).message).toContain("197ff0c9a5");
  expect((await methods.nvmfGetSubsystems()).map((s) => s.nqn)).not.toContain(NQN);
});

test("v26.01: the PSK in a 0600 keyring file, kept, rotated, collected", async () => {
  const { target, spec, methods } = await setup("26.01");
  await target.ensureExport(spec);
  const psk = generateInterchangePsk();
  await target.setHosts(NQN, [HOST], undefined, new Map([[HOST, psk]]));
  const state = emu?.state() as { keys: readonly { name: string; path: string }[] };
  const [key] = state.keys;
  expect(key?.name).toMatch(/^tls-/);
  expect(readFileSync(key?.path as string, "utf8")).toBe(psk);
  expect(statSync(key?.path as string).mode & 0o777).toBe(0o600);
  const refcnt = async () => (await methods.keyringGetKeys()).map((k) => [k.name.slice(0, 4), k.refcnt]);
  expect(await refcnt()).toEqual([["tls-", 2]]);
  // Same PSK: nothing changes (the host stays admitted, no new key).
  await target.setHosts(NQN, [HOST], undefined, new Map([[HOST, psk]]));
  expect(await refcnt()).toEqual([["tls-", 2]]);
  // A new PSK re-admits the host with it; the old key is collected.
  const next = generateInterchangePsk();
  await target.setHosts(NQN, [HOST], undefined, new Map([[HOST, next]]));
  const keys = await methods.keyringGetKeys();
  expect(keys.length).toBe(1);
  expect(readFileSync(keys[0]?.path as string, "utf8")).toBe(next);
  // Revoked: the key and its file go.
  await target.setHosts(NQN, [], undefined, new Map());
  expect(await methods.keyringGetKeys()).toEqual([]);
  expect(readdirSync(join(root, "keys"))).toEqual([]);
});
