// bdev_raid_* over the emulator's RPC socket against the `[1 raid1]` records of SPDK v25.05.1:
// the creation and error records (seq 16-39) are replayed byte for byte (UUIDs mapped, since they
// are random per run), then the degraded/rebuild/restart course of the scenario is walked with
// the checks its records make. Target A's remote member rbn1 is a malloc bdev of the same size
// and name here (the fabric path to a second target is not what these records test).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, RawRpcConnection, rpc } from "./raw-rpc-client.ts";

interface Rec {
  seq: number;
  method: string;
  raw_request: string;
  raw_response: string;
}
const RECORDS: Rec[] = readFileSync(
  join(import.meta.dir, "../../../testdata/spdk-v25.05.1-raid1.jsonl"),
  "utf8",
)
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as Rec);

const MIB = 1024 * 1024;
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g;
const ZERO = "00000000-0000-0000-0000-000000000000";

/** Replaces each distinct UUID (but the all-zero one) by its order of first appearance. */
function normalise(text: string): string {
  const seen = new Map<string, string>();
  return text.replace(UUID, (u) => {
    if (u === ZERO) return u;
    if (!seen.has(u)) seen.set(u, `<uuid${seen.size}>`);
    return seen.get(u) as string;
  });
}

let root: string;
let emu: SpdkEmulator;
const DRIVE = { pciAddress: "0000:5e:00.0", serial: "SRAID", model: "Sim", sizeBytes: 512 * MIB };

async function start(): Promise<SpdkEmulator> {
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  return startSpdkEmulator({
    rpcPollMs: 0,
    socketPath: join(root, "a.sock"),
    dataDir: join(root, "a"),
    drives: [DRIVE],
  });
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-raid-"));
  emu = await start();
  const s = emu.socketPath;
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: DRIVE.pciAddress });
  await call(s, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvsA", cluster_sz: MIB });
  for (const l of ["l1", "l2", "l3"]) {
    await call(s, "bdev_lvol_create", {
      lvs_name: "lvsA",
      lvol_name: l,
      size_in_mib: 64,
      thin_provision: false,
    });
  }
  await call(s, "bdev_malloc_create", { name: "rbn1", num_blocks: 16384, block_size: 4096 });
});

afterAll(async () => {
  await emu?.close();
  rmSync(root, { recursive: true, force: true });
});

/**
 * Sends a record's raw request and returns the raw text received once its reply line is complete
 * (each of these records is one newline-terminated reply), as replay.test.ts reads them.
 */
async function replay(rec: Rec): Promise<string> {
  const c = await RawRpcConnection.connect(emu.socketPath);
  try {
    c.send(rec.raw_request);
    await c.replies(1, 5000);
    return c.received;
  } finally {
    c.close();
  }
}

/** Creation and refusal records replayed byte for byte; 33 (bdev_get_bdevs r1) is checked below. */
const REPLAYED = [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 34, 35, 36, 37, 38, 39];

test("seq 16-39: create, categories and refusals reply exactly as SPDK's", async () => {
  for (const seq of REPLAYED) {
    const rec = RECORDS.find((r) => r.seq === seq) as Rec;
    const got = await replay(rec);
    if (seq === 27) expect(got).toContain(`"uuid":"${JSON.parse(got).result[0].uuid}","uuid":"`);
    expect({ seq, reply: normalise(got) }).toEqual({ seq, reply: normalise(rec.raw_response) });
  }
});

test("seq 33: the raid bdev in bdev_get_bdevs, driver_specific.raid as SPDK prints it", async () => {
  const rec = RECORDS.find((r) => r.seq === 33) as Rec;
  const want = JSON.parse(rec.raw_response).result[0];
  const [got] = (await call(emu.socketPath, "bdev_get_bdevs", { name: "r1" })) as (typeof want)[];
  expect(normalise(JSON.stringify(got.driver_specific))).toBe(
    normalise(JSON.stringify(want.driver_specific)),
  );
  expect(got.supported_io_types).toEqual(want.supported_io_types);
  expect([got.product_name, got.num_blocks, got.block_size]).toEqual(["Raid Volume", 16128, 4096]);
});

test("a member leaves, a fresh lvol is rebuilt with visible progress, a restart re-assembles r1 by examine", async () => {
  const s = emu.socketPath;
  const raids = async () =>
    (await call(s, "bdev_raid_get_bdevs", { category: "all" })) as Record<string, unknown>[];
  expect(await call(s, "bdev_raid_remove_base_bdev", { name: "rbn1" })).toBe(true);
  let [r1] = await raids();
  expect(r1).toMatchObject({ state: "online", num_base_bdevs_discovered: 1, num_base_bdevs_operational: 1 });
  expect((await call(s, "bdev_get_bdevs", { name: "rbn1" })) as { claimed: boolean }[]).toMatchObject([
    { claimed: false },
  ]);
  // 63 MiB at 256 MiB/s: at least ~250 ms of rebuild, polled every 20 ms.
  expect(await call(s, "bdev_raid_set_options", { process_max_bandwidth_mb_sec: 256 })).toBe(true);
  expect(await call(s, "bdev_raid_add_base_bdev", { raid_bdev: "r1", base_bdev: "lvsA/l3" })).toBe(true);
  [r1] = await raids();
  expect(r1?.process).toMatchObject({ type: "rebuild", target: "lvsA/l3" });
  expect(await rpc(s, "bdev_raid_add_base_bdev", { raid_bdev: "r1", base_bdev: "lvsA/l2" })).toMatchObject({
    error: { code: -1, message: "Failed to add base bdev lvsA/l2 to RAID bdev r1: Operation not permitted" },
  });
  const percents: number[] = [];
  for (const end = Date.now() + 20_000; Date.now() < end; ) {
    [r1] = await raids();
    const p = r1?.process as { progress: { percent: number } } | undefined;
    if (!p) break;
    percents.push(p.progress.percent);
    await Bun.sleep(20);
  }
  expect(r1?.process).toBeUndefined();
  expect(percents.length).toBeGreaterThan(2);
  expect(r1).toMatchObject({ num_base_bdevs_discovered: 2, num_base_bdevs_operational: 2 });
  expect(await rpc(s, "bdev_raid_set_options", { process_window_size_kb: 0 })).toMatchObject({
    error: { code: -22, message: "Invalid argument" },
  });

  // Restart over the same drive file: lvstore, lvols, then r1 by examine, same UUID, base names
  // now the lvol UUIDs.
  const uuid = r1?.uuid;
  await emu.close();
  emu = await start();
  const s2 = emu.socketPath;
  await call(s2, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: DRIVE.pciAddress });
  await call(s2, "bdev_wait_for_examine");
  const [again] = (await call(s2, "bdev_raid_get_bdevs", { category: "all" })) as Record<string, unknown>[];
  expect(again).toMatchObject({ name: "r1", uuid, state: "online", num_base_bdevs_discovered: 2 });
  const names = ((again?.base_bdevs_list ?? []) as { name: string }[]).map((b) => b.name);
  const l1 = ((await call(s2, "bdev_get_bdevs", { name: "lvsA/l1" })) as { name: string }[])[0]?.name;
  expect(names).toContain(l1 as string);

  // seq 95-102: removing l1, then the last member l3, deletes r1; l3's superblock (the newer one)
  // brings it back degraded after a restart, l1's stale one does not.
  expect(await call(s2, "bdev_raid_remove_base_bdev", { name: "lvsA/l1" })).toBe(true);
  expect(await call(s2, "bdev_raid_remove_base_bdev", { name: "lvsA/l3" })).toBe(true);
  expect(await call(s2, "bdev_raid_get_bdevs", { category: "all" })).toEqual([]);
  expect(await rpc(s2, "bdev_raid_add_base_bdev", { raid_bdev: "r1", base_bdev: "lvsA/l1" })).toMatchObject({
    error: { code: -19, message: "raid bdev r1 is not found in config" },
  });
  const l3 = ((await call(s2, "bdev_get_bdevs", { name: "lvsA/l3" })) as { name: string }[])[0]?.name;
  const reassembled = async () => {
    await emu.close();
    emu = await start();
    const s3 = emu.socketPath;
    await call(s3, "bdev_nvme_attach_controller", {
      name: "Nvme0",
      trtype: "PCIe",
      traddr: DRIVE.pciAddress,
    });
    await call(s3, "bdev_wait_for_examine");
    return (await call(s3, "bdev_raid_get_bdevs", { category: "all" })) as Record<string, unknown>[];
  };
  const want = {
    name: "r1",
    uuid,
    state: "online",
    num_base_bdevs_discovered: 1,
    num_base_bdevs_operational: 1,
    base_bdevs_list: [
      { name: null, uuid: ZERO, is_configured: false, data_offset: 256, data_size: 16128 },
      { name: l3, is_configured: true, data_offset: 256, data_size: 16128 },
    ],
  };
  expect(await reassembled()).toMatchObject([want]);
  // seq 104-111: delete answers true once, -19 after; the superblocks survive it.
  expect(await call(emu.socketPath, "bdev_raid_delete", { name: "r1" })).toBe(true);
  expect(await rpc(emu.socketPath, "bdev_raid_delete", { name: "r1" })).toMatchObject({
    error: { code: -19, message: "raid bdev r1 not found" },
  });
  expect((await call(emu.socketPath, "bdev_get_bdevs", { name: "lvsA/l3" })) as unknown[]).toMatchObject([
    { claimed: false },
  ]);
  expect(await reassembled()).toMatchObject([want]);
});
