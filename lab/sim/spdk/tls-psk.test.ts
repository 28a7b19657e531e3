// TLS-PSK on the emulated target against the real v25.05.1 records (testdata/spdk-v25.05.1-tls.jsonl,
// scenario 5 of the ha-qos-tls capture): the target-side keyring and nvmf calls replayed in order,
// once posing as stock v25.05.1 (every PSK derivation fails) and once as v26.01 (the records made
// with the salt fixed), each reply equal to the recorded one; then the sim fabric's handshake: the
// right host with the right PSK connects, a wrong PSK, none, and an unlisted host are refused (-5).
import { afterEach, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { formatInterchangePsk, generateInterchangePsk } from "../../../lib/nvme/tls-psk.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { connectController, createFabric } from "./fabric.ts";
import { call, rpc } from "./raw-rpc-client.ts";

interface Rec {
  seq: number;
  app: string;
  method: string;
  request: { params?: Record<string, unknown> };
  response: { result?: unknown; error?: { code: number; message: string } };
}

const RECORDS: Rec[] = readFileSync(
  join(import.meta.dir, "../../../testdata/spdk-v25.05.1-tls.jsonl"),
  "utf8",
)
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l));

// Target calls the emulator answers as recorded; sock_* options, framework init and the calls that
// depend on the SPDK initiator app (qpairs, controllers) are left out.
const REPLAYED = new Set([
  "nvmf_create_transport",
  "bdev_malloc_create",
  "nvmf_create_subsystem",
  "nvmf_subsystem_add_ns",
  "nvmf_subsystem_add_listener",
  "nvmf_subsystem_get_listeners",
  "keyring_file_add_key",
  "keyring_get_keys",
  "nvmf_subsystem_add_host",
  "nvmf_subsystem_remove_host",
  "keyring_file_remove_key",
]);

let root: string;
let emu: SpdkEmulator | undefined;
afterEach(async () => {
  await emu?.close();
  emu = undefined;
  rmSync(root, { recursive: true, force: true });
});

/** The capture's key files under `dir`: key0/key1 valid (0600), a 0644 one, a malformed one. */
function keyFiles(dir: string): { key0: string; key1: string } {
  const key0 = formatInterchangePsk({ hash: 1, key: Buffer.alloc(32, 7) });
  const key1 = generateInterchangePsk();
  const files: [string, string, number][] = [
    ["tls-key0", key0, 0o600],
    ["tls-key1", key1, 0o600],
    ["tls-key-0644", key0, 0o644],
    ["tls-key-bad", "NVMeTLSkey-1:01:c2hvcnQ=:", 0o600],
  ];
  for (const [name, text, mode] of files) {
    writeFileSync(join(dir, name), text);
    chmodSync(join(dir, name), mode);
  }
  return { key0, key1 };
}

async function replay(from: number, to: number, version: "25.05.1" | "26.01") {
  root = mkdtempSync(join(tmpdir(), "distort-tls-"));
  keyFiles(root);
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    spdkVersion: version,
    hostAddresses: ["127.0.0.220"],
    fabric: createFabric(join(root, "f")),
  });
  const s = emu.socketPath;
  let n = 0;
  for (const r of RECORDS.filter((x) => x.seq >= from && x.seq <= to && x.app.startsWith("nvmf_tgt"))) {
    if (!REPLAYED.has(r.method)) continue;
    const params = JSON.parse(JSON.stringify(r.request.params ?? {}).replaceAll("/tmp/spdk-cap", root));
    const got = await rpc(s, r.method, r.request.params ? params : undefined);
    const want = JSON.parse(JSON.stringify(r.response).replaceAll("/tmp/spdk-cap", root));
    if (want.error) expect({ seq: r.seq, error: got.error }).toEqual({ seq: r.seq, error: want.error });
    else expect({ seq: r.seq, result: got.result }).toEqual({ seq: r.seq, result: want.result });
    n++;
  }
  return n;
}

test("stock v25.05.1 (seq 246-301): every psk add_host is -32603, the rest as recorded", async () => {
  expect(await replay(246, 301, "25.05.1")).toBeGreaterThanOrEqual(20);
  expect(await call(emu?.socketPath as string, "spdk_get_version")).toMatchObject({ fields: { major: 25 } });
});

test("salt fixed (seq 302-357, emulator as v26.01): psk host admitted, refcnt 2 while held", async () => {
  expect(await replay(302, 357, "26.01")).toBeGreaterThanOrEqual(20);
  expect(await call(emu?.socketPath as string, "spdk_get_version")).toEqual({
    version: "SPDK v26.01",
    fields: { major: 26, minor: 1, patch: 0, suffix: "" },
  });
});

test("the sim fabric's TLS: right PSK connects; wrong, none, unlisted host get EIO", async () => {
  root = mkdtempSync(join(tmpdir(), "distort-tls-"));
  const { key0, key1 } = keyFiles(root);
  const fabric = createFabric(join(root, "f"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    spdkVersion: "26.01",
    fabric,
  });
  const s = emu.socketPath;
  const nqn = "nqn.2016-06.io.spdk:tls1";
  const host1 = "nqn.2016-06.io.spdk:host1";
  const addr = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.220", trsvcid: "4420" };
  await call(s, "nvmf_create_transport", { trtype: "TCP" });
  await call(s, "bdev_malloc_create", { name: "malloc0", num_blocks: 8192, block_size: 4096 });
  await call(s, "nvmf_create_subsystem", { nqn, allow_any_host: false });
  await call(s, "nvmf_subsystem_add_ns", { nqn, namespace: { bdev_name: "malloc0", nsid: 1 } });
  await call(s, "nvmf_subsystem_add_listener", { nqn, listen_address: addr, secure_channel: true });
  await call(s, "keyring_file_add_key", { name: "key0", path: join(root, "tls-key0") });
  await call(s, "nvmf_subsystem_add_host", { nqn, host: host1, psk: "key0" });
  const base = {
    trtype: "TCP",
    traddr: addr.traddr,
    trsvcid: addr.trsvcid,
    subnqn: nqn,
    hostid: crypto.randomUUID(),
  };
  const ok = await connectController(fabric, { ...base, hostnqn: host1, tls: { psk: key0 } });
  const data = Buffer.alloc(4096, 0x5a);
  await ok.write(1, 0, data);
  expect(Buffer.from(await ok.read(1, 0, 4096))).toEqual(data);
  ok.close();
  const errno = (p: Promise<unknown>) =>
    p.then(
      () => 0,
      (e) => (e as { errno?: number }).errno,
    );
  expect(await errno(connectController(fabric, { ...base, hostnqn: host1, tls: { psk: key1 } }))).toBe(5);
  expect(await errno(connectController(fabric, { ...base, hostnqn: host1, connectTimeoutMs: 3000 }))).toBe(5);
  expect(
    await errno(
      connectController(fabric, { ...base, hostnqn: "nqn.2016-06.io.spdk:host9", tls: { psk: key0 } }),
    ),
  ).toBe(5);
  // Plain TCP cannot reach a subsystem on a secure listener; revoking the host ends TLS for it too.
  await call(s, "nvmf_subsystem_remove_host", { nqn, host: host1 });
  expect(await errno(connectController(fabric, { ...base, hostnqn: host1, tls: { psk: key0 } }))).toBe(5);
});
