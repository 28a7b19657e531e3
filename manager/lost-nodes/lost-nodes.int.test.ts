// The lost-node release against a real kube-apiserver, with the agents played by the test (each
// holds its finalizers the way the agent does): a partition deleted while its storage node is
// silent goes once the bound has passed, with a DataOnLostDevice Event, and its room stays held
// as a leftover through the running capacity controller; a replicated volume whose copy sits on
// a lost node is deleted all the same, the copy's admission record released with it.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { API_VERSION, kinds, type NVMePartition } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { editFinalizers } from "../finalizers.ts";
import { GiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";
import { AGENT_ATTACHMENT_FINALIZER, AGENT_PARTITION_FINALIZER } from "./lost-node-core.ts";

let tc: TestCluster;
const harnesses: Harness[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.stop()));
  await tc?.stop();
});

const BOUND_S = 2;

async function withNodes(prefix: string, nodes: string[]): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  for (const node of nodes) {
    await h.createDevice(node, { node, serial: `S-${h.ns}-${node}`, allocatable: 20 * GiB });
    await h.createClaim(`claim-${node}`, `S-${h.ns}-${node}`);
    await h.createNode(node);
  }
  await h.start({ DISTORT_LOST_NODE_RELEASE_AFTER_SECONDS: String(BOUND_S) });
  return h;
}

/** What an agent does first with a partition placed on its node. */
async function holdAsAgent(h: Harness, p: NVMePartition): Promise<void> {
  await editFinalizers(h.partitions, p.metadata.name, h.ns, p.metadata.uid as string, (f) =>
    f.includes(AGENT_PARTITION_FINALIZER) ? undefined : [...f, AGENT_PARTITION_FINALIZER],
  );
}

/** The node's agent stops beating: its last heartbeat `ageS` seconds ago. */
async function silence(h: Harness, node: string, ageS: number): Promise<void> {
  await updateStatus(h.nodes, node, h.ns, (latest) => ({
    ...(latest.status ?? { conditions: [] }),
    lastHeartbeatTime: new Date(Date.now() - ageS * 1000).toISOString(),
    conditions: latest.status?.conditions ?? [],
  }));
}

test("a partition deleted on a silent node goes past the bound; its room stays held as a leftover", async () => {
  const h = await withNodes("lostnode", ["node-a"]);
  await h.createPartition("p", { size: 2 * GiB });
  const placed = await eventually(
    async () => {
      const p = await h.partitions.get("p", h.ns);
      return p?.spec.nodeName ? p : undefined;
    },
    15_000,
    "placed",
  );
  const uid = placed.metadata.uid as string;
  await holdAsAgent(h, placed);
  await h.partitions.delete("p", h.ns);
  // The node still beats (its reporter every 0.5 s here): nothing happens, for longer than the
  // bound (its agent would delete the volume itself).
  for (let i = 0; i < 2 * (BOUND_S + 1); i++) {
    await silence(h, "node-a", 0);
    await Bun.sleep(500);
  }
  expect((await h.partitions.get("p", h.ns))?.metadata.finalizers).toContain(AGENT_PARTITION_FINALIZER);

  await silence(h, "node-a", BOUND_S + 1);
  await eventually(async () => ((await h.partitions.get("p", h.ns)) ? undefined : true), 15_000, "released");
  const events = await h.events("p");
  const lost = events.find((e) => e.startsWith("Warning DataOnLostDevice"));
  expect(lost).toContain("storage node node-a is lost");
  expect(lost).toContain(`drive S-${h.ns}-node-a`);
  // The capacity controller (running) keeps the entry of the gone partition: the room is held.
  await Bun.sleep(1500);
  const d = await h.devices.get(h.dev("node-a"));
  const entry = d?.status?.reservations?.find((r) => r.uid === uid);
  expect(entry?.leftover?.reason).toBe("NodeLost");
  expect(d?.status?.freeBytes).toBe(20 * GiB - 2 * GiB);
  expect((await h.events(h.dev("node-a"))).some((e) => e.startsWith("Warning DataOnLostDevice"))).toBe(true);
}, 60_000);

test("a replicated volume with a copy on a lost node is deleted; the copy and its admission are released", async () => {
  const h = await withNodes("lostrepl", ["node-a", "node-b"]);
  const attachments = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vol = await h.partitions.create({
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: { name: "vol", namespace: h.ns, labels: h.label },
    spec: {
      sizeBytes: 1 * GiB,
      backend: "spdk",
      volumeManager: "spdk-lvol",
      targetOptions: { transport: "tcp" },
      replicas: 2,
    },
  });
  const uid = vol.metadata.uid as string;
  const copies = await eventually(
    async () => {
      const rs = (await h.partitions.list({ namespace: h.ns })).items.filter(
        (p) => p.spec.replicaOf?.uid === uid,
      );
      return rs.length === 2 && rs.every((r) => r.spec.nodeName) && rs;
    },
    20_000,
    "two placed copies",
  );
  for (const r of copies) {
    await holdAsAgent(h, r);
    await updateStatus(h.partitions, r.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      state: "Exported" as const,
      conditions: latest.status?.conditions ?? [],
    }));
  }
  const served = await eventually(
    async () => {
      const v = await h.partitions.get("vol", h.ns);
      return v?.spec.nodeName && v.status?.dataGeneration === 1 ? v : undefined;
    },
    15_000,
    "served",
  );
  await holdAsAgent(h, served);
  // Each copy's agent holds its admission record until it revoked the host (its finalizer).
  const admissions = await eventually(
    async () => {
      const l = (await attachments.list({ namespace: h.ns })).items;
      return l.length === 2 ? l : undefined;
    },
    10_000,
    "admitted",
  );
  for (const a of admissions)
    await editFinalizers(attachments, a.metadata.name, h.ns, a.metadata.uid as string, (f) => [
      ...f,
      AGENT_ATTACHMENT_FINALIZER,
    ]);
  const servingNode = served.spec.nodeName as string;
  const lostNode = servingNode === "node-a" ? "node-b" : "node-a";
  const lostCopy = copies.find((c) => c.spec.nodeName === lostNode) as NVMePartition;
  const liveCopy = copies.find((c) => c.spec.nodeName === servingNode) as NVMePartition;
  await silence(h, lostNode, 3 * BOUND_S);

  await h.partitions.delete("vol", h.ns);
  // The serving node's agent (alive) tears its nexus down and lets go of the volume.
  await editFinalizers(h.partitions, "vol", h.ns, uid, (f) =>
    f.filter((x) => x !== AGENT_PARTITION_FINALIZER),
  );
  // The live copy's agent revokes and deletes as usual once the manager withdraws the admission.
  const liveAdmission = admissions.find((a) => a.spec.partitionUID === liveCopy.metadata.uid);
  await eventually(
    async () =>
      (await attachments.get(liveAdmission?.metadata.name as string, h.ns))?.metadata.deletionTimestamp
        ? true
        : undefined,
    15_000,
    "live copy's admission being deleted",
  );
  await editFinalizers(
    attachments,
    liveAdmission?.metadata.name as string,
    h.ns,
    liveAdmission?.metadata.uid as string,
    () => [],
  );
  await eventually(
    async () =>
      (await h.partitions.get(liveCopy.metadata.name, h.ns))?.metadata.deletionTimestamp ? true : undefined,
    15_000,
    "live copy being deleted",
  );
  await editFinalizers(h.partitions, liveCopy.metadata.name, h.ns, liveCopy.metadata.uid as string, (f) =>
    f.filter((x) => x !== AGENT_PARTITION_FINALIZER),
  );
  // Nobody plays the lost node's agent: the manager releases its copy and admission.
  await eventually(
    async () => ((await h.partitions.get("vol", h.ns)) ? undefined : true),
    30_000,
    "volume gone",
  );
  expect(await h.partitions.get(lostCopy.metadata.name, h.ns)).toBeUndefined();
  expect((await attachments.list({ namespace: h.ns })).items).toEqual([]);
  expect((await h.events(lostCopy.metadata.name)).some((e) => e.startsWith("Warning DataOnLostDevice"))).toBe(
    true,
  );
  // The lost node's drive holds the copy's room as a leftover; the live one's is free again.
  await eventually(
    async () => {
      const live = await h.devices.get(h.dev(servingNode));
      const lost = await h.devices.get(h.dev(lostNode));
      return (live?.status?.reservations ?? []).length === 0 &&
        lost?.status?.reservations?.some((r) => r.uid === lostCopy.metadata.uid && r.leftover)
        ? true
        : undefined;
    },
    15_000,
    "ledgers",
  );
}, 90_000);
