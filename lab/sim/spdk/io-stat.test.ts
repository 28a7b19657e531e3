// bdev_get_iostat and thread_get_stats on the emulator against real SPDK v25.05.1
// (testdata/spdk-v25.05.1-stats.jsonl, scenario 3 of the ha-qos-tls capture): the same keys in the
// same order for every reply shape, the same errors, and counters that move with fabric I/O.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { startTestTarget, type TestTarget } from "../fabric/test-target.ts";
import { connectController } from "./fabric.ts";
import { rpc } from "./raw-rpc-client.ts";

interface StatsRecord {
  seq: number;
  method: string;
  request: { params?: Record<string, unknown> };
  response: { result?: unknown; error?: { code: number; message: string } };
}

const RECORDS = new Map(
  readFileSync(join(import.meta.dir, "../../../testdata/spdk-v25.05.1-stats.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as StatsRecord)
    .map((r) => [r.seq, r]),
);
const record = (seq: number): StatsRecord => {
  const r = RECORDS.get(seq);
  if (!r) throw new Error(`no record ${seq} in the stats capture`);
  return r;
};

/** Every key path of a JSON value, in order: the shape two replies must share. */
function keyPaths(v: unknown, at = ""): string[] {
  if (Array.isArray(v)) return v.length === 0 ? [`${at}[]`] : keyPaths(v[0], `${at}[]`);
  if (v !== null && typeof v === "object") {
    return Object.entries(v).flatMap(([k, x]) => [`${at}.${k}`, ...keyPaths(x, `${at}.${k}`)]);
  }
  return [];
}

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:0d5c3c0e-8f0e-4c54-9a51-1f1f7a3e2b10";
const NQN = "nqn.2026-01.io.distort:vol-iostat-1";
const addr = { trtype: "TCP", traddr: "10.2.0.19", trsvcid: "4420" };
let target: TestTarget;
let bdev: string;
const call = (method: string, params?: Record<string, unknown>) =>
  rpc(target.emulator.socketPath, method, params);

beforeAll(async () => {
  // What is answered, not when: rpc-clock.test.ts covers the poller.
  target = await startTestTarget({ rpcPollMs: 0 });
  await target.exportFile({
    nqn: NQN,
    sizeBytes: 4 * MIB,
    hosts: [HOST],
    uuid: "7f3c9f62-2b0e-4d6a-9f43-5d7e1c2a9b80",
    ...{ traddr: addr.traddr, trsvcid: addr.trsvcid },
  });
  const [sub] = (await target.rpc.call("nvmf_get_subsystems", { nqn: NQN })) as {
    namespaces: { bdev_name: string }[];
  }[];
  bdev = sub?.namespaces[0]?.bdev_name as string;
});
afterAll(() => target.close());

test("the capture holds the stats calls it is used for", () => {
  expect([...RECORDS.values()].map((r) => r.method)).toEqual([
    "bdev_get_iostat",
    "bdev_get_iostat",
    "bdev_get_iostat",
    "bdev_get_iostat",
    "framework_get_reactors",
    "thread_get_stats",
  ]);
});

test("by name, all bdevs and per channel: SPDK's keys in SPDK's order", async () => {
  const c = await connectController(target.fabric, { ...addr, subnqn: NQN, hostnqn: HOST, hostid: "h-s" });
  try {
    await c.read(1, 0, 4096);
  } finally {
    c.close();
  }
  const byName = await call("bdev_get_iostat", { name: bdev });
  expect(keyPaths(byName.result)).toEqual(keyPaths(record(183).response.result));
  const all = await call("bdev_get_iostat");
  expect(keyPaths(all.result)).toEqual(keyPaths(record(185).response.result));
  const perChannel = await call("bdev_get_iostat", { name: bdev, per_channel: true });
  expect(keyPaths(perChannel.result)).toEqual(keyPaths(record(184).response.result));
});

test("errors: an unknown bdev, per_channel without a name, a bad reset_mode", async () => {
  expect((await call("bdev_get_iostat", { name: "nope" })).error).toEqual(record(186).response.error);
  // bdev_rpc.c: per_channel needs a name (-EINVAL); a decoder failure is -32603.
  expect((await call("bdev_get_iostat", { per_channel: true })).error).toEqual({
    code: -22,
    message: "Invalid argument",
  });
  expect((await call("bdev_get_iostat", { reset_mode: "some" })).error).toEqual({
    code: -32603,
    message: "spdk_json_decode_object failed",
  });
});

test("reads and writes over the fabric move bytes, ops and latency ticks", async () => {
  type Row = Record<
    | "num_write_ops"
    | "bytes_written"
    | "num_read_ops"
    | "bytes_read"
    | "write_latency_ticks"
    | "max_write_latency_ticks"
    | "min_write_latency_ticks"
    | "min_read_latency_ticks",
    number
  >;
  const get = async () =>
    ((await call("bdev_get_iostat", { name: bdev })).result as { bdevs: Row[] }).bdevs[0] as Row;
  const before = await get();
  const c = await connectController(target.fabric, { ...addr, subnqn: NQN, hostnqn: HOST, hostid: "h-s" });
  try {
    await c.write(1, 0, Buffer.alloc(8192, 7));
    await c.write(1, 8192, Buffer.alloc(4096, 7));
    await c.read(1, 0, 4096);
  } finally {
    c.close();
  }
  const after = await get();
  expect(after.num_write_ops - before.num_write_ops).toBe(2);
  expect(after.bytes_written - before.bytes_written).toBe(12288);
  expect(after.num_read_ops - before.num_read_ops).toBe(1);
  expect(after.bytes_read - before.bytes_read).toBe(4096);
  expect(after.write_latency_ticks).toBeGreaterThan(before.write_latency_ticks);
  expect(after.max_write_latency_ticks).toBeGreaterThanOrEqual(after.min_write_latency_ticks);
  expect(after.min_write_latency_ticks).toBeGreaterThan(0);
  // reset_mode "all" resets after reporting: the next read shows zeros.
  await call("bdev_get_iostat", { name: bdev, reset_mode: "all" });
  const reset = await get();
  expect([
    reset.num_read_ops,
    reset.num_write_ops,
    reset.write_latency_ticks,
    reset.min_read_latency_ticks,
  ]).toEqual([0, 0, 0, 0]);
});

test("thread_get_stats: SPDK's shape, the threads framework_get_reactors lists, no params", async () => {
  const stats = (await call("thread_get_stats")).result as { threads: { name: string; id: number }[] };
  expect(keyPaths(stats)).toEqual(keyPaths(record(191).response.result));
  const reactors = (await call("framework_get_reactors")).result as {
    reactors: { lw_threads: { name: string; id: number }[] }[];
  };
  expect(keyPaths(reactors)).toEqual(keyPaths(record(190).response.result));
  expect(stats.threads.map((t) => [t.name, t.id])).toEqual(
    reactors.reactors.flatMap((r) => r.lw_threads.map((t) => [t.name, t.id])),
  );
  expect((await call("thread_get_stats", {})).error).toEqual({
    code: -32602,
    message: "'thread_get_stats' requires no arguments",
  });
});
