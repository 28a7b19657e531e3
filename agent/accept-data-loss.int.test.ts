// Accepting data loss by I/O: two agents and two emulated targets on loopback TCP serve a
// two-copy volume from node A; node B's copy is dropped (Faulted, generation 2) while its target
// is down, a second write reaches A's copy alone, then node A dies with the only current copy.
// Nothing serves through B until the manager's accept-data-loss steps (the real decision and
// shell, with the fencing the failover does) promote B's stale copy; then B serves, and the bytes
// read through it are that copy's: the first write is there, the second, which it missed, is not.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import {
  ACCEPT_DATA_LOSS_ANNOTATION,
  kinds,
  type NVMePartition,
  type NVMeVolumeAttachment,
} from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { serveReplicatedVolume } from "../lab/harness/replicated-lab.ts";
import { type SimStorageNode, startSimStorageNode } from "../lab/harness/storage-node.ts";
import { connectController, createTcpFabric } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
import { Inventory } from "../manager/inventory.ts";
import { carryOutDataLoss, dataLossStep } from "../manager/replicas/accept-data-loss.ts";
import { harness } from "../manager/testdata/harness.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const MiB = 1024 ** 2;
const A = "127.0.52.1";
const B = "127.0.52.2";
const PORT = 45000 + Math.floor(Math.random() * 4000);
const NODE_A = "dl-a";
const NODE_B = "dl-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;

let tc: TestCluster;
let ns: string;
const fabric = createTcpFabric();
const nodes: SimStorageNode[] = [];
const agents: (RunningAgent | undefined)[] = [];

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("dataloss-io");
  for (const [nodeName, address, serial] of [
    [NODE_A, A, "SIMDLA01"],
    [NODE_B, B, "SIMDLB01"],
  ] as const) {
    const node = await startSimStorageNode({
      nodeName,
      drives: [{ serial, pciAddress: "0000:3c:00.0", sizeBytes: 1024 * MiB }],
      fabric,
      hostAddresses: [address],
    });
    nodes.push(node);
    const cfg = parseAgentConfig(
      node.agentEnv(tc.kubeconfigPath, ns, {
        DISTORT_PORTAL_ADDRESS: address,
        DISTORT_PORTAL_PORT: String(PORT),
        DISTORT_NEXUS_DEGRADE_AFTER_MS: "2000",
        // The dropped copy stays behind: no rebuild brings it back.
        DISTORT_REBUILDS_PER_NODE: "0",
      }),
    );
    agents.push(
      await runAgent(
        cfg,
        createLogger({
          level: (process.env.DISTORT_TEST_LOG as "info") ?? "error",
          fields: { node: nodeName },
        }),
      ),
    );
  }
}, 300_000);

afterAll(async () => {
  for (const a of agents) await a?.stop();
  for (const n of nodes) await n.close();
  await tc?.stop();
});

function admission(c: NVMePartition, node: string): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: attachmentNameFor(c.metadata.name, c.metadata.uid as string), namespace: ns },
    spec: {
      partitionName: c.metadata.name,
      partitionUID: c.metadata.uid as string,
      nodeId: `${node}/${nexusHostNqnFor(node)}`,
      hostNQN: nexusHostNqnFor(node),
      attachmentId: `nexus-${c.metadata.name}-${node}-${randomUUID()}`,
    },
  } as NVMeVolumeAttachment;
}

test("the stale copy is served only once accepted, and what it serves is its own data", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const [nodeA, nodeB] = nodes as [SimStorageNode, SimStorageNode];
  // The volume, its two copies placed and exported, served by A at generation 1 (the manager's
  // part played here, as agent/nexus.int.test.ts does), and the consumer admitted.
  const { uid: volUid, copies } = await serveReplicatedVolume(
    { tc, ns },
    {
      name: "dl",
      sizeBytes: 32 * MiB,
      copies: [
        ["SIMDLA01", "dl-r0"],
        ["SIMDLB01", "dl-r1"],
      ],
      servingNode: NODE_A,
      consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
    },
  );
  const nqn = nqnFor(externalIdFor(volUid));
  const connect = (traddr: string) =>
    connectController(fabric, {
      trtype: "TCP",
      traddr,
      trsvcid: String(PORT),
      subnqn: nqn,
      hostnqn: CONSUMER,
      hostid: CONSUMER_ID,
      kato: 2000,
    });

  const first = Buffer.alloc(256 * 1024);
  for (let i = 0; i < first.length; i++) first[i] = (i * 11 + 3) % 251;
  const second = Buffer.alloc(256 * 1024, 0x7e);
  const pathA = await connect(A);
  try {
    await pathA.write(1, 2 * MiB, first);
    await pathA.flush(1);
    // B's target goes down: past 2 s A records dl-r1 Faulted at generation 2 and drops it.
    await nodeB.emulator.crash();
    await eventually(
      async () => ((await parts.get("dl", ns))?.status?.dataGeneration === 2 ? true : undefined),
      30_000,
      "dl-r1 dropped at generation 2",
    );
    await nodeB.emulator.restart();
    // This write reaches dl-r0 only.
    await pathA.write(1, 6 * MiB, second);
    await pathA.flush(1);
  } finally {
    pathA.close();
  }
  const dropped = await parts.get("dl", ns);
  expect(dropped?.status?.replicas?.find((r) => r.name === "dl-r1")).toMatchObject({
    state: "Faulted",
    generation: 1,
  });
  // B's copy is exported again after its target's restart.
  await eventually(
    async () => nodeB.emulator.state().subsystems.some((s) => s.nqn === copies[1]?.status?.nqn),
    30_000,
    "dl-r1 exported again",
  );

  // Node A dies with the only current copy: its agent and its target.
  await agents[0]?.stop();
  agents[0] = undefined;
  await nodeA.emulator.crash();

  // The manager's view, and its accept-data-loss steps over the real API server.
  const h = await harness(tc, "dataloss-ctx");
  const view = async () => {
    const inv = new Inventory();
    for (const n of (await new ResourceClient(tc.conn, kinds.RDMAStorageNode).list({ namespace: ns })).items)
      inv.setNode(n);
    for (const p of (await parts.list({ namespace: ns })).items) inv.setPartition(p);
    const base = h.context(inv);
    return { ...base, clients: { ...base.clients, attachments: vas } };
  };
  const volume = async () => (await parts.get("dl", ns)) as NVMePartition;
  // Without the annotation there is no step at all, and B serves nothing: no subsystem yet, or a
  // standby with no namespace and an inaccessible path.
  const servesThroughB = async () => {
    try {
      const c = await connect(B);
      const serves = c.anaState === "optimized" || c.namespaces.length > 0;
      c.close();
      return serves;
    } catch {
      return false;
    }
  };
  expect(await dataLossStep(await view(), await volume())).toBeUndefined();
  await Bun.sleep(1500);
  expect(await servesThroughB()).toBe(false);
  expect((await volume()).spec.nodeName).toBe(NODE_A);
  await parts.mergePatch("dl", ns, {
    metadata: { annotations: { [ACCEPT_DATA_LOSS_ANNOTATION]: "newest" } },
  });
  let accepted = false;
  for (let i = 0; i < 40 && !accepted; i++) {
    const ctx = await view();
    const v = await volume();
    const step = await dataLossStep(ctx, v);
    if (!step) throw new Error("no data-loss step with the annotation set");
    if (step.kind === "invalid") throw new Error(step.message);
    if (step.kind === "fence") {
      // The failover's fencing step: each live copy's admission moves to the new node's host.
      for (const m of step.moves) {
        const c = copies.find((x) => x.metadata.name === m.copy) as NVMePartition;
        const a = await vas.get(m.attachment, ns);
        if (a) await vas.replace({ ...a, spec: admission(c, step.to).spec });
        else await vas.create(admission(c, step.to));
      }
    } else if (step.kind === "accept") {
      expect(step.copy).toBe("dl-r1");
      await carryOutDataLoss(ctx, v, step, silentLogger);
      accepted = true;
    }
    await Bun.sleep(500);
  }
  expect(accepted).toBe(true);
  const promoted = await volume();
  expect(promoted.metadata.annotations?.[ACCEPT_DATA_LOSS_ANNOTATION]).toBeUndefined();
  expect(promoted.status?.dataGeneration).toBe(3);
  expect(promoted.status?.replicas?.find((r) => r.name === "dl-r1")).toMatchObject({
    state: "Online",
    generation: 3,
  });
  // The failover's serve step: B serves from its copy alone.
  await parts.mergePatch("dl", ns, { metadata: { uid: volUid }, spec: { nodeName: NODE_B } });
  const pathB = await eventually(
    async () => {
      try {
        return await connect(B);
      } catch {
        return undefined;
      }
    },
    30_000,
    "B exports the volume",
  );
  try {
    await eventually(
      async () => pathB.anaState === "optimized" && pathB.namespaces.length === 1,
      60_000,
      "B serving",
    );
    // The stale copy's own data: the first write it held, and zeros where the second, which it
    // missed, went to A's copy alone.
    expect((await pathB.read(1, 2 * MiB, first.length)).equals(first)).toBe(true);
    expect((await pathB.read(1, 6 * MiB, second.length)).equals(Buffer.alloc(second.length))).toBe(true);
  } finally {
    pathB.close();
  }
}, 240_000);
