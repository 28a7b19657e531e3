// The manager binary against a real kube-apiserver: exactly one of two processes leads and runs
// controllers, both serve /healthz, /readyz and /metrics, the metrics the manager promises are
// there, a graceful stop releases the lease for the standby, and bad configuration exits with a message.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { GiB } from "./testdata/fixtures.ts";
import { harness } from "./testdata/harness.ts";
import { ManagerProcess, metricValue } from "./testdata/manager-process.ts";

let tc: TestCluster;
const procs: ManagerProcess[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill()));
  await tc?.stop();
});

test("one leader runs the controllers; probes and metrics on both; graceful handover", async () => {
  const h = await harness(tc, "main");
  await h.createDevice("d", { node: "node-a", serial: `S-${h.ns}`, allocatable: 10 * GiB });
  await h.createNode("node-a");
  await h.createClaim("c", `S-${h.ns}`);
  const env = h.env({
    DISTORT_LEADER_ELECT: "true",
    DISTORT_LEASE_DURATION_MS: "4000",
    DISTORT_RENEW_DEADLINE_MS: "3000",
    DISTORT_RETRY_PERIOD_MS: "500",
  });
  const a = new ManagerProcess("main-a", env);
  const b = new ManagerProcess("main-b", env);
  procs.push(a, b);
  await a.start();
  await eventually(
    async () => metricValue(await a.metrics(), "distort_manager_leader") === 1,
    10_000,
    "a leads",
  );
  await b.start();
  for (const m of [a, b]) {
    expect(await m.probe("/healthz")).toBe(200);
    expect(await m.probe("/readyz")).toBe(200);
  }
  await Bun.sleep(1500); // b campaigns against a live lease for a while
  expect(metricValue(await b.metrics(), "distort_manager_leader")).toBe(0);

  await h.createPartition("p1", { size: GiB });
  await eventually(
    async () => (await h.partitions.get("p1", h.ns))?.status?.state === "Placed",
    10_000,
    "p1 placed",
  );
  const am = await a.metrics();
  expect(metricValue(am, "distort_placement_latency_seconds_count")).toBe(1);
  expect(metricValue(am, 'distort_placements_total{result="placed"}')).toBe(1);
  expect(metricValue(am, "distort_partitions_pending")).toBe(0);
  expect(am).toContain(`distort_device_free_bytes{device="${h.dev("d")}",node="node-a"}`);
  expect(am).toContain('distort_reconcile_total{controller="placement",result="success"}');
  expect(b.count("partition placed")).toBe(0); // the standby did no work

  // SIGTERM releases the lease: proven by the Lease itself (no longer naming a once a has
  // exited), so b need not wait for it to expire; then b takes over.
  expect(await a.terminate()).toBe(0);
  const lease = await tc.conn
    .api(k8s.CoordinationV1Api)
    .readNamespacedLease({ name: "distort-manager", namespace: h.ns });
  expect(["", b.id]).toContain(lease.spec?.holderIdentity ?? "");
  await eventually(
    async () => metricValue(await b.metrics(), "distort_manager_leader") === 1,
    60_000,
    "b leads",
  );
  await h.createPartition("p2", { size: GiB });
  await eventually(
    async () => (await h.partitions.get("p2", h.ns))?.status?.state === "Placed",
    10_000,
    "p2 placed",
  );
  expect(b.count("partition placed")).toBe(1);
  expect(await b.terminate()).toBe(0);
}, 60_000);

test("invalid configuration exits 2 naming the variable", async () => {
  const proc = Bun.spawn([process.execPath, join(import.meta.dir, "main.ts")], {
    env: { ...process.env, DISTORT_KUBECONFIG: tc.kubeconfigPath, DISTORT_SPREAD_POLICY: "random" },
    stdout: "pipe",
    stderr: "pipe",
  });
  expect(await proc.exited).toBe(2);
  expect(await new Response(proc.stderr).text()).toContain("DISTORT_SPREAD_POLICY");
}, 30_000);
