// The raid1 model on in-memory bdevs with a manual clock: superblock space, mirrored writes,
// degraded operation when a member's write fails, a paced rebuild whose progress moves with the
// clock and that leaves the members equal, remove/add, and re-assembly by examine.
import { expect, test } from "bun:test";
import { randomBytes, randomUUID } from "node:crypto";
import { ManualClock } from "../../../lib/clock.ts";
import { silentLogger } from "../../../lib/log.ts";
import { Bdev, BdevRegistry, IO_TYPES, SYSTEM_AND_ACCEL_DOMAINS } from "./bdev.ts";
import { MemoryIo } from "./block-io.ts";
import { Raids } from "./raid.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

const BS = 4096;
const MIB = 1024 * 1024;

function setup() {
  const clock = new ManualClock();
  const registry = new BdevRegistry(() => {});
  const raids = new Raids(registry, clock, silentLogger);
  const mem = new Map<string, MemoryIo>();
  const add = async (name: string, mib = 64, io?: MemoryIo) => {
    const m = io ?? new MemoryIo(mib * MIB);
    mem.set(name, m);
    const b = new Bdev({
      name,
      uuid: randomUUID(),
      module: "malloc",
      productName: "Malloc disk",
      blockSize: BS,
      io: m,
      ioTypes: IO_TYPES.malloc,
      memoryDomains: SYSTEM_AND_ACCEL_DOMAINS,
      driverSpecific: () => ({}),
    });
    await registry.register(b);
    return b;
  };
  return { clock, registry, raids, mem, add };
}

async function drain(clock: ManualClock, ms: number, step = 10): Promise<void> {
  for (let t = 0; t < ms; t += step) {
    clock.advance(step);
    for (let i = 0; i < 20; i++) await Promise.resolve();
    await Bun.sleep(0);
  }
}

test("superblock reserves 256 blocks of every 4 KiB-block base; the raid is that much smaller", async () => {
  const { raids, add, registry } = setup();
  await add("a");
  await add("b");
  await raids.create("r1", ["a", "b"], true);
  const info = raids.get("r1")?.info() as { base_bdevs_list: { data_offset: number; data_size: number }[] };
  expect(info.base_bdevs_list.map((s) => [s.data_offset, s.data_size])).toEqual([
    [256, 16128],
    [256, 16128],
  ]);
  expect(registry.get("r1")?.numBlocks).toBe(16128);
  expect(registry.get("a")?.claim).toEqual({ type: "exclusive_write", owner: "raid" });
  await raids.create("r0", ["c", "d"], false).catch(() => {});
  // Without a superblock nothing is reserved.
  await add("e");
  await add("f");
  await raids.create("r2", ["e", "f"], false);
  expect(registry.get("r2")?.numBlocks).toBe(16384);
});

test("writes reach every member at the data offset; a member whose write fails is dropped, the write succeeds", async () => {
  const { raids, add, registry, mem } = setup();
  await add("a");
  const b = await add("b");
  await raids.create("r1", ["a", "b"], true);
  const io = registry.get("r1")?.io;
  if (!io) throw new Error("no raid bdev");
  const data = randomBytes(8 * BS);
  await io.write(10 * BS, data);
  for (const n of ["a", "b"]) {
    expect((await mem.get(n)?.read((256 + 10) * BS, data.length))?.equals(data)).toBe(true);
  }
  (mem.get("b") as MemoryIo).write = () => Promise.reject(new ErrnoError(Errno.EIO, "gone"));
  const data2 = randomBytes(4 * BS);
  await io.write(0, data2);
  for (let i = 0; i < 5; i++) await Bun.sleep(0);
  const info = raids.get("r1")?.info() as Record<string, unknown>;
  expect(info.state).toBe("online");
  expect(info.num_base_bdevs_discovered).toBe(1);
  expect(info.num_base_bdevs_operational).toBe(1);
  expect((info.base_bdevs_list as unknown[])[1]).toEqual({
    name: null,
    uuid: "00000000-0000-0000-0000-000000000000",
    is_configured: false,
    data_offset: 0,
    data_size: 16128,
  });
  expect(b.claim).toBeNull();
  expect((await io.read(0, data2.length)).equals(data2)).toBe(true);
});

test("a rebuild onto an added member is paced by the bandwidth limit, reports progress, and ends with equal members", async () => {
  const { raids, add, registry, mem, clock } = setup();
  await add("a");
  await add("b");
  await raids.create("r1", ["a", "b"], true);
  const io = registry.get("r1")?.io;
  if (!io) throw new Error("no raid bdev");
  const pattern = randomBytes(16 * MIB);
  await io.write(0, pattern);
  await add("d");
  // A full raid has no empty slot (SPDK: "no empty slot found").
  await expect(raids.addBase("r1", "d")).rejects.toMatchObject({ errno: Errno.EINVAL });
  await raids.removeBase("b");
  await io.write(20 * MIB, pattern.subarray(0, MIB)); // Written while degraded: only on a.
  await add("c");
  raids.options = { process_window_size_kb: 1024, process_max_bandwidth_mb_sec: 8 };
  await raids.addBase("r1", "c");
  await expect(raids.addBase("r1", "d")).rejects.toMatchObject({ errno: Errno.EPERM });
  const seen: number[] = [];
  const during = randomBytes(MIB);
  for (let i = 0; i < 200 && raids.get("r1")?.rebuild; i++) {
    await drain(clock, 500, 125);
    // Writes during the rebuild, ahead of and behind the copy window, must end up on both members.
    if (i === 3) await io.write(2 * MIB, during);
    if (i === 4) await io.write(60 * MIB, during);
    const info = raids.get("r1")?.info() as { process?: { progress: { percent: number } } } | undefined;
    const p = info?.process;
    if (p) seen.push(p.progress.percent);
  }
  expect(raids.get("r1")?.rebuild).toBeNull();
  // 63 MiB at 8 MiB/s: about 8 s of clock, so several intermediate percentages were observable.
  expect(seen.length).toBeGreaterThanOrEqual(5);
  expect(seen).toEqual([...seen].sort((x, y) => x - y));
  expect(clock.now()).toBeGreaterThanOrEqual(7000);
  const size = 16128 * BS;
  const a = await mem.get("a")?.read(256 * BS, size);
  const c = await mem.get("c")?.read(256 * BS, size);
  expect(a && c && a.equals(c)).toBe(true);
  expect(c?.subarray(0, 2 * MIB).equals(pattern.subarray(0, 2 * MIB))).toBe(true);
  expect(c?.subarray(2 * MIB, 3 * MIB).equals(during)).toBe(true);
  expect(c?.subarray(60 * MIB, 61 * MIB).equals(during)).toBe(true);
  // Reads during and after the rebuild see the same data.
  expect((await io.read(20 * MIB, MIB)).equals(pattern.subarray(0, MIB))).toBe(true);
});

test("removing the last member deletes the raid; a base re-registered later re-assembles it from its superblock", async () => {
  const { raids, add, registry, mem } = setup();
  await add("a");
  await add("b");
  await raids.create("r1", ["a", "b"], true, "11111111-2222-3333-4444-555555555555");
  const data = randomBytes(BS * 3);
  await registry.get("r1")?.io.write(BS, data);
  await raids.removeBase("a");
  await raids.removeBase("b");
  expect(raids.list()).toEqual([]);
  expect(registry.get("r1")).toBeUndefined();
  // Both bases vanish and come back (an app restart over persistent files): a is stale (removed
  // first), b holds the newer superblock, so r1 comes back online with b only.
  const aIo = mem.get("a") as MemoryIo;
  const bIo = mem.get("b") as MemoryIo;
  const oldA = registry.get("a") as Bdev;
  const oldB = registry.get("b") as Bdev;
  await registry.unregister(oldA);
  await registry.unregister(oldB);
  const registerAgain = async (old: Bdev, io: MemoryIo) =>
    registry.register(new Bdev({ ...old.init, io, name: old.name, uuid: old.uuid }));
  await registerAgain(oldA, aIo);
  expect(raids.get("r1")?.state).toBe("configuring");
  await registerAgain(oldB, bIo);
  const r = raids.get("r1");
  expect(r?.state).toBe("online");
  expect(r?.uuid).toBe("11111111-2222-3333-4444-555555555555");
  expect(registry.get("a")?.claim).toBeNull();
  const info = r?.info() as { base_bdevs_list: Record<string, unknown>[] };
  expect(info.base_bdevs_list[0]).toEqual({
    name: null,
    uuid: "00000000-0000-0000-0000-000000000000",
    is_configured: false,
    data_offset: 256,
    data_size: 16128,
  });
  expect(info.base_bdevs_list[1]?.name).toBe("b");
  expect((await registry.get("r1")?.io.read(BS, data.length))?.equals(data)).toBe(true);
});
