// The SPDK statistics collector against the SPDK emulator: per-volume I/O that moves with fabric
// I/O, connected hosts, lvstore space and thin allocation, reactor load, served/failed volumes,
// the bounded controller queries, and a failed round keeping the last good numbers.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestTarget, TEST_LVSTORE, type TestTarget } from "../../lab/sim/fabric/test-target.ts";
import { connectController } from "../../lab/sim/spdk/fabric.ts";
import { silentLogger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import type { SpdkRpc } from "../../lib/spdk/client.ts";
import { type ServedVolume, SpdkStatsCollector, spdkStatsMetrics } from "./spdk-stats.ts";

const MIB = 1024 * 1024;
const HOST_A = "nqn.2014-08.org.nvmexpress:uuid:1b9d7a52-6f7c-4d0e-8a0b-3c2d1e0f9a01";
const HOST_B = "nqn.2014-08.org.nvmexpress:uuid:1b9d7a52-6f7c-4d0e-8a0b-3c2d1e0f9a02";
const NQN1 = "nqn.2026-01.io.distort:vol-stats-1";
const NQN2 = "nqn.2026-01.io.distort:vol-stats-2";
const addr = { trtype: "TCP", traddr: "10.2.0.29", trsvcid: "4420" };
let target: TestTarget;
let bdev1: string;
let bdev2: string;
let thin: string;

beforeAll(async () => {
  target = await startTestTarget({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "SSTATS", model: "Sim", sizeBytes: 256 * MIB }],
  });
  const spec = { sizeBytes: 8 * MIB, hosts: [HOST_A, HOST_B], ...addr };
  bdev1 = await target.exportLvol({ ...spec, nqn: NQN1, uuid: "5a0e9b1c-7d2f-4e3a-9b8c-0d1e2f3a4b51" }, "v1");
  bdev2 = await target.exportLvol({ ...spec, nqn: NQN2, uuid: "5a0e9b1c-7d2f-4e3a-9b8c-0d1e2f3a4b52" }, "v2");
  thin = (await target.rpc.call("bdev_lvol_create", {
    lvs_name: TEST_LVSTORE,
    lvol_name: "thin1",
    size_in_mib: 64,
    thin_provision: true,
  })) as string;
});
afterAll(() => target.close());

const volumes = (): ServedVolume[] => [
  { namespace: "team-a", partition: "p1", state: "Exported", bdev: bdev1, nqn: NQN1 },
  { namespace: "team-a", partition: "p2", state: "Exported", bdev: bdev2, nqn: NQN2 },
  {
    namespace: "team-b",
    partition: "gone",
    state: "Exported",
    bdev: "no-such-bdev",
    nqn: "nqn.2026-01.io.distort:vol-x",
  },
  { namespace: "team-b", partition: "broken", state: "Failed", bdev: undefined, nqn: undefined },
];

function collector(rpc: SpdkRpc = target.rpc, maxControllerQueries?: number) {
  const registry = new Registry();
  const metrics = spdkStatsMetrics(registry);
  const c = new SpdkStatsCollector({
    rpc,
    metrics,
    volumes,
    logger: silentLogger,
    now: () => Date.now(),
    ...(maxControllerQueries === undefined ? {} : { maxControllerQueries }),
  });
  return { registry, metrics, c };
}

const p1 = { namespace: "team-a", partition: "p1" };
const p2 = { namespace: "team-a", partition: "p2" };

describe("SpdkStatsCollector", () => {
  test("volume I/O counters move with fabric I/O; latency in seconds from SPDK's ticks", async () => {
    const { metrics, c } = collector();
    await c.round();
    const before = {
      w: metrics.writeOps.get(p1),
      wb: metrics.writeBytes.get(p1),
      r: metrics.readOps.get(p1),
    };
    const ctrl = await connectController(target.fabric, {
      ...addr,
      subnqn: NQN1,
      hostnqn: HOST_A,
      hostid: "ha",
    });
    try {
      for (let i = 0; i < 4; i++) await ctrl.write(1, i * 4096, Buffer.alloc(4096, i + 1));
      await ctrl.read(1, 0, 8192);
    } finally {
      ctrl.close();
    }
    await c.round();
    expect(metrics.writeOps.get(p1) - before.w).toBe(4);
    expect(metrics.writeBytes.get(p1) - before.wb).toBe(16384);
    expect(metrics.readOps.get(p1) - before.r).toBe(1);
    expect(metrics.readBytes.get(p1)).toBeGreaterThanOrEqual(8192);
    const ws = metrics.writeSeconds.get(p1);
    expect(ws).toBeGreaterThan(0);
    // Mean write latency of an emulated write on a local file: well under a second.
    expect(ws / metrics.writeOps.get(p1)).toBeLessThan(1);
    expect(metrics.writeOps.get(p2)).toBe(0);
  });

  test("connected hosts count distinct host NQNs with a controller", async () => {
    const { metrics, c } = collector();
    const a = await connectController(target.fabric, {
      ...addr,
      subnqn: NQN2,
      hostnqn: HOST_A,
      hostid: "ha",
    });
    const b = await connectController(target.fabric, {
      ...addr,
      subnqn: NQN2,
      hostnqn: HOST_B,
      hostid: "hb",
    });
    try {
      await c.round();
      expect(metrics.connectedHosts.get(p2)).toBe(2);
      expect(metrics.connectedHosts.get(p1)).toBe(0);
    } finally {
      a.close();
      b.close();
    }
  });

  test("served, failed, lvstore space, thin allocation and reactor load", async () => {
    const { registry, metrics, c } = collector();
    await c.round();
    expect(metrics.served.get(p1)).toBe(1);
    expect(metrics.served.get({ namespace: "team-b", partition: "gone" })).toBe(0);
    expect(metrics.failed.get({ namespace: "team-b", partition: "broken" })).toBe(1);
    expect(metrics.failed.get(p1)).toBe(0);
    const [store] = (await target.rpc.call("bdev_lvol_get_lvstores")) as {
      name: string;
      base_bdev: string;
      total_data_clusters: number;
      free_clusters: number;
      cluster_size: number;
    }[];
    if (!store) throw new Error("no lvstore");
    const l = { lvstore: store.name, base_bdev: store.base_bdev };
    expect(metrics.lvstoreTotal.get(l)).toBe(store.total_data_clusters * store.cluster_size);
    expect(metrics.lvstoreFree.get(l)).toBe(store.free_clusters * store.cluster_size);
    // Two thick 8 MiB lvols and one thin 64 MiB one.
    expect(metrics.lvstoreProvisioned.get(l)).toBe(80 * MIB);
    const [thinBdev] = (await target.rpc.call("bdev_get_bdevs", { name: thin })) as {
      driver_specific: { lvol: { num_allocated_clusters: number } };
    }[];
    expect(metrics.lvstoreThinAllocated.get(l)).toBe(
      (thinBdev?.driver_specific.lvol.num_allocated_clusters ?? -1) * store.cluster_size,
    );
    const text = registry.render();
    expect(text).toMatch(/distort_spdk_reactor_busy_seconds_total\{lcore="0"\} [0-9.e-]+/);
    expect(text).toMatch(
      /distort_spdk_thread_idle_seconds_total\{thread="nvmf_tgt_poll_group_000"\} [0-9.e-]+/,
    );
    expect(text).toContain('distort_spdk_stats_rounds_total{result="ok"} 1');
  });

  test("controller queries per round are bounded and rotate over the subsystems", async () => {
    const asked: string[] = [];
    const rpc: SpdkRpc = {
      call: (method, params, opts) => {
        if (method === "nvmf_subsystem_get_controllers") asked.push((params as { nqn: string }).nqn);
        return target.rpc.call(method, params, opts);
      },
      serialize: (k, fn) => target.rpc.serialize(k, fn),
    };
    const { c } = collector(rpc, 1);
    await c.round();
    await c.round();
    await c.round();
    // Two served subsystems (the third volume's NQN is not on the target): one per round, in turn.
    expect(asked).toEqual([NQN1, NQN2, NQN1]);
  });

  test("a failed round is counted and the families keep the last good numbers", async () => {
    let fail = false;
    const rpc: SpdkRpc = {
      call: (method, params) =>
        fail ? Promise.reject(new Error("target gone")) : target.rpc.call(method, params),
      serialize: (k, fn) => target.rpc.serialize(k, fn),
    };
    const { registry, metrics, c } = collector(rpc);
    await c.round();
    const ops = metrics.writeOps.get(p1);
    fail = true;
    await c.round();
    expect(metrics.writeOps.get(p1)).toBe(ops);
    expect(registry.render()).toContain('distort_spdk_stats_rounds_total{result="error"} 1');
  });
});
