// Placement throughput: one manager process places 10 000 partitions over 500 claimed devices on a
// real control plane; yardstick (same run): the bare writes a placement needs, with no decisions.
// Prints time, rate, ratio and the manager's peak RSS. Run: bun bench/placement.bench.ts [n] [devices]
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { connect } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { roundUpToUnit } from "../lib/units.ts";
import { KeyedMutex } from "../manager/device-locks.ts";
import { claim, device, forCreate, GiB, partition, storageNode } from "../manager/testdata/fixtures.ts";
import { TEST_LABEL } from "../manager/testdata/harness.ts";
import { ManagerProcess, metricValue } from "../manager/testdata/manager-process.ts";

const PARTITIONS = Number(process.argv[2] ?? 10_000);
const DEVICES = Number(process.argv[3] ?? 500);
const NODES = Math.max(1, Math.round(DEVICES / 10));
const WORKERS = 8; // the manager's default DISTORT_PLACEMENT_WORKERS
const YARDSTICK = Math.min(PARTITIONS, 2000);
const say = (s: string) => process.stdout.write(`${s}\n`);

/** Runs `fn` over `items` with at most `n` in flight. */
async function pool<T>(items: T[], n: number, fn: (x: T, i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, items.length) }, async () => {
      for (let i = next++; i < items.length; i = next++) await fn(items[i] as T, i);
    }),
  );
}

function sizeOf(i: number): number {
  return (1 + ((i * 7919) % 8)) * GiB + (i % 3); // 1..8 GiB, not unit-aligned
}

const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
try {
  const conn = connect(cp.kubeconfigPath);
  await installCrds(conn);
  const core = conn.api(k8s.CoreV1Api);
  const devices = new ResourceClient(conn, kinds.NVMeDevice);
  const claims = new ResourceClient(conn, kinds.NVMeDeviceClaim);
  const parts = new ResourceClient(conn, kinds.NVMePartition);
  const nodes = new ResourceClient(conn, kinds.RDMAStorageNode);

  // --- the manager run ---
  const ns = `bench-${randomBytes(3).toString("hex")}`;
  const labels = { [TEST_LABEL]: ns };
  await core.createNamespace({ body: { metadata: { name: ns } } });
  say(`setup: ${NODES} nodes, ${DEVICES} devices and claims in ${ns}`);
  await pool([...Array(NODES).keys()], 16, async (n) => {
    const rec = storageNode(`node-${n}`, { heartbeat: Date.now() + 3_600_000, namespace: ns, labels });
    const created = await nodes.create(forCreate(rec));
    await nodes.replaceStatus({ ...created, status: rec.status });
  });
  await pool([...Array(DEVICES).keys()], 32, async (i) => {
    const serial = `S-${ns}-${i}`;
    await devices.create(
      forCreate(device(`${ns}-d${i}`, { node: `node-${i % NODES}`, serial, allocatable: 100 * GiB, labels })),
    );
    await claims.create(forCreate(claim(ns, `c${i}`, { serial, labels })));
  });
  const mgr = new ManagerProcess("bench-manager", {
    DISTORT_KUBECONFIG: cp.kubeconfigPath,
    DISTORT_NAMESPACE: ns,
    DISTORT_LABEL_SELECTOR: `${TEST_LABEL}=${ns}`,
    DISTORT_RESYNC_MS: "0",
  });
  await mgr.start();
  for (;;) {
    const bound = (await claims.list({ namespace: ns })).items.filter(
      (c) => c.status?.phase === "Bound",
    ).length;
    if (bound === DEVICES) break;
    await Bun.sleep(200);
  }
  const baseRss = await mgr.peakRssBytes();
  say(`manager ready, claims bound; RSS before partitions ${((baseRss ?? 0) / 2 ** 20).toFixed(0)} MiB`);

  const t0 = performance.now();
  let created = 0;
  const creating = pool([...Array(PARTITIONS).keys()], 64, async (i) => {
    await parts.create(forCreate(partition(ns, `p${i}`, { size: sizeOf(i), labels })));
    created++;
  }).then(() => performance.now() - t0);
  let placed = 0;
  let lastPrint = 0;
  while (placed < PARTITIONS) {
    await Bun.sleep(250);
    const m = await mgr.metrics();
    placed = metricValue(m, 'distort_placements_total{result="placed"}');
    if (performance.now() - lastPrint > 5000) {
      lastPrint = performance.now();
      say(`  ${((performance.now() - t0) / 1000).toFixed(1)} s: ${created} created, ${placed} placed`);
    }
    if (performance.now() - t0 > 900_000) throw new Error("placement did not finish in 15 minutes");
  }
  const placeMs = performance.now() - t0;
  const createMs = await creating;
  const metrics = await mgr.metrics();
  const peakRss = (await mgr.peakRssBytes()) ?? 0;
  const latSum = metricValue(metrics, "distort_placement_latency_seconds_sum");
  const latCount = metricValue(metrics, "distort_placement_latency_seconds_count");
  const conflicts = metricValue(metrics, "distort_reservation_conflicts_total");

  // Check the outcome before trusting the timing.
  const all = (await parts.list({ namespace: ns })).items;
  const devs = (await devices.list({ labelSelector: `${TEST_LABEL}=${ns}` })).items;
  const used = new Map<string, number>();
  for (const p of all) {
    if (!p.spec.nodeName) throw new Error(`${p.metadata.name} not placed`);
    const k = `${p.spec.nodeName}/${p.spec.deviceSerial}`;
    used.set(k, (used.get(k) ?? 0) + roundUpToUnit(p.spec.sizeBytes));
  }
  const over = devs.filter(
    (d) => (used.get(`${d.spec.nodeName}/${d.spec.serial}`) ?? 0) > d.spec.allocatableBytes,
  );
  if (over.length > 0) throw new Error(`${over.length} devices over-committed`);
  await mgr.terminate();

  // --- the yardstick: bare placement writes, no decisions ---
  const ys = `${ns}-ys`;
  await core.createNamespace({ body: { metadata: { name: ys } } });
  const ysParts: NVMePartition[] = [];
  await pool([...Array(YARDSTICK).keys()], 64, async (i) => {
    ysParts[i] = await parts.create(forCreate(partition(ys, `p${i}`, { size: sizeOf(i) })));
  });
  const latest = new Map<string, NVMeDevice>(devs.map((d) => [d.metadata.name, d]));
  const locks = new KeyedMutex();
  const y0 = performance.now();
  await pool(ysParts, WORKERS, async (p, i) => {
    const d = devs[i % devs.length] as NVMeDevice;
    await locks.run(d.metadata.name, async () => {
      const cur = latest.get(d.metadata.name) as NVMeDevice;
      const entry = {
        uid: p.metadata.uid as string,
        namespace: ys,
        name: p.metadata.name,
        bytes: roundUpToUnit(p.spec.sizeBytes),
      };
      const status = {
        ...(cur.status as NonNullable<NVMeDevice["status"]>),
        reservations: [...(cur.status?.reservations ?? []), entry],
      };
      latest.set(d.metadata.name, await devices.replaceStatus({ ...cur, status }));
    });
    const patched = await parts.mergePatch(p.metadata.name, ys, {
      metadata: { uid: p.metadata.uid },
      spec: { nodeName: d.spec.nodeName, deviceSerial: d.spec.serial, claimRef: d.status?.claimRef },
    });
    await parts.replaceStatus({ ...patched, status: { state: "Placed", conditions: [] } });
  });
  const ysMs = performance.now() - y0;

  const rate = PARTITIONS / (placeMs / 1000);
  const ysRate = YARDSTICK / (ysMs / 1000);
  say("");
  say(
    `placement of ${PARTITIONS} partitions over ${DEVICES} devices on ${NODES} nodes (1 manager, ${WORKERS} placement workers)`,
  );
  say(
    `  all placed after          ${(placeMs / 1000).toFixed(1)} s (creating them took ${(createMs / 1000).toFixed(1)} s)`,
  );
  say(`  placement rate            ${rate.toFixed(0)} partitions/s`);
  say(
    `  mean placement latency    ${latCount > 0 ? (latSum / latCount).toFixed(2) : "?"} s (first seen -> placed)`,
  );
  say(`  ledger write conflicts    ${conflicts}`);
  say(
    `  manager peak RSS          ${(peakRss / 2 ** 20).toFixed(0)} MiB (${((baseRss ?? 0) / 2 ** 20).toFixed(0)} MiB before partitions)`,
  );
  say(
    `  yardstick: bare writes    ${ysRate.toFixed(0)} partitions/s (${YARDSTICK} partitions, ${WORKERS} in flight)`,
  );
  say(`  ratio manager/yardstick   ${(rate / ysRate).toFixed(2)}`);
} finally {
  await cp.stop();
}
