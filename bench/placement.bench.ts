// Placement throughput: one manager process places 10 000 partitions over 500 claimed devices on a
// real control plane; yardstick (same run): the bare writes a placement needs, with no decisions. Also
// the manager's RSS, watch cache bytes per object, and where the time goes. Run: bun bench/placement.bench.ts [n] [devices]; without arguments (or --sizes a,b,c) it grows n over 1000, 5000, 10 000
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { KeyedMutex } from "../lib/concurrency/keyed-mutex.ts";
import { connect } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { roundUpToUnit } from "../lib/units.ts";
import { claim, device, forCreate, GiB, partition, storageNode } from "../manager/testdata/fixtures.ts";
import { TEST_LABEL } from "../manager/testdata/harness.ts";
import { ManagerProcess, metricValue } from "../manager/testdata/manager-process.ts";
import { runGrowth, sizesArg } from "./growth.ts";
import { cpuSeconds, machineBusySeconds, pool } from "./proc-stats.ts";
import { type Figure, writeResult } from "./report.ts";

const PARTITIONS = Number(process.argv[2] ?? 10_000);
const DEVICES = Number(process.argv[3] ?? 500);
const NODES = Math.max(1, Math.round(DEVICES / 10));
const WORKERS = 8; // the manager's default DISTORT_PLACEMENT_WORKERS
const YARDSTICK = Math.min(PARTITIONS, 2000);
/** A second yardstick pass with this many in flight: would more concurrency per write pay? */
const WIDE = 32;
const say = (s: string) => process.stdout.write(`${s}\n`);

function sizeOf(i: number): number {
  return (1 + ((i * 7919) % 8)) * GiB + (i % 3); // 1..8 GiB, not unit-aligned
}

// ---- measurement helpers: where the time and memory go ----

/**
 * The API server's own request counters and latency sums, keyed "VERB resource[/subresource]"
 * (counts also per code under "VERB resource code"). Read through the admin token.
 */
async function apiServerRequests(server: string, token: string, caPem: string): Promise<Map<string, number>> {
  const res = await fetch(`${server}/metrics`, {
    headers: { authorization: `Bearer ${token}` },
    tls: { ca: caPem },
  });
  const out = new Map<string, number>();
  const add = (k: string, v: number) => out.set(k, (out.get(k) ?? 0) + v);
  for (const line of (await res.text()).split("\n")) {
    const m =
      /^(apiserver_request_total|apiserver_request_duration_seconds_sum|apiserver_request_duration_seconds_count)\{(.*)\} (\S+)$/.exec(
        line,
      );
    if (!m) continue;
    const labels = Object.fromEntries(
      [...(m[2] as string).matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]),
    );
    const what = `${labels.verb} ${labels.resource}${labels.subresource ? `/${labels.subresource}` : ""}`;
    const v = Number(m[3]);
    if (m[1] === "apiserver_request_total") {
      add(what, v);
      add(`${what} ${labels.code}`, v);
    } else if (m[1] === "apiserver_request_duration_seconds_sum") add(`${what} seconds`, v);
    else add(`${what} timed`, v);
  }
  return out;
}

/** after - before, for every key of `after`. */
function delta(before: Map<string, number>, after: Map<string, number>): Map<string, number> {
  return new Map([...after].map(([k, v]) => [k, v - (before.get(k) ?? 0)]));
}

// Without a size (as `bun run bench` runs it), or with --sizes a,b,c: the growth run, one process
// per size, each with its own control plane.
const GROWTH_SIZES = [1000, 5000, 10_000];
if (import.meta.main && (process.argv.length <= 2 || sizesArg(process.argv) !== undefined)) {
  await runGrowth({
    bench: "placement",
    file: import.meta.path,
    sizes: sizesArg(process.argv) ?? GROWTH_SIZES,
    argsFor: (n) => [String(n)],
    noun: "partitions",
    svgPath: new URL("../docs/placement-growth.svg", import.meta.url).pathname,
    chartTitle: "Placement: time and memory by number of partitions (500 devices)",
  });
  process.exit(0);
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

  // Counters before the run: the API server's requests and every process's CPU time.
  const [etcdPid, apiPid] = cp.pids();
  const apiBefore = await apiServerRequests(cp.server, cp.token, cp.caPem);
  const cpuBefore = {
    api: cpuSeconds(apiPid),
    etcd: cpuSeconds(etcdPid),
    manager: cpuSeconds(mgr.pid),
    bench: cpuSeconds(process.pid),
    machine: machineBusySeconds(),
  };
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
  const cpuDuring = {
    api: cpuSeconds(apiPid) - cpuBefore.api,
    etcd: cpuSeconds(etcdPid) - cpuBefore.etcd,
    manager: cpuSeconds(mgr.pid) - cpuBefore.manager,
    bench: cpuSeconds(process.pid) - cpuBefore.bench,
    machine: machineBusySeconds() - cpuBefore.machine,
  };
  const apiDuring = delta(apiBefore, await apiServerRequests(cp.server, cp.token, cp.caPem));
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

  // Watch cache bytes per object, measured in a fresh process (this one holds too much garbage of
  // its own for heap deltas to mean anything): the heap, after full GCs, that one more WatchCache
  // of these partitions (the manager's selector, its schema parse, managedFields stripped) adds.
  // The first cache absorbs one-time costs; the next three are the samples.
  const cacheProbe = `
    import { kinds } from ${JSON.stringify(new URL("../api/index.ts", import.meta.url).pathname)};
    import { WatchCache } from ${JSON.stringify(new URL("../lib/kube/cache.ts", import.meta.url).pathname)};
    import { connect } from ${JSON.stringify(new URL("../lib/kube/connection.ts", import.meta.url).pathname)};
    import { ResourceClient } from ${JSON.stringify(new URL("../lib/kube/resource.ts", import.meta.url).pathname)};
    import { silentLogger } from ${JSON.stringify(new URL("../lib/log.ts", import.meta.url).pathname)};
    const parts = new ResourceClient(connect(process.env.PROBE_KUBECONFIG), kinds.NVMePartition);
    const settled = async () => {
      for (let i = 0; i < 5; i++) { Bun.gc(true); await Bun.sleep(50); }
      return process.memoryUsage().heapUsed;
    };
    const caches = [];
    const fill = async () => {
      const c = new WatchCache(parts, { labelSelector: process.env.PROBE_SELECTOR, logger: silentLogger });
      await c.start();
      await c.stop();
      caches.push(c);
      return c.keys().length;
    };
    let mark = await settled();
    const perObject = [];
    let objects = 0;
    for (let i = 0; i < 4; i++) {
      objects = await fill();
      const h = await settled();
      perObject.push((h - mark) / objects);
      mark = h;
    }
    const json = JSON.stringify(caches[0].list()).length / objects;
    process.stdout.write(JSON.stringify({ objects, perObject: perObject.slice(1), json }));
  `;
  const probe = Bun.spawn([process.execPath, "-e", cacheProbe], {
    env: { ...process.env, PROBE_KUBECONFIG: cp.kubeconfigPath, PROBE_SELECTOR: `${TEST_LABEL}=${ns}` },
    stdout: "pipe",
    stderr: "inherit",
  });
  const probeOut = await new Response(probe.stdout).text();
  if ((await probe.exited) !== 0) throw new Error(`the cache probe failed: ${probeOut}`);
  const {
    objects: cached,
    perObject: cacheSamples,
    json: jsonBytes,
  } = JSON.parse(probeOut) as {
    objects: number;
    perObject: number[];
    json: number;
  };
  const cacheBytes = cacheSamples.reduce((a, b) => a + b, 0) / cacheSamples.length;
  await mgr.terminate();

  // --- the yardstick: bare placement writes, no decisions ---
  const ys = `${ns}-ys`;
  await core.createNamespace({ body: { metadata: { name: ys } } });
  const latest = new Map<string, NVMeDevice>(devs.map((d) => [d.metadata.name, d]));
  const locks = new KeyedMutex();
  /** Milliseconds for YARDSTICK bare placements (ledger PUT, spec PATCH, status PUT) at `inFlight`. */
  const bareWrites = async (prefix: string, inFlight: number): Promise<number> => {
    const ysParts: NVMePartition[] = [];
    await pool([...Array(YARDSTICK).keys()], 64, async (i) => {
      ysParts[i] = await parts.create(forCreate(partition(ys, `${prefix}${i}`, { size: sizeOf(i) })));
    });
    const y0 = performance.now();
    await pool(ysParts, inFlight, async (p, i) => {
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
    return performance.now() - y0;
  };
  const ysMs = await bareWrites("p", WORKERS);
  const ysWideMs = await bareWrites("q", WIDE);

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

  // ---- where the time and memory go ----
  const MiB = 2 ** 20;
  const perPart = (k: string) => (apiDuring.get(k) ?? 0) / PARTITIONS;
  const meanMs = (k: string) => {
    const n = apiDuring.get(`${k} timed`) ?? 0;
    return n > 0 ? ((apiDuring.get(`${k} seconds`) ?? 0) / n) * 1000 : Number.NaN;
  };
  const series = (name: string, controller: string) =>
    metricValue(metrics, `${name}{controller="${controller}"}`);
  const reconciles = series("distort_reconcile_duration_seconds_count", "placement");
  const busy = series("distort_reconcile_duration_seconds_sum", "placement");
  const calls = [
    ["PUT nvmedevices/status", "ledger entry"],
    ["PATCH nvmepartitions", "spec assignment"],
    ["PUT nvmepartitions/status", "Scheduled=True"],
    ["POST events", "Placed event (background)"],
    ["GET nvmedeviceclaims", "fresh claim"],
    ["GET rdmastoragenodes", "fresh node"],
    ["GET nvmedevices", "device re-read after a conflict"],
  ] as const;
  const writeKinds = [...apiDuring.keys()].filter(
    (k) => /^(POST|PUT|PATCH|DELETE) \S+$/.test(k) && (apiDuring.get(k) ?? 0) > 0,
  );
  const writesTotal = writeKinds.reduce((a, k) => a + (apiDuring.get(k) ?? 0), 0);
  const benchCreates = apiDuring.get("POST nvmepartitions") ?? 0;
  const managerWrites = writesTotal - benchCreates;
  const profile = [
    `API requests per placed partition during the run (kube-apiserver's apiserver_request_total, ${PARTITIONS} partitions): ${calls
      .map(
        ([k, what]) =>
          `${k} ${perPart(k).toFixed(2)} (${what}${Number.isNaN(meanMs(k)) ? "" : `; server mean ${meanMs(k).toFixed(1)} ms`})`,
      )
      .join(", ")}; 409 conflicts on device status: ${apiDuring.get("PUT nvmedevices/status 409") ?? 0}.`,
    `Writes: ${writesTotal} in ${(placeMs / 1000).toFixed(1)} s (${(writesTotal / (placeMs / 1000)).toFixed(0)}/s): the bench's ${benchCreates} partition creates plus ${(managerWrites / PARTITIONS).toFixed(2)} manager writes per partition (events included).`,
    `One placement, sequential within a worker: GET claim || GET node -> PUT device status (under the device's in-process lock) -> PATCH partition spec -> PUT partition status; the Event is written in the background. Conflicts (${conflicts}) show the per-device lock is not where time goes: with ${DEVICES} devices and in-flight decisions counted against their device, ${WORKERS} workers rarely want the same device.`,
    `Placement reconciles: ${reconciles} (${(reconciles / PARTITIONS).toFixed(2)} per partition; the later ones are no-ops on the placed object), mean ${((busy / Math.max(1, reconciles)) * 1000).toFixed(1)} ms; workers busy ${((busy / (WORKERS * (placeMs / 1000))) * 100).toFixed(0)}% of the run, so the rate is ${WORKERS} workers / per-placement round trips.`,
    `CPU seconds during the ${(placeMs / 1000).toFixed(1)} s run (2 cores = ${((2 * placeMs) / 1000).toFixed(0)} available): kube-apiserver ${cpuDuring.api.toFixed(1)}, etcd ${cpuDuring.etcd.toFixed(1)}, manager ${cpuDuring.manager.toFixed(1)}, bench (creates + polling) ${cpuDuring.bench.toFixed(1)}; whole machine busy ${cpuDuring.machine.toFixed(1)} (other users included).`,
    `Bare writes (yardstick) at ${WORKERS} in flight: ${ysRate.toFixed(0)} partitions/s; at ${WIDE} in flight: ${(YARDSTICK / (ysWideMs / 1000)).toFixed(0)} partitions/s.`,
  ];
  const notes = [
    `Watch cache bytes per object: in a fresh Bun process, the heap (after full GCs) one more WatchCache adds when it lists the ${cached} placed partitions with the manager's selector, over their count; three caches measured after a first one: ${cacheSamples.map((x) => x.toFixed(0)).join(", ")}, mean ${cacheBytes.toFixed(0)} B/object; their JSON (managedFields stripped) is ${jsonBytes.toFixed(0)} B/object. Manager RSS grew ${((peakRss - (baseRss ?? 0)) / PARTITIONS).toFixed(0)} B per partition (cache, inventory, queues and garbage together).`,
    "Yardstick: the same three writes per partition (ledger PUT, spec PATCH, status PUT) with no decisions and no reads, on 2000 partitions.",
  ];
  say(`  watch cache per object    ${cacheBytes.toFixed(0)} B heap (${jsonBytes.toFixed(0)} B JSON)`);
  for (const l of profile) say(`  profile: ${l}`);
  for (const l of notes) say(`  note: ${l}`);
  const figures: Figure[] = [
    {
      id: "placement-seconds",
      label: `time to place ${PARTITIONS} partitions on ${DEVICES} devices`,
      value: Number((placeMs / 1000).toFixed(1)),
      unit: "s",
      better: "lower",
      target: { text: "< 60 s", met: placeMs < 60_000 },
    },
    {
      id: "placement-rate",
      label: "placement rate",
      value: Math.round(rate),
      unit: "partitions/s",
      better: "higher",
      yardstick: {
        label: `bare writes, ${WORKERS} in flight`,
        value: Math.round(ysRate),
        unit: "partitions/s",
      },
      ratio: Number((rate / ysRate).toFixed(2)),
      ratioLabel: "manager / bare writes",
    },
    {
      id: "manager-rss",
      label: "manager peak RSS",
      value: Math.round(peakRss / MiB),
      unit: "MiB",
      better: "lower",
      target: { text: "< 250 MiB", met: peakRss < 250 * MiB },
    },
    {
      id: "cache-bytes-per-object",
      label: "watch cache heap per NVMePartition",
      value: Math.round(cacheBytes),
      unit: "B",
      better: "lower",
      yardstick: { label: "its JSON", value: Math.round(jsonBytes), unit: "B" },
      ratio: Number((cacheBytes / jsonBytes).toFixed(2)),
      ratioLabel: "heap / JSON",
    },
  ];
  const missed = figures.some((f) => f.target && !f.target.met);
  writeResult({
    bench: "placement",
    figures,
    notes: missed ? notes : [...notes, ...profile],
    ...(missed ? { profile } : {}),
  });
} finally {
  await cp.stop();
}
