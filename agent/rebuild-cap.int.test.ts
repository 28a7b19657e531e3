// The cluster-wide rebuild cap, end to end: two agents on emulated nvmf_tgt processes joined by
// loopback TCP, and the real manager (replica controller and rebuild grants) with
// DISTORT_REBUILDS_PER_CLUSTER=1, against the real kube-apiserver. Two replicated volumes are served
// from node A with a copy each on node B; B's target dies, both copies miss writes, B comes back
// and both need a rebuild. Only one runs at a time: the other waits, its status saying why
// (RebuildQueued: cluster rebuild cap 1 reached), also across a restart of the manager (the grant
// is in the API), until the first is done; then it runs and completes, and both slots are given
// back. Each rebuilt copy, read through its own export, holds exactly its volume's bytes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash, randomUUID } from "node:crypto";
import {
  kinds,
  type NVMePartition,
  type NVMeVolumeAttachment,
  type RebuildSlot,
  type ReplicaStatus,
} from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  placeOnReportedDrive,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { connectController, createTcpFabric, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { realClock } from "../lib/clock.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
import { parseConfig } from "../manager/config.ts";
import { type RunningManager, startManager } from "../manager/manager.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const A = "127.0.53.1";
const B = "127.0.53.2";
const PORT = 45000 + Math.floor(Math.random() * 4000);
const NODE_A = "rc-a";
const NODE_B = "rc-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;
/** 63 MiB at 8 MB/s takes about 8 s: long enough to see the other volume wait across a manager restart. */
const BANDWIDTH_MB_SEC = 8;
const SCOPE = "storage.distort.io/test-scope";
const VOLUMES = ["va", "vb"] as const;

let tc: TestCluster;
let ns: string;
const fabric = createTcpFabric();
const nodes: SimStorageNode[] = [];
const agents: RunningAgent[] = [];
let manager: RunningManager | undefined;
const registry = new Registry();

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("rebuildcap");
  for (const [nodeName, address, serial] of [
    [NODE_A, A, "SIMRCA01"],
    [NODE_B, B, "SIMRCB01"],
  ] as const) {
    const node = await startSimStorageNode({
      nodeName,
      drives: [{ serial, pciAddress: "0000:3d:00.0", sizeBytes: 4 * GiB }],
      fabric,
      hostAddresses: [address],
    });
    nodes.push(node);
    const cfg = parseAgentConfig(
      node.agentEnv(tc.kubeconfigPath, ns, {
        DISTORT_PORTAL_ADDRESS: address,
        DISTORT_PORTAL_PORT: String(PORT),
        DISTORT_NEXUS_DEGRADE_AFTER_MS: "2000",
        DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: String(BANDWIDTH_MB_SEC),
        // As deployed: a rebuild waits for the manager's grant (the harness turns it off).
        DISTORT_REBUILD_NEEDS_GRANT: "true",
      }),
    );
    const logger = createLogger({
      level: (process.env.DISTORT_TEST_LOG as "info") ?? "error",
      fields: { node: nodeName },
    });
    agents.push(await runAgent(cfg, logger));
  }
  // The manager sees only this test's objects: the storage nodes the agents publish get its label.
  const storageNodes = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  for (const n of [NODE_A, NODE_B]) {
    await eventually(async () => (await storageNodes.get(n, ns)) ?? undefined, 30_000, `${n} reported`);
    await storageNodes.mergePatch(n, ns, { metadata: { labels: { [SCOPE]: ns } } });
  }
}, 300_000);

afterAll(async () => {
  await manager?.stop();
  for (const a of agents) await a.stop();
  for (const n of nodes) await n.close();
  await tc?.stop();
});

/**
 * The manager, watching only this test's objects, with a cluster cap of 1. Started once the copies
 * exist, so its replica controller adopts them instead of making its own.
 */
async function startTestManager(): Promise<void> {
  const config = parseConfig(
    {
      DISTORT_KUBECONFIG: tc.kubeconfigPath,
      DISTORT_NAMESPACE: ns,
      DISTORT_LABEL_SELECTOR: `${SCOPE}=${ns}`,
      DISTORT_LEADER_ELECT: "false",
      DISTORT_HEARTBEAT_STALENESS_MS: "60000",
      DISTORT_RESYNC_MS: "0",
      DISTORT_HEALTH_PORT: "0",
      DISTORT_REBUILDS_PER_CLUSTER: "1",
    },
    { hostname: "test", randomSuffix: ns },
  );
  manager = await startManager({
    conn: tc.conn,
    config,
    clock: realClock,
    logger: process.env.DISTORT_TEST_LOG ? createLogger({ level: "info" }) : silentLogger,
    registry,
    events: new EventRecorder(tc.conn, {
      controller: "storage.distort.io/manager",
      instance: config.identity,
      logger: silentLogger,
    }),
  });
}

function sha(b: Buffer): string {
  return createHash("sha256").update(b).digest("hex");
}

/** Reads `len` bytes from `at` in 1 MiB requests. */
async function readAll(c: FabricController, at: number, len: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  for (let o = 0; o < len; o += MiB) parts.push(await c.read(1, at + o, Math.min(MiB, len - o)));
  return Buffer.concat(parts);
}

/** One sample of both volumes: each one's B copy and slot. */
interface Sample {
  at: number;
  copy: Record<string, ReplicaStatus | undefined>;
  slot: Record<string, RebuildSlot | undefined>;
}

test("with a cluster cap of 1, the second rebuild waits (RebuildQueued) until the first is done, then runs; both copies end with their volume's bytes", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const nodeB = nodes[1] as SimStorageNode;
  const label = { [SCOPE]: ns };

  const uids = new Map<string, string>();
  for (const name of VOLUMES) {
    const v = await parts.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMePartition",
      metadata: { name, namespace: ns, labels: label },
      spec: {
        sizeBytes: 64 * MiB,
        replicas: 2,
        backend: "spdk",
        volumeManager: "partition",
        targetOptions: { transport: "tcp" },
      },
    } as NVMePartition);
    uids.set(name, v.metadata.uid as string);
  }
  // The copies, placed by hand as in agent/rebuild.int.test.ts (r0 on A, r1 on B); then the
  // manager starts, and its replica controller makes them current, serves each volume from A (its
  // first copy's node) and admits A to both copies.
  for (const [serial, suffix] of [
    ["SIMRCA01", "r0"],
    ["SIMRCB01", "r1"],
  ] as const) {
    await placeOnReportedDrive(
      tc.conn,
      ns,
      serial,
      VOLUMES.map((v) => `${v}-${suffix}`),
      64 * MiB,
      (p) => {
        const vol = p.metadata.name.split("-")[0] as string;
        p.metadata.labels = { ...(p.metadata.labels ?? {}), ...label };
        p.spec.replicaOf = { name: vol, uid: uids.get(vol) as string };
      },
    );
  }
  await startTestManager();
  const served = new Map<string, NVMePartition>();
  for (const name of VOLUMES) {
    served.set(
      name,
      await eventually(
        async () => {
          const p = await parts.get(name, ns);
          return p?.spec.nodeName === NODE_A && p.status?.state === "Exported" ? p : undefined;
        },
        60_000,
        `${name} served from ${NODE_A} and Exported`,
      ),
    );
  }
  const volBytes = served.get("va")?.status?.allocatedBytes as number;
  expect(volBytes).toBe(63 * MiB);

  // A consumer of each volume, admitted on A's export.
  const consumers = new Map<string, FabricController>();
  for (const name of VOLUMES) {
    const uid = uids.get(name) as string;
    const vaName = attachmentNameFor(name, uid);
    await vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name: vaName, namespace: ns },
      spec: {
        partitionName: name,
        partitionUID: uid,
        nodeId: `consumer-1/${CONSUMER}`,
        hostNQN: CONSUMER,
        attachmentId: `att-${name}`,
      },
    } as NVMeVolumeAttachment);
    await eventually(
      async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === `att-${name}`,
      20_000,
      `consumer of ${name} AccessReady`,
    );
    consumers.set(
      name,
      await connectController(fabric, {
        trtype: "TCP",
        traddr: A,
        trsvcid: String(PORT),
        subnqn: nqnFor(externalIdFor(uid)),
        hostnqn: CONSUMER,
        hostid: CONSUMER_ID,
      }),
    );
  }
  const consumer = (name: string) => consumers.get(name) as FabricController;

  // 1. A pattern on each volume, in both its copies.
  for (const [i, name] of VOLUMES.entries()) {
    const b = Buffer.alloc(2 * MiB);
    for (let j = 0; j < b.length; j++) b[j] = (j * (7 + i) + 13) % 251;
    await consumer(name).write(1, 4 * MiB, b);
    await consumer(name).flush(1);
  }

  // 2. B's target dies: both B copies miss the next writes (each volume goes on at generation 2).
  await nodeB.emulator.crash();
  for (const [i, name] of VOLUMES.entries()) {
    await Promise.race([
      consumer(name).write(1, 20 * MiB, Buffer.alloc(3 * MiB, 0x50 + i)),
      Bun.sleep(30_000).then(() => Promise.reject(new Error(`write to ${name} never completed`))),
    ]);
    await consumer(name).flush(1);
  }
  for (const name of VOLUMES) {
    const v = await parts.get(name, ns);
    expect(v?.status?.dataGeneration).toBe(2);
    expect(v?.status?.replicas?.find((e) => e.name === `${name}-r1`)).toMatchObject({
      state: "Faulted",
      generation: 1,
    });
  }

  // 3. B comes back: both copies need a rebuild; the cap lets one run at a time.
  await nodeB.emulator.restart();
  const samples: Sample[] = [];
  const sample = async (): Promise<Sample> => {
    const s: Sample = { at: Date.now(), copy: {}, slot: {} };
    for (const name of VOLUMES) {
      const v = await parts.get(name, ns);
      s.copy[name] = v?.status?.replicas?.find((e) => e.name === `${name}-r1`);
      s.slot[name] = v?.status?.rebuildSlot;
    }
    samples.push(s);
    return s;
  };
  const rebuilding = (s: Sample) => VOLUMES.filter((n) => s.copy[n]?.state === "Rebuilding");
  const online = (s: Sample) => VOLUMES.filter((n) => s.copy[n]?.state === "Online");
  // The moment one rebuilds with progress while the other is queued, saying why.
  const waiting = await eventually(
    async () => {
      const s = await sample();
      const [running] = rebuilding(s);
      if (!running || (s.copy[running]?.rebuild?.bytesDone ?? 0) === 0) return undefined;
      const other = VOLUMES.find((n) => n !== running) as string;
      // The manager's reason, copied by the serving node (before it arrives: "waits for the grant").
      return s.copy[other]?.message === "RebuildQueued: cluster rebuild cap 1 reached"
        ? { s, running, other }
        : undefined;
    },
    90_000,
    "one copy Rebuilding with progress while the other is queued",
  );
  const { running: first, other: second } = waiting;
  expect(waiting.s.copy[second]).toMatchObject({
    generation: 1,
    message: "RebuildQueued: cluster rebuild cap 1 reached",
  });
  // Behind, not rebuilding: Faulted as its serving node left it (Stale after a failed attempt).
  expect(["Faulted", "Stale"]).toContain(waiting.s.copy[second]?.state as string);
  // The grant and the queue, as the API holds them.
  expect(waiting.s.slot[first]).toMatchObject({ replica: `${first}-r1`, node: NODE_A });
  expect(waiting.s.slot[first]?.grantedAt).toBeDefined();
  expect(waiting.s.slot[second]).toMatchObject({
    replica: `${second}-r1`,
    node: NODE_A,
    message: "cluster rebuild cap 1 reached",
  });
  expect(waiting.s.slot[second]?.grantedAt).toBeUndefined();
  const metrics = registry.render();
  expect(metrics).toMatch(/distort_rebuild_slots\{state="granted"\} 1/);
  expect(metrics).toMatch(/distort_rebuild_slots\{state="queued"\} 1/);

  // The grant lives in the API: a manager started afresh (a restart, a new leader) finds the slot
  // held and keeps the other request queued while the first rebuild runs.
  await manager?.stop();
  manager = undefined;
  await startTestManager();
  const restartedAt = Date.now();
  let heldAcross = 0;
  while (Date.now() - restartedAt < 2000) {
    const s = await sample();
    if (s.copy[first]?.state !== "Rebuilding") break;
    heldAcross++;
    expect(s.slot[first]?.grantedAt).toBe(waiting.s.slot[first]?.grantedAt as string);
    expect(s.slot[second]?.grantedAt).toBeUndefined();
    expect(s.copy[second]?.state).not.toBe("Rebuilding");
    await Bun.sleep(100);
  }
  // Seen under the new manager while the first rebuild still ran (the check above was not empty).
  expect(heldAcross).toBeGreaterThan(0);

  // A write to each volume while the first rebuild runs (the rebuilt copies must hold it).
  const during = new Map<string, Buffer>();
  for (const [i, name] of VOLUMES.entries()) {
    const b = Buffer.alloc(1 * MiB, 0xc0 + i);
    during.set(name, b);
    await consumer(name).write(1, 40 * MiB, b);
    await consumer(name).flush(1);
  }

  // Then both finish, one after the other: never two Rebuilding at once.
  await eventually(
    async () => {
      const s = await sample();
      return online(s).length === 2 ? s : undefined;
    },
    120_000,
    "both copies Online after their rebuilds",
  );
  for (const s of samples) expect(rebuilding(s).length).toBeLessThanOrEqual(1);
  const firstDone = samples.findIndex((s) => s.copy[first]?.state === "Online");
  const secondStarted = samples.findIndex((s) => s.copy[second]?.state === "Rebuilding");
  expect(firstDone).toBeGreaterThan(-1);
  // The second was seen Rebuilding, and only after the first was Online.
  expect(secondStarted).toBeGreaterThan(firstDone);
  // Every slot given back once both are done.
  await eventually(
    async () => {
      const s = await sample();
      return VOLUMES.every((n) => s.slot[n] === undefined) ? s : undefined;
    },
    20_000,
    "both rebuild slots released",
  );
  // At least one grant per rebuild (a granted copy its serving node could not reach yet, while B's
  // target came back, gave its slot back and asked again).
  const grants = Number(/^distort_rebuild_grants_total (\d+)$/m.exec(registry.render())?.[1] ?? 0);
  expect(grants).toBeGreaterThanOrEqual(2);

  // 4. Proof by I/O: each B copy, read through its own export past the raid's superblock area,
  // holds exactly what its volume serves, which holds every acknowledged write.
  const nexusHost = nexusHostNqnFor(NODE_A);
  for (const [i, name] of VOLUMES.entries()) {
    const v = await parts.get(name, ns);
    const entry = v?.status?.replicas?.find((e) => e.name === `${name}-r1`);
    expect(entry).toMatchObject({ state: "Online", generation: v?.status?.dataGeneration as number });
    const volumeData = await readAll(consumer(name), 0, volBytes);
    expect(volumeData.subarray(20 * MiB, 23 * MiB).equals(Buffer.alloc(3 * MiB, 0x50 + i))).toBe(true);
    expect(volumeData.subarray(40 * MiB, 41 * MiB).equals(during.get(name) as Buffer)).toBe(true);
    const copyPart = await parts.get(`${name}-r1`, ns);
    const reader = await connectController(fabric, {
      trtype: "TCP",
      traddr: B,
      trsvcid: String(PORT),
      subnqn: copyPart?.status?.nqn as string,
      hostnqn: nexusHost,
      hostid: randomUUID(),
    });
    try {
      expect(sha(await readAll(reader, 1 * MiB, volBytes))).toBe(sha(volumeData));
    } finally {
      reader.close();
    }
  }
  for (const c of consumers.values()) c.close();
}, 300_000);
