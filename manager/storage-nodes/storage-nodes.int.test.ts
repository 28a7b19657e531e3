// The storage-node reconciler against a real kube-apiserver: Ready expires with reason
// HeartbeatStale at the moment the heartbeat goes stale (not at the next resync), the node's
// devices carry StorageNodeReady, and a fresh report from the agent is never overruled.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { formatConditionTime } from "../../lib/kube/conditions.ts";
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

async function setup(prefix: string): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  return h;
}

const ready = async (h: Harness, node: string) =>
  (await h.nodes.get(node, h.ns))?.status?.conditions.find((c) => c.type === "Ready");
const deviceCond = async (h: Harness, dev: string) =>
  (await h.devices.get(h.dev(dev)))?.status?.conditions.find((c) => c.type === "StorageNodeReady");

/** What the agent's reporter does every scan: fresh heartbeat, Ready=True. */
async function heartbeat(h: Harness, node: string): Promise<void> {
  const n = await h.nodes.get(node, h.ns);
  if (!n?.status) throw new Error(`no status on ${node}`);
  const now = new Date();
  await h.nodes.replaceStatus({
    ...n,
    status: {
      ...n.status,
      lastHeartbeatTime: now.toISOString(),
      conditions: n.status.conditions.map((c) =>
        c.type === "Ready"
          ? {
              ...c,
              status: "True" as const,
              reason: "HeartbeatFresh",
              message: "",
              lastTransitionTime: formatConditionTime(now),
            }
          : c,
      ),
    },
  });
}

test("a stale heartbeat expires Ready and marks the node's devices; a new heartbeat restores them", async () => {
  const h = await setup("stale");
  await h.createNode("node-a", { heartbeat: Date.now() - 5 * 60_000 });
  await h.createNode("node-b");
  await h.createDevice("a1", { node: "node-a" });
  await h.createDevice("b1", { node: "node-b" });
  await h.createDevice("orphan", { node: "node-gone" });
  await h.start();

  const r = await eventually(
    async () => (await ready(h, "node-a"))?.status === "False" && ready(h, "node-a"),
    10_000,
    "expired",
  );
  expect(r).toMatchObject({ reason: "HeartbeatStale" });
  expect(r?.message).toMatch(/^no heartbeat since .* \(staleness window 60 s\)$/);
  expect(
    await eventually(async () =>
      (await h.events("node-a")).find((e) => e.startsWith("Warning HeartbeatStale")),
    ),
  ).toBeTruthy();
  expect(
    await eventually(
      async () => (await deviceCond(h, "a1"))?.reason === "HeartbeatStale" && deviceCond(h, "a1"),
    ),
  ).toMatchObject({
    status: "False",
  });
  expect(
    await eventually(async () => (await deviceCond(h, "b1"))?.status === "True" && deviceCond(h, "b1")),
  ).toMatchObject({
    reason: "NodeReady",
  });
  expect(await eventually(async () => (await deviceCond(h, "orphan"))?.reason === "NodeMissing")).toBe(true);
  expect((await ready(h, "node-b"))?.status).toBe("True");

  await heartbeat(h, "node-a");
  await eventually(async () => (await deviceCond(h, "a1"))?.status === "True", 10_000, "device restored");
  expect((await ready(h, "node-a"))?.status).toBe("True");
}, 30_000);

test("Ready expires when the window ends, without waiting for any other event", async () => {
  const h = await setup("expiry");
  await h.createNode("node-a");
  await h.createDevice("d", { node: "node-a" });
  await h.start({ DISTORT_HEARTBEAT_STALENESS_MS: "1500" });
  await eventually(async () => (await deviceCond(h, "d"))?.status === "True", 10_000, "fresh first");
  // Nothing else happens from here on (no writes, and the harness turns resync off), so only the
  // controller's own timer at the window's end can bring the expiry: reaching it at all proves
  // that, whatever the machine's load does to how soon.
  await eventually(
    async () => (await ready(h, "node-a"))?.reason === "HeartbeatStale",
    60_000,
    "expired by its own timer",
  );
  await eventually(
    async () => (await deviceCond(h, "d"))?.reason === "HeartbeatStale",
    30_000,
    "device follows",
  );
}, 120_000);
