// The placement reconciler against a real kube-apiserver: most-free choice with the ledger entry
// stored before the spec, and each refusal (stale node, backend lock, no room, topology) named in
// Scheduled=False with an Event, then placed once the obstacle goes away.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { NVMePartition } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { GiB, MiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";

let tc: TestCluster;
const harnesses: Harness[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.stop()));
  await tc?.stop();
});

/** A harness with claimed devices: name -> [node, allocatable bytes]. */
async function withDevices(prefix: string, devices: Record<string, [string, number]>): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  for (const [name, [node, bytes]] of Object.entries(devices)) {
    await h.createDevice(name, { node, serial: `S-${h.ns}-${name}`, allocatable: bytes });
    await h.createClaim(`claim-${name}`, `S-${h.ns}-${name}`);
  }
  for (const node of new Set(Object.values(devices).map(([n]) => n))) {
    if (!(await h.nodes.get(node, h.ns))) await h.createNode(node);
  }
  return h;
}

/** Waits until every claim in the harness namespace is Bound (placement only uses bound claims). */
async function allBound(h: Harness): Promise<void> {
  await eventually(
    async () => (await h.claims.list({ namespace: h.ns })).items.every((c) => c.status?.phase === "Bound"),
    10_000,
    "claims bound",
  );
}

async function scheduled(h: Harness, name: string) {
  return (await h.partitions.get(name, h.ns))?.status?.conditions.find((c) => c.type === "Scheduled");
}

async function placed(h: Harness, name: string): Promise<NVMePartition> {
  return eventually(
    async () => {
      const p = await h.partitions.get(name, h.ns);
      return p?.spec.nodeName !== undefined && p?.status?.state === "Placed" && p;
    },
    15_000,
    `${name} placed`,
  );
}

test("places on the claimed device with most free bytes; ledger entry, spec, Scheduled and Event", async () => {
  const h = await withDevices("place", { small: ["node-a", 10 * GiB], big: ["node-b", 20 * GiB] });
  await h.start();
  await allBound(h);
  const created = await h.createPartition("p1", { size: 12 * GiB + 1 });
  const p = await placed(h, "p1");
  expect(p.spec).toMatchObject({ nodeName: "node-b", deviceSerial: `S-${h.ns}-big` });
  const claim = await h.claims.get("claim-big", h.ns);
  expect(p.spec.claimRef).toEqual({ namespace: h.ns, name: "claim-big", uid: claim?.metadata.uid as string });
  expect(p.status?.conditions.find((c) => c.type === "Scheduled")).toMatchObject({
    status: "True",
    reason: "Placed",
    observedGeneration: p.metadata.generation,
  });
  const dev = await h.devices.get(h.dev("big"));
  const rounded = 12 * GiB + 4 * MiB;
  expect(dev?.status?.reservations).toEqual([
    { uid: created.metadata.uid as string, namespace: h.ns, name: "p1", bytes: rounded },
  ]);
  expect(dev?.status?.freeBytes).toBe(20 * GiB - rounded);
  // Placed events are aggregated per device (one per window), so they are on the device.
  const events = await eventually(
    async () => (await h.events(h.dev("big"))).find((e) => e.startsWith("Normal Placed")),
    30_000,
    "Placed event on the device",
  );
  expect(events).toContain(`placed 1 partition on node node-b, serial S-${h.ns}-big`);
  expect(events).toContain(`${h.ns}/p1`);
  expect((await h.events("p1")).filter((e) => e.includes("Placed"))).toEqual([]);

  // Next one goes to the now-most-free device (10 GiB free against 8 GiB - 4 MiB).
  await h.createPartition("p2", { size: 1 * GiB });
  expect((await placed(h, "p2")).spec.nodeName).toBe("node-a");
}, 30_000);

test("a stale node is refused with NodeStale, then used once its heartbeat is fresh again", async () => {
  const h = await withDevices("stale", { d: ["node-a", 10 * GiB] });
  await h.nodes.delete("node-a", h.ns);
  await h.createNode("node-a", { heartbeat: Date.now() - 10 * 60_000 });
  await h.start();
  await h.createPartition("p", { size: GiB });
  const cond = await eventually(
    async () => (await scheduled(h, "p"))?.reason === "NodeStale" && scheduled(h, "p"),
    10_000,
    "NodeStale",
  );
  expect(cond).toMatchObject({ status: "False" });
  expect(cond?.message).toContain("1 on stale nodes (node-a: HeartbeatStale)");
  expect(
    await eventually(async () =>
      (await h.events("p")).find((e) => e.startsWith("Warning FailedPlacement") && e.includes("stale")),
    ),
  ).toBeTruthy();
  // The manager expires Ready on the stale record; the agent's next report revives it.
  await eventually(
    async () =>
      (await h.nodes.get("node-a", h.ns))?.status?.conditions.find((c) => c.type === "Ready")?.reason ===
      "HeartbeatStale",
    10_000,
    "Ready expired",
  );
  const n = await h.nodes.get("node-a", h.ns);
  await h.nodes.replaceStatus({
    ...(n as NonNullable<typeof n>),
    status: {
      ...n?.status,
      lastHeartbeatTime: new Date().toISOString(),
      conditions: (n?.status?.conditions ?? []).map((c) =>
        c.type === "Ready"
          ? {
              ...c,
              status: "True" as const,
              reason: "HeartbeatFresh",
              lastTransitionTime: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
            }
          : c,
      ),
    },
  });
  expect((await placed(h, "p")).spec.nodeName).toBe("node-a");
}, 30_000);

test("a device locked to the other backend is refused with BackendLocked; a matching partition fits", async () => {
  const h = await withDevices("lock", { d: ["node-a", 10 * GiB] });
  await h.start();
  await eventually(
    async () => (await h.devices.get(h.dev("d")))?.status?.phase === "Claimed",
    10_000,
    "claimed",
  );
  await h.patchDeviceStatus("d", (s) => {
    s.activeBackend = "kernel";
  });
  await h.createPartition("spdk-vol", { size: GiB, backend: "spdk" });
  await h.createPartition("kernel-vol", { size: GiB, backend: "kernel" });
  const k = await placed(h, "kernel-vol");
  expect(k.spec.deviceSerial).toBe(`S-${h.ns}-d`);
  const c = await eventually(
    async () => (await scheduled(h, "spdk-vol"))?.reason === "BackendLocked" && scheduled(h, "spdk-vol"),
  );
  expect(c?.message).toContain("1 locked to backend kernel");
  expect((await h.partitions.get("spdk-vol", h.ns))?.spec.nodeName).toBeUndefined();
}, 30_000);

test("no fit: InsufficientCapacity with backoff; placed as soon as a claimed device adds room", async () => {
  const h = await withDevices("nofit", { small: ["node-a", 1 * GiB] });
  await h.start({ DISTORT_PLACEMENT_BACKOFF_MAX_MS: "60000" });
  await h.createPartition("big", { size: 2 * GiB });
  const c = await eventually(
    async () => (await scheduled(h, "big"))?.reason === "InsufficientCapacity" && scheduled(h, "big"),
  );
  expect(c?.message).toBe("0/1 devices can hold 2 GiB (spdk): 1 without room (most free 1 GiB)");
  expect((await h.partitions.get("big", h.ns))?.status?.state).toBe("Pending");
  // Backoff, not a fixed period: retries get further apart while it stays unschedulable.
  const failures = () =>
    Number(/distort_placements_total\{result="unschedulable"\} (\d+)/.exec(h.registry.render())?.[1] ?? 0);
  // A busy machine only makes retries rarer, so the upper bound holds under any load.
  const before = failures();
  const windowStart = Date.now();
  await eventually(() => failures() > before, 15_000, "a retry");
  await Bun.sleep(Math.max(0, 4000 - (Date.now() - windowStart)));
  const inWindow = failures() - before;
  expect(inWindow).toBeLessThanOrEqual(6); // a fixed 200 ms period would be ~20
  expect(
    await eventually(async () =>
      (await h.events("big")).find(
        (e) => e.startsWith("Warning FailedPlacement") && e.includes("without room"),
      ),
    ),
  ).toBeTruthy();

  // Add room right after a backoff retry made once the partition has been unschedulable for
  // UNSCHEDULABLE_MS, so the next backoff retry is at least that far off: placement sooner than
  // that was triggered by the claim binding. The margin is the whole UNSCHEDULABLE_MS, so a
  // busy machine that slows the triggered path by seconds still passes.
  const UNSCHEDULABLE_MS = 12_000;
  const since = Date.parse(c?.lastTransitionTime ?? "");
  await eventually(() => Date.now() - since >= UNSCHEDULABLE_MS, 60_000, "unschedulable long enough");
  const seen = failures();
  await eventually(() => failures() > seen, 60_000, "a backoff retry");
  const t0 = Date.now();
  await h.createDevice("large", { node: "node-a", serial: `S-${h.ns}-large`, allocatable: 4 * GiB });
  await h.createClaim("claim-large", `S-${h.ns}-large`);
  expect((await placed(h, "big")).spec.deviceSerial).toBe(`S-${h.ns}-large`);
  expect(Date.now() - t0).toBeLessThan(UNSCHEDULABLE_MS);
}, 120_000);

test("topology: requisite restricts nodes, preferred orders them; least-loaded-node spreads", async () => {
  const h = await harness(tc, "topo");
  harnesses.push(h);
  for (const [name, node, zone, size] of [
    ["a", "node-a", "z1", 50],
    ["b", "node-b", "z2", 20],
    ["c", "node-c", "z2", 10],
  ] as const) {
    await h.createDevice(name, { node, serial: `S-${h.ns}-${name}`, allocatable: size * GiB });
    await h.createClaim(`claim-${name}`, `S-${h.ns}-${name}`);
    await h.createNode(node, { labels: { "topology.kubernetes.io/zone": zone } });
  }
  await h.start({ DISTORT_SPREAD_POLICY: "least-loaded-node" });
  await allBound(h);
  const zone = (z: string) => ({ segments: { "topology.kubernetes.io/zone": z } });
  await h.createPartition("req", { size: GiB, topology: { requisite: [zone("z2")] } });
  expect((await placed(h, "req")).spec.nodeName).toBe("node-b"); // z2, most free
  await h.createPartition("pref", {
    size: GiB,
    topology: { requisite: [zone("z1"), zone("z2")], preferred: [zone("z2")] },
  });
  expect((await placed(h, "pref")).spec.nodeName).toBe("node-c"); // z2, least loaded
  await h.createPartition("nowhere", { size: GiB, topology: { requisite: [zone("z9")] } });
  await eventually(
    async () => (await scheduled(h, "nowhere"))?.reason === "TopologyMismatch",
    10_000,
    "TopologyMismatch",
  );
  await h.createPartition("any", { size: GiB });
  expect((await placed(h, "any")).spec.nodeName).toBe("node-a"); // the only node with no partition yet
}, 30_000);
