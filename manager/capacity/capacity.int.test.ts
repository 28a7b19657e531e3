// The capacity reconciler against a real kube-apiserver: free bytes follow placed partitions
// (rounded, terminating ones included until gone), dead ledger entries are dropped only once the
// API server confirms it, manual placements count but are never adopted, and over-commitment is flagged.
import { afterAll, beforeAll, expect, test } from "bun:test";
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

async function claimed(prefix: string, allocatable: number): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  await h.createDevice("d", { node: "node-a", serial: `S-${h.ns}`, allocatable });
  await h.createNode("node-a");
  await h.createClaim("c", `S-${h.ns}`);
  return h;
}

const free = async (h: Harness) => (await h.devices.get(h.dev("d")))?.status?.freeBytes;

test("free bytes follow partitions; terminating ones count until gone; deletion frees the entry", async () => {
  const h = await claimed("free", 10 * GiB);
  await h.start();
  await eventually(async () => (await free(h)) === 10 * GiB, 10_000, "initial free");
  await h.createPartition("a", { size: 1 }); // rounds to 4 MiB
  await h.createPartition("b", { size: 2 * GiB });
  await eventually(async () => (await free(h)) === 10 * GiB - 4 * MiB - 2 * GiB, 10_000, "after two");

  // A partition the agent has not cleaned up yet (its finalizer holds it) keeps its space.
  await h.partitions.mergePatch("b", h.ns, { metadata: { finalizers: ["test.distort.io/agent-cleanup"] } });
  await h.partitions.delete("b", h.ns);
  await Bun.sleep(500);
  expect(await free(h)).toBe(10 * GiB - 4 * MiB - 2 * GiB);
  expect((await h.devices.get(h.dev("d")))?.status?.reservations?.map((r) => r.name).sort()).toEqual([
    "a",
    "b",
  ]);

  await h.partitions.mergePatch("b", h.ns, { metadata: { finalizers: null } });
  await eventually(async () => (await free(h)) === 10 * GiB - 4 * MiB, 10_000, "b gone");
  expect((await h.devices.get(h.dev("d")))?.status?.reservations?.map((r) => r.name)).toEqual(["a"]);
  const gauge = h.registry.render();
  expect(gauge).toContain(
    `distort_device_free_bytes{device="${h.dev("d")}",node="node-a"} ${10 * GiB - 4 * MiB}`,
  );
}, 30_000);

test("ledger entries whose partition is gone or placed elsewhere are dropped; live unplaced ones kept", async () => {
  const h = await claimed("gc", 10 * GiB);
  await h.start();
  await eventually(
    async () => (await h.devices.get(h.dev("d")))?.status?.phase === "Claimed",
    10_000,
    "claimed",
  );
  // Entries as a crashed placement would leave them: for a partition that was deleted, for one
  // placed on another device, and for one still waiting (kept: a placement may be in flight).
  const waiting = await h.createPartition("waiting", {
    size: GiB,
    topology: { requisite: [{ segments: { zone: "none" } }] },
  });
  const elsewhere = await h.createPartition("elsewhere", { size: GiB, node: "node-z", serial: "S-other" });
  await h.patchDeviceStatus("d", (s) => {
    s.reservations = [
      { uid: "00000000-0000-4000-8000-00000000dead", namespace: h.ns, name: "deleted", bytes: 3 * GiB },
      { uid: elsewhere.metadata.uid as string, namespace: h.ns, name: "elsewhere", bytes: GiB },
      { uid: waiting.metadata.uid as string, namespace: h.ns, name: "waiting", bytes: GiB },
    ];
  });
  const d = await eventually(
    async () => {
      const x = await h.devices.get(h.dev("d"));
      return x?.status?.reservations?.length === 1 && x;
    },
    10_000,
    "dead entries dropped",
  );
  expect(d.status?.reservations?.[0]?.name).toBe("waiting");
  expect(d.status?.freeBytes).toBe(9 * GiB);
}, 30_000);

test("a manually placed partition counts against the device but gets no ledger entry; over-commitment is flagged", async () => {
  const h = await claimed("adopt", 1 * GiB);
  await h.start();
  await eventually(
    async () => (await h.devices.get(h.dev("d")))?.status?.phase === "Claimed",
    10_000,
    "claimed",
  );
  const manual = await h.createPartition("manual", { size: 2 * GiB, node: "node-a", serial: `S-${h.ns}` });
  const d = await eventually(
    async () => {
      const x = await h.devices.get(h.dev("d"));
      return x?.status?.conditions.find((c) => c.type === "Overcommitted")?.status === "True" && x;
    },
    10_000,
    "Overcommitted",
  );
  // No entry: the agent provisions only placements the ledger holds (agent/partitions/decide.ts).
  expect(manual.metadata.uid).toBeDefined();
  expect(d.status?.reservations).toEqual([]);
  expect(d.status?.freeBytes).toBe(0);
  expect(
    await eventually(async () =>
      (await h.events(h.dev("d"))).find((e) => e.startsWith("Warning Overcommitted")),
    ),
  ).toContain("1 GiB more than its 1 GiB");
  await h.partitions.delete("manual", h.ns);
  await eventually(
    async () =>
      (await h.devices.get(h.dev("d")))?.status?.conditions.find((c) => c.type === "Overcommitted")
        ?.status === "False",
    10_000,
    "cleared",
  );
  expect(await free(h)).toBe(GiB);
}, 30_000);
