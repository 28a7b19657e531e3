// Watch-driven reconcile coalescing: 100 concurrent updates to one object, through the real
// watch cache, work queue and runner with a reconcile that takes 100 ms; how many reconciles
// they cause. (lib/kube/cache.int.test.ts proves the mechanism with a latch; the rate belongs
// here.) Yardstick: the updates themselves. Run: bun bench/watch-coalescing.bench.ts [updates] [rounds]

import * as k8s from "@kubernetes/client-node";
import { exampleNVMePartition } from "../api/examples.ts";
import { kinds, type NVMePartition } from "../api/index.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { eventually } from "../lab/cluster/test-support.ts";
import { realClock } from "../lib/clock.ts";
import { WatchCache } from "../lib/kube/cache.ts";
import { connect } from "../lib/kube/connection.ts";
import { WorkQueue } from "../lib/kube/queue.ts";
import { objectKey, ResourceClient } from "../lib/kube/resource.ts";
import { runController } from "../lib/kube/runner.ts";
import { silentLogger } from "../lib/log.ts";
import { type Figure, median, writeResult } from "./report.ts";

const UPDATES = Number(process.argv[2] ?? 100);
const ROUNDS = Number(process.argv[3] ?? 3);
const RECONCILE_MS = 100;
const say = (s: string) => process.stdout.write(`${s}\n`);

const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
try {
  const conn = connect(cp.kubeconfigPath);
  await installCrds(conn);
  const parts = new ResourceClient<NVMePartition>(conn, kinds.NVMePartition);
  const ns = `coalesce-${Date.now().toString(36)}`;
  await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name: ns } } });
  const ex = exampleNVMePartition();
  const counts: number[] = [];
  const seconds: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const name = `hot-${round}`;
    await parts.create({
      apiVersion: ex.apiVersion,
      kind: ex.kind,
      metadata: { name, namespace: ns },
      spec: { sizeBytes: 2 ** 30, backend: "spdk", volumeManager: "partition" },
    } as NVMePartition);
    const cache = new WatchCache(parts, { namespace: ns, logger: silentLogger });
    const queue = new WorkQueue({ name: "coalesce" });
    cache.on({
      add: (o) => queue.add(objectKey(o.metadata)),
      update: (_o, n) => queue.add(objectKey(n.metadata)),
    });
    let reconciles = 0;
    let lastSize = 0;
    const ctl = runController({
      name: "coalesce",
      queue,
      workers: 2,
      logger: silentLogger,
      clock: realClock,
      async reconcile(key) {
        if (!key.endsWith(`/${name}`)) return;
        reconciles++;
        lastSize = cache.get(key)?.spec.sizeBytes ?? 0;
        await Bun.sleep(RECONCILE_MS);
      },
    });
    await cache.start();
    await eventually(() => reconciles >= 1 && queue.length === 0, 30_000, "initial reconcile");
    const base = reconciles;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: UPDATES }, (_, i) =>
        parts.mergePatch(name, ns, { metadata: { annotations: { n: String(i) } } }),
      ),
    );
    await parts.mergePatch(name, ns, { spec: { sizeBytes: 3 * 2 ** 30 } });
    await eventually(() => lastSize === 3 * 2 ** 30 && queue.length === 0, 60_000, "final state reconciled");
    seconds.push((performance.now() - t0) / 1000);
    counts.push(reconciles - base);
    say(`round ${round + 1}: ${UPDATES + 1} updates -> ${reconciles - base} reconciles`);
    await ctl.stop();
    await cache.stop();
  }
  const figures: Figure[] = [
    {
      id: "reconciles",
      label: `reconciles caused by ${UPDATES + 1} concurrent updates to one object (reconcile ${RECONCILE_MS} ms)`,
      value: median(counts),
      unit: "reconciles",
      better: "lower",
      yardstick: { label: "updates written", value: UPDATES + 1, unit: "updates" },
      ratio: median(counts) / (UPDATES + 1),
      ratioLabel: "reconciles / updates",
      target: { text: "< 1/3 of updates", met: median(counts) < (UPDATES + 1) / 3 },
    },
  ];
  writeResult({
    bench: "watch-coalescing",
    figures,
    notes: [
      `per round: ${counts.join(", ")} reconciles; ${seconds.map((s) => s.toFixed(2)).join(", ")} s from the first update to the last reconcile`,
    ],
  });
} finally {
  await cp.stop();
}
