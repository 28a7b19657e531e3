// bdev_get_bdevs for lvol bdevs, byte for byte against real SPDK v25.05.1 (testdata/
// spdk-v25.05.1-lvol-bdevs.jsonl: a thick lvol and a snapshot that is also a clone, seq 107 and 372
// of the HA/QoS/TLS capture): the emulator's reply text equals the real one once UUIDs are mapped,
// so driver_specific carries SPDK's lvol object and nothing else (no emulator-only field a client
// could come to read). The clone case is pinned by the main transcript's replay (seq 48).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, RawRpcConnection } from "./raw-rpc-client.ts";

interface Rec {
  seq: number;
  raw_request: string;
  raw_response: string;
}
const RECS = new Map(
  readFileSync(join(import.meta.dir, "../../../testdata/spdk-v25.05.1-lvol-bdevs.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Rec)
    .map((r) => [r.seq, r]),
);

const MIB = 1024 * 1024;
let root: string;
let emu: SpdkEmulator;
let s: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-lvol-json-"));
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  emu = await startSpdkEmulator({
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
  });
  s = emu.socketPath;
});
afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

/** Every UUID replaced by its order of first appearance, so two runs' texts compare. */
function normalise(text: string): string {
  const seen = new Map<string, string>();
  return text.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, (u) => {
    const k = u.toLowerCase();
    if (!seen.has(k)) seen.set(k, `<uuid${seen.size}>`);
    return seen.get(k) as string;
  });
}

/** Sends the record's exact request text and returns the emulator's reply line. */
async function replay(seq: number): Promise<{ ours: string; theirs: string }> {
  const rec = RECS.get(seq);
  if (!rec) throw new Error(`record ${seq} is missing from the testdata`);
  const conn = await RawRpcConnection.connect(s);
  try {
    conn.send(rec.raw_request);
    await conn.replies(1);
    return { ours: normalise(conn.received), theirs: normalise(rec.raw_response) };
  } finally {
    conn.close();
  }
}

/** An AIO file of `mib` MiB as bdev `name`, as the capture made its lvstore bases. */
async function aio(name: string, mib: number): Promise<void> {
  const file = join(root, `${name}.img`);
  writeFileSync(file, "");
  truncateSync(file, mib * MIB);
  await call(s, "bdev_aio_create", { filename: file, name, block_size: 4096 });
}

test("a thick lvol: the same reply as SPDK's, field for field (seq 107)", async () => {
  await aio("aioA", 256);
  await call(s, "bdev_lvol_create_lvstore", { bdev_name: "aioA", lvs_name: "lvsA", cluster_sz: MIB });
  await call(s, "bdev_lvol_create", { lvol_name: "l3", size_in_mib: 64, lvs_name: "lvsA" });
  const { ours, theirs } = await replay(107);
  expect(ours).toBe(theirs);
  expect(ours).not.toContain("sim_");
});

test("a snapshot of a snapshotted thin lvol: the same reply as SPDK's (seq 372)", async () => {
  await aio("aio6", 128);
  await call(s, "bdev_lvol_create_lvstore", { bdev_name: "aio6", lvs_name: "lvs6", cluster_sz: MIB });
  await call(s, "bdev_lvol_create", {
    lvol_name: "vol",
    size_in_mib: 32,
    lvs_name: "lvs6",
    thin_provision: true,
  });
  // The capture's writes: clusters 0-3 before snap1, then clusters 2, 5, 9, 10 and 20 before snap2.
  const vol = emu.bdev("lvs6/vol");
  for (const c of [0, 1, 2, 3]) await vol.write(c * MIB, Buffer.alloc(4096, 1));
  await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs6/vol", snapshot_name: "snap1" });
  for (const c of [2, 5, 9, 10, 20]) await vol.write(c * MIB, Buffer.alloc(4096, 2));
  await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs6/vol", snapshot_name: "snap2" });
  const { ours, theirs } = await replay(372);
  expect(ours).toBe(theirs);
});
