// What a placement costs the API server, counted (not timed): one manager process places 120
// partitions on 6 devices; its own request counter (distort_kube_requests_total) must show at
// most 3 requests per placement besides watches (ledger write, spec write, status write), and
// Placed events aggregated per device rather than one per partition.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { GiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";
import { ManagerProcess } from "../testdata/manager-process.ts";

const DEVICES = 6;
const PARTITIONS = 120;

let tc: TestCluster;
const procs: ManagerProcess[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(procs.map((p) => p.kill()));
  await tc?.stop();
});

/** "VERB resource" -> requests, from the manager's distort_kube_requests_total (all codes). */
function requests(metrics: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of metrics.matchAll(
    /^distort_kube_requests_total\{verb="([^"]+)",resource="([^"]+)",code="[^"]*"\} (\S+)$/gm,
  )) {
    const k = `${m[1]} ${m[2]}`;
    out.set(k, (out.get(k) ?? 0) + Number(m[3]));
  }
  return out;
}

/** Everything but the long-lived watches (which are opened once, not per placement). */
function perRequest(m: Map<string, number>): number {
  let n = 0;
  for (const [k, v] of m) if (!k.startsWith("WATCH ")) n += v;
  return n;
}

/** Waits until the manager sends nothing for a while and its queues are empty: a quiet state. */
async function quiet(m: ManagerProcess): Promise<Map<string, number>> {
  let last = -1;
  return eventually(
    async () => {
      const text = await m.metrics();
      const depth = [...text.matchAll(/^distort_workqueue_depth\{[^}]*\} (\S+)$/gm)].some(
        (x) => x[1] !== "0",
      );
      const now = requests(text);
      const n = perRequest(now);
      const settled = !depth && n === last;
      last = n;
      if (!settled) await Bun.sleep(1000);
      return settled && now;
    },
    120_000,
    "manager quiet",
  );
}

async function setup(): Promise<Harness> {
  const h = await harness(tc, "requests");
  for (let i = 0; i < DEVICES; i++) {
    await h.createNode(`node-${i}`, { heartbeat: Date.now() + 10 * 60_000 });
    await h.createDevice(`d${i}`, { node: `node-${i}`, serial: `S-${h.ns}-${i}`, allocatable: 100 * GiB });
    await h.createClaim(`c${i}`, `S-${h.ns}-${i}`);
  }
  return h;
}

test("a placement costs at most 3 API requests; Placed events are one per device and window", async () => {
  const h = await setup();
  const m = new ManagerProcess("req", h.env({ DISTORT_LOG_LEVEL: "info" }));
  procs.push(m);
  await m.start();
  await eventually(
    async () => (await h.claims.list({ namespace: h.ns })).items.every((c) => c.status?.phase === "Bound"),
    60_000,
    "claims bound",
  );
  const before = await quiet(m);

  await Promise.all(
    Array.from({ length: PARTITIONS }, (_, i) => h.createPartition(`p${i}`, { size: GiB + i })),
  );
  await eventually(
    async () =>
      (await h.partitions.list({ namespace: h.ns })).items.filter(
        (p) =>
          p.spec.nodeName &&
          p.status?.state === "Placed" &&
          p.status.conditions.some((c) => c.type === "Scheduled" && c.status === "True"),
      ).length === PARTITIONS,
    300_000,
    "all placed",
  );
  // Every placement is named in exactly one Placed digest on its device.
  const named = await eventually(
    async () => {
      const all: string[] = [];
      for (let i = 0; i < DEVICES; i++) {
        for (const e of await h.events(h.dev(`d${i}`))) {
          if (e.startsWith("Normal Placed")) all.push(e);
        }
      }
      const counted = all.reduce((n, e) => n + Number(/placed (\d+) partition/.exec(e)?.[1] ?? 0), 0);
      return counted === PARTITIONS && all;
    },
    120_000,
    "Placed digests",
  );
  const after = await quiet(m);

  const delta = new Map<string, number>();
  for (const [k, v] of after) {
    const d = v - (before.get(k) ?? 0);
    if (d > 0) delta.set(k, d);
  }
  const events = [...delta].filter(([k]) => k.endsWith(" events")).reduce((n, [, v]) => n + v, 0);
  const other = perRequest(delta) - events;
  console.log(
    `${PARTITIONS} placements: ${other} requests besides events (${(other / PARTITIONS).toFixed(2)} each), ` +
      `${events} event writes (${named.length} Placed digests); ${JSON.stringify(Object.fromEntries(delta))}`,
  );
  expect(other).toBeLessThanOrEqual(3 * PARTITIONS);
  // Placed events are aggregated; any other event (e.g. a refusal) would be a per-object write.
  expect(events).toBeLessThanOrEqual(named.length);
  expect(named.length).toBeLessThan(PARTITIONS / 4);
  expect(await m.terminate()).toBe(0);
}, 600_000);
