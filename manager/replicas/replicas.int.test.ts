// The replica controller and placement together against a real kube-apiserver: a replicated volume
// gets one replica partition per copy, each placed through the device ledger on its own storage
// node; the copies come Online at data generation 1 once every one is exported; too few nodes
// leave the last copy unschedulable with ReplicaAntiAffinity; deleting the volume removes every
// replica and then the volume, and the ledger lets go of their room.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { API_VERSION, kinds, type NVMePartition, type NVMeVolumeAttachment } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { CacheSet } from "../../lib/kube/cache-set.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { silentLogger } from "../../lib/log.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { GiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";
import { REPLICA_OF_LABEL, REPLICAS_FINALIZER } from "./replica-core.ts";

let tc: TestCluster;
const harnesses: Harness[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.stop()));
  await tc?.stop();
});

async function withNodes(prefix: string, nodes: string[]): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  for (const node of nodes) {
    await h.createDevice(node, { node, serial: `S-${h.ns}-${node}`, allocatable: 20 * GiB });
    await h.createClaim(`claim-${node}`, `S-${h.ns}-${node}`);
    await h.createNode(node);
  }
  await h.start();
  await eventually(
    async () => (await h.claims.list({ namespace: h.ns })).items.every((c) => c.status?.phase === "Bound"),
    10_000,
    "claims bound",
  );
  return h;
}

async function createVolume(
  h: Harness,
  name: string,
  replicas: number,
  failoverAfterSeconds?: number,
): Promise<NVMePartition> {
  return h.partitions.create({
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: { name, namespace: h.ns, labels: h.label },
    spec: {
      sizeBytes: 3 * GiB,
      backend: "spdk",
      volumeManager: "spdk-lvol",
      targetOptions: { transport: "tcp" },
      replicas,
      ...(failoverAfterSeconds ? { failoverAfterSeconds } : {}),
    },
  });
}

async function replicasOf(h: Harness, uid: string): Promise<NVMePartition[]> {
  const all = (await h.partitions.list({ namespace: h.ns })).items;
  return all
    .filter((p) => p.spec.replicaOf?.uid === uid)
    .sort((a, b) => (a.metadata.name < b.metadata.name ? -1 : 1));
}

test("three copies on three nodes, each in its drive's ledger; Online at generation 1 once exported", async () => {
  const h = await withNodes("repl", ["node-a", "node-b", "node-c"]);
  const vol = await createVolume(h, "vol", 3);
  const uid = vol.metadata.uid as string;
  const placed = await eventually(
    async () => {
      const rs = await replicasOf(h, uid);
      return rs.length === 3 && rs.every((r) => r.spec.nodeName) && rs;
    },
    20_000,
    "three placed replicas",
  );
  expect(placed.map((r) => r.metadata.name)).toEqual(["vol-r0", "vol-r1", "vol-r2"]);
  expect(new Set(placed.map((r) => r.spec.nodeName)).size).toBe(3);
  for (const r of placed) {
    expect(r.metadata.labels?.[REPLICA_OF_LABEL]).toBe(uid);
    expect((r.metadata as { ownerReferences?: unknown[] }).ownerReferences?.[0]).toMatchObject({
      kind: "NVMePartition",
      name: "vol",
      uid,
    });
    expect(r.spec).toMatchObject({
      sizeBytes: 3 * GiB + 1024 * 1024,
      volumeManager: "spdk-lvol",
      targetOptions: { transport: "tcp" },
    });
    const dev = await h.devices.get(h.dev(r.spec.nodeName as string));
    expect(dev?.status?.reservations?.map((e) => e.uid)).toEqual([r.metadata.uid as string]);
  }
  // The volume itself holds no drive and is no pending placement.
  const v1 = await h.partitions.get("vol", h.ns);
  expect(v1?.spec.nodeName).toBeUndefined();
  expect(v1?.metadata.finalizers).toContain(REPLICAS_FINALIZER);
  expect(v1?.status?.dataGeneration).toBeUndefined();

  // The agents export the copies (their status written as an agent would).
  for (const r of placed) {
    await updateStatus(h.partitions, r.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      state: "Exported" as const,
      conditions: latest.status?.conditions ?? [],
    }));
  }
  const online = await eventually(
    async () => {
      const v = await h.partitions.get("vol", h.ns);
      return v?.status?.dataGeneration === 1 && v.status.replicas?.every((e) => e.state === "Online") && v;
    },
    15_000,
    "copies online",
  );
  expect(online.status?.replicas?.map((e) => [e.name, e.nodeName, e.state, e.generation])).toEqual(
    placed.map((r) => [r.metadata.name, r.spec.nodeName, "Online", 1]),
  );
  expect(online.status?.conditions.find((c) => c.type === "ReplicasReady")).toMatchObject({
    status: "True",
    reason: "AllReplicasOnline",
  });
  // Served from the first copy's node, which is admitted to every copy under its own host NQN.
  const servedFrom = placed[0]?.spec.nodeName as string;
  await eventually(
    async () => (await h.partitions.get("vol", h.ns))?.spec.nodeName === servedFrom,
    10_000,
    "served",
  );
  const attachments = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  for (const r of placed) {
    const a = await eventually(
      async () => attachments.get(attachmentNameFor(r.metadata.name, r.metadata.uid as string), h.ns),
      10_000,
      `serving node admitted to ${r.metadata.name}`,
    );
    expect(a.spec).toMatchObject({
      partitionName: r.metadata.name,
      partitionUID: r.metadata.uid,
      hostNQN: nexusHostNqnFor(servedFrom),
      nodeId: `${servedFrom}/${nexusHostNqnFor(servedFrom)}`,
    });
  }

  await h.partitions.delete("vol", h.ns);
  await eventually(async () => (await h.partitions.get("vol", h.ns)) === undefined, 20_000, "volume gone");
  expect(await replicasOf(h, uid)).toEqual([]);
  for (const r of placed)
    expect(
      await attachments.get(attachmentNameFor(r.metadata.name, r.metadata.uid as string), h.ns),
    ).toBeUndefined();
  await eventually(
    async () => {
      for (const n of ["node-a", "node-b", "node-c"]) {
        const d = await h.devices.get(h.dev(n));
        if ((d?.status?.reservations ?? []).length > 0) return false;
      }
      return true;
    },
    20_000,
    "ledger released",
  );
}, 90_000);

test("more copies than storage nodes: the last one waits with ReplicaAntiAffinity", async () => {
  const h = await withNodes("repl2", ["node-a", "node-b"]);
  const vol = await createVolume(h, "vol", 3);
  const uid = vol.metadata.uid as string;
  const refused = await eventually(
    async () => {
      const rs = await replicasOf(h, uid);
      const waiting = rs.find((r) => !r.spec.nodeName);
      const c = waiting?.status?.conditions.find((x) => x.type === "Scheduled");
      return rs.length === 3 && rs.filter((r) => r.spec.nodeName).length === 2 && c?.status === "False" && c;
    },
    20_000,
    "third replica refused",
  );
  expect(refused.reason).toBe("ReplicaAntiAffinity");
  expect(refused.message).toContain("already hold another replica of this volume (node-a, node-b)");
  const v = await h.partitions.get("vol", h.ns);
  expect(v?.status?.conditions.find((c) => c.type === "ReplicasReady")).toMatchObject({
    status: "False",
    reason: "ReplicasPending",
    message: "2/3 replicas placed, 0/3 exported",
  });
}, 60_000);

/** What each copy's agent does with its admission record: enforce the lifetime it names. */
async function enforceAdmissions(
  h: Harness,
  attachments: ResourceClient<NVMeVolumeAttachment>,
): Promise<void> {
  for (const a of (await attachments.list({ namespace: h.ns })).items) {
    if (a.status?.observedAttachmentId === a.spec.attachmentId) continue;
    await updateStatus(attachments, a.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      observedAttachmentId: latest.spec.attachmentId,
      conditions: latest.status?.conditions ?? [],
    }));
  }
}

test("failover: the lost serving node is fenced from every live copy, the generation rises, then another node serves", async () => {
  const h = await withNodes("failover", ["node-a", "node-b", "node-c"]);
  const attachments = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vol = await createVolume(h, "vol", 3, 5);
  const uid = vol.metadata.uid as string;
  const copies = await eventually(
    async () => {
      const rs = await replicasOf(h, uid);
      return rs.length === 3 && rs.every((r) => r.spec.nodeName) && rs;
    },
    20_000,
    "three placed replicas",
  );
  for (const r of copies)
    await updateStatus(h.partitions, r.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      state: "Exported" as const,
      conditions: latest.status?.conditions ?? [],
    }));
  const first = await eventually(
    async () => {
      const v = await h.partitions.get("vol", h.ns);
      return v?.spec.nodeName !== undefined && v.status?.dataGeneration === 1 ? v : undefined;
    },
    15_000,
    "served",
  );
  const lost = first.spec.nodeName as string;
  await eventually(
    async () => (await attachments.list({ namespace: h.ns })).items.length === 3,
    10_000,
    "admitted",
  );
  await enforceAdmissions(h, attachments);
  const survivors = copies.filter((r) => r.spec.nodeName !== lost);
  const lostCopy = copies.find((r) => r.spec.nodeName === lost) as NVMePartition;

  // The serving node stops beating: its last heartbeat 40 s ago, past the volume's 5 s (and
  // within the manager's 60 s staleness, so only this volume's bound decides).
  await updateStatus(h.nodes, lost, h.ns, (latest) => ({
    ...(latest.status ?? { conditions: [] }),
    lastHeartbeatTime: new Date(Date.now() - 40_000).toISOString(),
    conditions: latest.status?.conditions ?? [],
  }));
  // Watch the volume while the failover runs (a watch delivers every stored version of one
  // object): it must never name a new serving node while the old generation still stands.
  const seen: { node?: string; gen?: number }[] = [];
  const caches = new CacheSet(tc.conn, { logger: silentLogger });
  const watched = caches.cache(kinds.NVMePartition, { namespace: h.ns });
  const note = (v: NVMePartition) => {
    if (v.metadata.name === "vol") seen.push({ node: v.spec.nodeName, gen: v.status?.dataGeneration });
  };
  watched.on({ add: note, update: (_o, v) => note(v) });
  await caches.start();
  // The surviving copies' admissions move to one survivor's host; nothing serves until enforced.
  const moved = await eventually(
    async () => {
      const items = (await attachments.list({ namespace: h.ns })).items;
      const hosts = survivors.map(
        (r) => items.find((a) => a.spec.partitionUID === r.metadata.uid)?.spec.hostNQN,
      );
      return hosts[0] !== nexusHostNqnFor(lost) && hosts[0] === hosts[1] && hosts[0];
    },
    15_000,
    "admissions moved",
  );
  const to = survivors
    .map((r) => r.spec.nodeName as string)
    .find((n) => nexusHostNqnFor(n) === moved) as string;
  expect(to).toBeDefined();
  await Bun.sleep(1500);
  expect((await h.partitions.get("vol", h.ns))?.spec.nodeName).toBe(lost);
  expect(
    (await h.partitions.get("vol", h.ns))?.status?.conditions.find((c) => c.type === "Serving"),
  ).toMatchObject({
    status: "False",
    reason: "Fencing",
  });
  // The lost node's own copy keeps its admission: nobody could enforce a change there.
  const lostAdmission = await attachments.get(
    attachmentNameFor(lostCopy.metadata.name, lostCopy.metadata.uid as string),
    h.ns,
  );
  expect(lostAdmission?.spec.hostNQN).toBe(nexusHostNqnFor(lost));

  await enforceAdmissions(h, attachments);
  const after = await eventually(
    async () => {
      const v = await h.partitions.get("vol", h.ns);
      return v?.spec.nodeName === to && v;
    },
    15_000,
    "failed over",
  );
  await eventually(async () => seen.some((o) => o.node === to), 10_000, "the watch saw the new node");
  await caches.stop();
  expect(after.status?.dataGeneration).toBe(2);
  expect(after.status?.replicas?.find((e) => e.name === lostCopy.metadata.name)).toMatchObject({
    state: "Stale",
    generation: 1,
  });
  for (const r of survivors)
    expect(after.status?.replicas?.find((e) => e.name === r.metadata.name)).toMatchObject({
      state: "Online",
      generation: 2,
    });
  expect(seen.some((o) => o.node === to && o.gen === 1)).toBe(false);
  expect(seen.some((o) => o.node === lost && o.gen === 2)).toBe(true);
  const events = await h.events("vol");
  for (const reason of ["Fencing", "GenerationRaised", "FailedOver"])
    expect(events.some((e) => e.includes(reason))).toBe(true);
  const steps = h.registry.render();
  for (const step of ["fence", "promote", "serve"])
    expect(steps).toMatch(new RegExp(`distort_failover_steps_total\\{step="${step}"\\} [1-9]`));
}, 90_000);
