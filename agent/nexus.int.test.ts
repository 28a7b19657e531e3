// A replicated volume end to end through two agents, against the real kube-apiserver and two
// emulated nvmf_tgt processes joined by loopback TCP: each node exports one copy (an ordinary
// partition with spec.replicaOf), the serving node attaches both over NVMe-oF as its nexus host,
// mirrors them with a raid1 and exports that under the volume's NQN. A test initiator writes
// through the volume's export; both copies, each read through its own export, hold the bytes.
// Deleting the volume takes the export, the raid and the controllers away again.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { eventually, type TestCluster } from "../lab/cluster/test-support.ts";
import {
  declareCopiesCurrent,
  type ReplicatedLab,
  serveReplicatedVolume,
  startReplicatedLab,
} from "../lab/harness/replicated-lab.ts";
import { placeOnReportedDrive, type SimStorageNode } from "../lab/harness/storage-node.ts";
import type { SimFabric } from "../lab/sim/spdk/emulator.ts";
import { connectController, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor, cntlidRangeFor, nexusBdevFor, nexusHostNqnFor } from "../lib/volume-identity.ts";
import type { RunningAgent } from "./main.ts";
import { nexusControllerNameFor, nexusRaidUuidFor } from "./nexus/identity.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const A = "127.0.51.1";
const B = "127.0.51.2";
// A port of its own, so that no other test's listener on loopback is in the way.
const PORT = 41000 + Math.floor(Math.random() * 4000);
const NODE_A = "nx-a";
const NODE_B = "nx-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;

let lab: ReplicatedLab | undefined;
let tc: TestCluster;
let ns: string;
let fabric: SimFabric;
let nodes: SimStorageNode[];
let agents: RunningAgent[];
const clients: SpdkClient[] = [];
/**
 * Steps of the volume's passes on node A after which the pass is cut off once (an error thrown
 * from the step hook), so that the next pass has to carry on from what the cut one left.
 */
const INTERRUPT = new Set(["nexus-raid", "export", "unexport", "nexus-teardown"]);
const interrupted = new Set<string>();
/** Node A's degrade step waits on this while set (the test holds the API write back). */
let degradeGate: Promise<void> | undefined;
let degradeReached = false;

/** Drives SIMNX<node>01..03: the first for the first test's copies, one more for each other test's. */
const drivesOf = (node: "A" | "B") => [
  { serial: `SIMNX${node}01`, pciAddress: "0000:3c:00.0", sizeBytes: 4 * GiB },
  { serial: `SIMNX${node}02`, pciAddress: "0000:3d:00.0", sizeBytes: 1 * GiB },
  { serial: `SIMNX${node}03`, pciAddress: "0000:3e:00.0", sizeBytes: 1 * GiB },
];

beforeAll(async () => {
  lab = await startReplicatedLab({
    namespacePrefix: "nexus",
    nodes: [
      { name: NODE_A, address: A, drives: drivesOf("A") },
      { name: NODE_B, address: B, drives: drivesOf("B") },
    ],
    port: PORT,
    agentEnv: {
      DISTORT_NEXUS_DEGRADE_AFTER_MS: "2000",
      // The copy that comes back stays out (rebuilds are agent/rebuild.int.test.ts's).
      DISTORT_REBUILDS_PER_NODE: "0",
    },
    hooks: (nodeName) => ({
      async afterStep(step: string, key: string) {
        if (nodeName === NODE_A && step === "nexus-degrade") {
          degradeReached = true;
          await degradeGate;
          return;
        }
        if (nodeName !== NODE_A || !key.endsWith("/vol") || !INTERRUPT.has(step) || interrupted.has(step))
          return;
        interrupted.add(step);
        throw new Error(`injected interruption after ${step}`);
      },
    }),
  });
  ({ tc, ns, fabric, nodes, agents } = lab);
}, 300_000);

afterAll(async () => {
  for (const c of clients) await c.close();
  await lab?.close();
});

function methodsOf(node: SimStorageNode): SpdkMethods {
  const c = new SpdkClient({ socketPath: node.spdkSocket, logger: createLogger({ level: "error" }) });
  clients.push(c);
  return new SpdkMethods(c);
}

test("a volume with two copies on two nodes is served by a raid1 over both, reached over the fabric; deleting it takes the nexus away", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const [nodeA] = nodes as [SimStorageNode];
  const spdkA = methodsOf(nodeA);

  // The volume, as CSI creates it; then its two copies, as the manager places them.
  const vol = await parts.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: "vol", namespace: ns },
    spec: {
      sizeBytes: 64 * MiB,
      replicas: 2,
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "tcp" },
    },
  } as NVMePartition);
  const volUid = vol.metadata.uid as string;
  const replicaOf = (p: NVMePartition) => {
    p.spec.replicaOf = { name: "vol", uid: volUid };
  };
  const devices: NVMeDevice[] = [];
  for (const [serial, name] of [
    ["SIMNXA01", "vol-r0"],
    ["SIMNXB01", "vol-r1"],
  ] as const) {
    devices.push(await placeOnReportedDrive(tc.conn, ns, serial, [name], 64 * MiB, replicaOf));
  }
  const copies = await eventually(
    async () => {
      const l = await Promise.all(["vol-r0", "vol-r1"].map((n) => parts.get(n, ns)));
      return l.every((p) => p?.status?.state === "Exported") ? (l as NVMePartition[]) : undefined;
    },
    30_000,
    "both copies Exported",
  );
  expect(copies.map((c) => c.status?.portalIP)).toEqual([A, B]);

  // The manager's part: one attachment per copy admitting the serving node's nexus host, the
  // copies declared current at generation 1, and the serving node chosen.
  const nexusHost = nexusHostNqnFor(NODE_A);
  for (const c of copies) {
    await vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name: attachmentNameFor(c.metadata.name, c.metadata.uid as string), namespace: ns },
      spec: {
        partitionName: c.metadata.name,
        partitionUID: c.metadata.uid as string,
        nodeId: `${NODE_A}/${nexusHost}`,
        hostNQN: nexusHost,
        attachmentId: `nexus-${c.metadata.name}`,
      },
    } as NVMeVolumeAttachment);
  }
  // Served by node A from now on, but nothing is until the manager declares the copies current.
  await parts.mergePatch("vol", ns, { metadata: { uid: volUid }, spec: { nodeName: NODE_A } });
  const pending = await eventually(
    async () => {
      const p = await parts.get("vol", ns);
      const r = p?.status?.conditions?.find((c) => c.type === "Ready");
      return r?.reason === "ReplicasPending" ? p : undefined;
    },
    20_000,
    "Ready=False ReplicasPending",
  );
  expect(pending.metadata.finalizers).toContain("storage.distort.io/partition-cleanup");
  expect(nodeA.emulator.state().nvmeControllers.filter((c) => c.name.startsWith("nxr_"))).toEqual([]);
  await declareCopiesCurrent(lab as ReplicatedLab, "vol", copies, devices);

  const externalId = externalIdFor(volUid);
  const nqn = nqnFor(externalId);
  const raidBdev = nexusBdevFor(externalId);
  const served = await eventually(
    async () => {
      const p = await parts.get("vol", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "volume Exported",
  );
  // Exactly what a drive's partition reports, so CSI serves it unchanged.
  expect(served.status).toMatchObject({
    nqn,
    externalId,
    backendPath: raidBdev,
    portalIP: A,
    portalPort: PORT,
    transport: "tcp",
    portals: [{ address: A, port: PORT }],
  });
  expect(served.metadata.finalizers).toContain("storage.distort.io/partition-cleanup");
  const ready = served.status?.conditions?.find((c) => c.type === "Ready");
  expect(ready).toMatchObject({ status: "True", reason: "Exported" });
  expect(ready?.message).toContain("raid1 over vol-r0, vol-r1");

  // Node A's target: a raid1 with a superblock over two NVMe-oF controllers, one per copy, both
  // attached as the nexus host, the local copy through the fabric like the remote one.
  // Passes cut off after the raid was built and after the export: the next ones went on from there.
  expect([...interrupted].sort()).toEqual(["export", "nexus-raid"]);
  const [raid] = (await spdkA.bdevRaidGetBdevs("all")).filter((r) => r.name === raidBdev);
  // Two copies and one spare slot (empty), which a drain's replacement copy joins.
  expect(raid).toMatchObject({
    state: "online",
    raid_level: "raid1",
    superblock: true,
    num_base_bdevs: 3,
    num_base_bdevs_discovered: 2,
  });
  expect(raid?.uuid).toBe(nexusRaidUuidFor(volUid));
  const ctrlNames = copies.map((c) => nexusControllerNameFor(c.metadata.uid as string));
  expect(
    raid?.base_bdevs_list
      .filter((b) => b.is_configured)
      .map((b) => b.name)
      .sort(),
  ).toEqual(ctrlNames.map((n) => `${n}n1`).sort());
  const ctrls = await spdkA.bdevNvmeGetControllers();
  for (const [i, name] of ctrlNames.entries()) {
    const c = ctrls.find((x) => x.name === name);
    expect(c?.ctrlrs[0]?.trid).toMatchObject({
      trtype: "TCP",
      traddr: copies[i]?.status?.portalIP,
      trsvcid: String(PORT),
      subnqn: copies[i]?.status?.nqn,
    });
    expect(c?.ctrlrs[0]?.host?.nqn).toBe(nexusHost);
  }
  // The copies' own subsystems admit the nexus host and nobody else.
  for (const [i, node] of nodes.entries()) {
    const sub = node.emulator.state().subsystems.find((s) => s.nqn === copies[i]?.status?.nqn);
    expect(sub?.hosts).toEqual([nexusHost]);
    expect(sub?.controllers.map((c) => c.hostnqn)).toEqual([nexusHost]);
  }
  const raidInfo = nodeA.emulator.state().bdevs.find((b) => b.name === raidBdev);
  const blockSize = raidInfo?.blockSize ?? 0;
  // The copies are 64 MiB; raid1's superblock keeps the first MiB of each, so the volume holds 63.
  expect(served.status?.allocatedBytes).toBe((raidInfo?.numBlocks ?? 0) * blockSize);
  expect(served.status?.allocatedBytes).toBe(63 * MiB);

  // A consumer admitted through the volume's own attachment, as ControllerPublish makes it.
  const vaName = attachmentNameFor("vol", volUid);
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "vol",
      partitionUID: volUid,
      nodeId: `consumer-1/${CONSUMER}`,
      hostNQN: CONSUMER,
      attachmentId: "att-1",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
    20_000,
    "consumer AccessReady",
  );

  // Write a known pattern through the volume's export.
  const pattern = Buffer.alloc(1 * MiB);
  for (let i = 0; i < pattern.length; i++) pattern[i] = (i * 7 + 13) % 251;
  const at = 4 * MiB;
  const consumer: FabricController = await connectController(fabric, {
    trtype: "TCP",
    traddr: A,
    trsvcid: String(PORT),
    subnqn: nqn,
    hostnqn: CONSUMER,
    hostid: CONSUMER_ID,
  });
  try {
    await consumer.write(1, at, pattern);
    await consumer.flush(1);
    expect((await consumer.read(1, at, pattern.length)).equals(pattern)).toBe(true);
  } finally {
    consumer.close();
  }

  // Each copy, read through its own export as the host it admits: the bytes are in both, past
  // the raid's superblock area (data_offset blocks).
  for (const [i, c] of copies.entries()) {
    const slot = raid?.base_bdevs_list.find((b) => b.name === `${ctrlNames[i]}n1`);
    const offset = (slot?.data_offset ?? -1) * blockSize;
    expect(offset).toBe(1 * MiB);
    const reader = await connectController(fabric, {
      trtype: "TCP",
      traddr: c.status?.portalIP as string,
      trsvcid: String(PORT),
      subnqn: c.status?.nqn as string,
      hostnqn: nexusHost,
      hostid: randomUUID(),
    });
    try {
      const got = await reader.read(1, offset + at, pattern.length);
      expect(got.equals(pattern)).toBe(true);
    } finally {
      reader.close();
    }
  }

  // Node A's target is killed (its own copy's export, the controllers and the raid all gone)
  // and comes back empty: the agent's next passes export the copy again, reach both copies
  // again, keep the raid examine re-assembles from their superblocks, and serve the same bytes.
  await nodeA.emulator.crash();
  await nodeA.emulator.restart();
  await eventually(
    async () => {
      const st = nodeA.emulator.state();
      return (
        st.bdevs.some((b) => b.name === raidBdev) &&
        st.subsystems.some((s) => s.nqn === nqn && s.hosts.includes(CONSUMER))
      );
    },
    60_000,
    "volume served again after the target restart",
  );
  const [back] = (await spdkA.bdevRaidGetBdevs("all")).filter((r) => r.name === raidBdev);
  expect(back).toMatchObject({ state: "online", num_base_bdevs: 3, num_base_bdevs_discovered: 2 });
  expect(back?.uuid).toBe(nexusRaidUuidFor(volUid));
  const again = await connectController(fabric, {
    trtype: "TCP",
    traddr: A,
    trsvcid: String(PORT),
    subnqn: nqn,
    hostnqn: CONSUMER,
    hostid: CONSUMER_ID,
  });
  try {
    expect((await again.read(1, at, pattern.length)).equals(pattern)).toBe(true);
  } finally {
    again.close();
  }

  // Node B's target dies while the consumer writes. Its copy's controller reconnects and holds
  // the raid's write, so the consumer gets no acknowledgement; past the bound (2 s here) node A's
  // agent first records vol-r1 Faulted at data generation 2 (held back by the test for a while:
  // the write stays unacknowledged all that time), and only then drops it, so the write completes
  // on vol-r0 alone. A copy the API still holds current never misses an acknowledged write.
  const nodeB = nodes[1] as SimStorageNode;
  let release = () => {};
  degradeGate = new Promise<void>((r) => {
    release = r;
  });
  await nodeB.emulator.crash();
  const writer = await connectController(fabric, {
    trtype: "TCP",
    traddr: A,
    trsvcid: String(PORT),
    subnqn: nqn,
    hostnqn: CONSUMER,
    hostid: CONSUMER_ID,
  });
  const later = Buffer.alloc(256 * 1024, 0x5a);
  const laterAt = at + 2 * MiB;
  let acked = false;
  const write = writer.write(1, laterAt, later).then(() => {
    acked = true;
  });
  await eventually(async () => degradeReached, 30_000, "node A's agent at the degrade step");
  await Bun.sleep(1500);
  expect(acked).toBe(false);
  expect((await parts.get("vol", ns))?.status?.dataGeneration).toBe(1);
  release();
  await Promise.race([
    write,
    Bun.sleep(30_000).then(() => Promise.reject(new Error("write never completed"))),
  ]);
  const degraded = await parts.get("vol", ns);
  expect(degraded?.status?.dataGeneration).toBe(2);
  expect(degraded?.status?.replicas?.find((e) => e.name === "vol-r1")).toMatchObject({
    state: "Faulted",
    generation: 1,
  });
  expect(degraded?.status?.replicas?.find((e) => e.name === "vol-r0")).toMatchObject({
    state: "Online",
    generation: 2,
  });
  expect((await writer.read(1, laterAt, later.length)).equals(later)).toBe(true);
  writer.close();
  // Node B comes back; its agent exports its copy again, which the volume never uses again.
  degradeGate = undefined;
  await nodeB.emulator.restart();
  await eventually(
    async () => nodeB.emulator.state().subsystems.some((s) => s.nqn === copies[1]?.status?.nqn),
    60_000,
    "copy vol-r1 exported again",
  );
  expect(
    nodeA.emulator
      .state()
      .nvmeControllers.some((c) => c.name === nexusControllerNameFor(copies[1]?.metadata.uid as string)),
  ).toBe(false);

  // The serving node moves to B (as a failover moves it, the manager having fenced A) while A's
  // agent is down: restarted, it finds the raid nobody serves here any more and takes its whole
  // nexus down, its export first, which stays as a standby (A holds copy vol-r0): no namespace,
  // nothing but inaccessible listeners.
  await (agents[0] as RunningAgent).stop();
  await parts.mergePatch("vol", ns, { metadata: { uid: volUid }, spec: { nodeName: NODE_B } });
  expect(nodeA.emulator.state().bdevs.some((b) => b.name === raidBdev)).toBe(true);
  await (lab as ReplicatedLab).startAgent(0);
  await eventually(
    async () => {
      const s = nodeA.emulator.state();
      const sub = s.subsystems.find((x) => x.nqn === nqn);
      return (
        sub !== undefined &&
        sub.namespaces.length === 0 &&
        !s.bdevs.some((b) => b.name === raidBdev) &&
        !s.nvmeControllers.some((c) => c.name.startsWith("nxr_"))
      );
    },
    30_000,
    "node A's nexus retired after the move",
  );
  const standbyA = await spdkA.nvmfSubsystemGetListeners(nqn);
  expect(standbyA.flatMap((l) => l.ana_states?.map((g) => g.ana_state) ?? [])).toEqual(["inaccessible"]);

  // Deletion: the consumer unpublishes, the volume is deleted, and node A's nexus goes away.
  await vas.delete(vaName, ns);
  await eventually(async () => (await vas.get(vaName, ns)) === undefined, 20_000, "consumer attachment gone");
  await parts.delete("vol", ns);
  await eventually(async () => (await parts.get("vol", ns)) === undefined, 30_000, "volume gone");
  expect([...interrupted].sort()).toEqual(["export", "nexus-raid", "nexus-teardown"]);
  // The standbys go with their copies (the manager deletes them after the volume, and their
  // attachments first).
  for (const c of copies) await vas.delete(attachmentNameFor(c.metadata.name, c.metadata.uid as string), ns);
  for (const c of copies) await parts.delete(c.metadata.name, ns);
  await eventually(
    async () => nodes.every((n) => !n.emulator.state().subsystems.some((s) => s.nqn === nqn)),
    30_000,
    "the volume's standby exports gone with its copies",
  );
  const after = nodeA.emulator.state();
  expect(after.subsystems.some((s) => s.nqn === nqn)).toBe(false);
  expect(after.bdevs.some((b) => b.name === raidBdev)).toBe(false);
  expect(after.nvmeControllers.filter((c) => c.name.startsWith("nxr_"))).toEqual([]);
  await eventually(
    async () =>
      nodes.every((n, i) => !n.emulator.state().subsystems.some((s) => s.nqn === copies[i]?.status?.nqn)),
    30_000,
    "the copies' exports gone",
  );
}, 150_000);

test("a consumer holds a path to every copy node: the standby answers nothing until a failover makes it serve, and I/O goes on there with the same data", async () => {
  const [nodeA, nodeB] = nodes as [SimStorageNode, SimStorageNode];
  const spdkA = methodsOf(nodeA);
  const spdkB = methodsOf(nodeB);
  const { volUid, copies, vaName, nqn } = await servedOnA("fo", ["SIMNXA02", "SIMNXB02"]);
  const raidBdev = nexusBdevFor(externalIdFor(volUid));
  // Node B holds copy fo-r1 and does not serve: it exports the volume's NQN as a standby that
  // admits the consumer, with no namespace and its listener inaccessible.
  await eventually(
    async () => {
      const sub = nodeB.emulator.state().subsystems.find((s) => s.nqn === nqn);
      return sub?.hosts.includes(CONSUMER) && sub.listeners.length > 0;
    },
    30_000,
    "standby export on B admitting the consumer",
  );
  expect(nodeB.emulator.state().subsystems.find((s) => s.nqn === nqn)?.namespaces).toEqual([]);
  const anaOf = async (m: SpdkMethods) =>
    (await m.nvmfSubsystemGetListeners(nqn)).flatMap((l) => l.ana_states?.map((g) => g.ana_state) ?? []);
  expect(await anaOf(spdkA)).toEqual(["optimized"]);
  expect(await anaOf(spdkB)).toEqual(["inaccessible"]);
  // An uninvited host is refused by the standby as by the serving export.
  await expect(
    connectController(fabric, {
      trtype: "TCP",
      traddr: B,
      trsvcid: String(PORT),
      subnqn: nqn,
      hostnqn: `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}`,
      hostid: randomUUID(),
    }),
  ).rejects.toThrow();

  // The consumer connects both paths, as NodeStage does with the publish context's portals.
  const [pathA, pathB] = await consumerPaths(nqn);
  try {
    // Each node hands out controller IDs from its own copy's range: no ID repeats across paths.
    expect(pathA.ctrlr.cntlid).toBeGreaterThanOrEqual(cntlidRangeFor(0).min);
    expect(pathA.ctrlr.cntlid).toBeLessThanOrEqual(cntlidRangeFor(0).max);
    expect(pathB.ctrlr.cntlid).toBeGreaterThanOrEqual(cntlidRangeFor(1).min);
    expect(pathB.ctrlr.cntlid).toBeLessThanOrEqual(cntlidRangeFor(1).max);
    expect(pathA.namespaces.length).toBe(1);
    expect(pathB.namespaces).toEqual([]);
    expect(pathB.anaState).toBe("inaccessible");
    const nsUuid = pathA.namespaces[0]?.uuid?.toLowerCase();
    expect(nsUuid).toBe(nexusRaidUuidFor(volUid).toLowerCase());
    const first = Buffer.alloc(512 * 1024);
    for (let i = 0; i < first.length; i++) first[i] = (i * 11 + 3) % 253;
    await pathA.write(1, 2 * MiB, first);
    await pathA.flush(1);
    // Nothing reaches the data through the standby.
    await expect(pathB.read(1, 2 * MiB, 4096)).rejects.toThrow();

    // Failover as the manager does it: the copies' attachments move to B's nexus host (A is
    // fenced from both), then the serving node moves.
    await failOverToB("fo", volUid, copies);
    // The path the consumer already holds to B turns optimized and shows the namespace (the
    // target's ANA and namespace notices); the one to A turns inaccessible and empty.
    await eventually(
      async () => pathB.anaState === "optimized" && pathB.namespaces.length === 1,
      30_000,
      "the consumer's path to B serving",
    );
    // The same namespace (the raid's UUID, equal on every node), so the host sees one device.
    expect(pathB.namespaces[0]?.uuid?.toLowerCase()).toBe(nsUuid);
    expect((await pathB.read(1, 2 * MiB, first.length)).equals(first)).toBe(true);
    const second = Buffer.alloc(256 * 1024, 0xc3);
    await pathB.write(1, 6 * MiB, second);
    await pathB.flush(1);
    expect((await pathB.read(1, 6 * MiB, second.length)).equals(second)).toBe(true);
    await eventually(
      async () => pathA.anaState === "inaccessible" && pathA.namespaces.length === 0,
      30_000,
      "the consumer's path to A a standby",
    );
    expect(nodeA.emulator.state().bdevs.some((b) => b.name === raidBdev)).toBe(false);
    expect(await anaOf(spdkB)).toEqual(["optimized"]);
  } finally {
    pathA.close();
    pathB.close();
  }

  await removeReplicated("fo", vaName, nqn, copies);
}, 150_000);

test("the serving node's target dies: fenced and moved, the other node records the lost copy Faulted first, starts the raid degraded over its own copy, and the consumer's writes resume there with the data", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const [nodeA, nodeB] = nodes as [SimStorageNode, SimStorageNode];
  const { volUid, copies, vaName, nqn } = await servedOnA("dg", ["SIMNXA03", "SIMNXB03"]);
  await eventually(
    async () =>
      nodeB.emulator
        .state()
        .subsystems.find((s) => s.nqn === nqn)
        ?.hosts.includes(CONSUMER),
    30_000,
    "standby export on B admitting the consumer",
  );
  const [pathA, pathB] = await consumerPaths(nqn);
  try {
    const first = Buffer.alloc(512 * 1024);
    for (let i = 0; i < first.length; i++) first[i] = (i * 13 + 5) % 251;
    await pathA.write(1, 3 * MiB, first);
    await pathA.flush(1);

    // Node A's target dies with both copies configured in its raid (its own copy dg-r0 with it).
    await nodeA.emulator.crash();
    // The manager's failover: fence A on both copies, then move the volume to B.
    await failOverToB("dg", volUid, copies);
    // B cannot reach dg-r0: past the bound (2 s here) it records dg-r0 Faulted at generation 2
    // first, then starts the raid over dg-r1 alone (its superblock still waits for dg-r0).
    await eventually(
      async () => pathB.anaState === "optimized" && pathB.namespaces.length === 1,
      60_000,
      "the consumer's path to B serving",
    );
    const moved = await parts.get("dg", ns);
    expect(moved?.status?.dataGeneration).toBe(2);
    expect(moved?.status?.replicas?.find((r) => r.name === "dg-r0")).toMatchObject({
      state: "Faulted",
      generation: 1,
    });
    expect(moved?.status?.replicas?.find((r) => r.name === "dg-r1")).toMatchObject({
      state: "Online",
      generation: 2,
    });
    const [raid] = (await methodsOf(nodeB).bdevRaidGetBdevs("all")).filter(
      (r) => r.name === nexusBdevFor(externalIdFor(volUid)),
    );
    expect(raid).toMatchObject({ state: "online", num_base_bdevs_discovered: 1 });
    expect(raid?.uuid).toBe(nexusRaidUuidFor(volUid));
    // No stand-in left behind.
    expect(nodeB.emulator.state().bdevs.some((b) => b.name.endsWith("-standin"))).toBe(false);
    // The bytes acknowledged before the crash, and new writes, through the path B serves.
    expect((await pathB.read(1, 3 * MiB, first.length)).equals(first)).toBe(true);
    const second = Buffer.alloc(128 * 1024, 0x3c);
    await pathB.write(1, 9 * MiB, second);
    await pathB.flush(1);
    expect((await pathB.read(1, 9 * MiB, second.length)).equals(second)).toBe(true);
  } finally {
    pathA.close();
    pathB.close();
  }
  // Node A's target comes back; the volume stays on B, its raid never takes dg-r0 back.
  await nodeA.emulator.restart();
  await removeReplicated("dg", vaName, nqn, copies);
}, 180_000);

/**
 * The consumer's two paths to volume `nqn`, as NodeStage connects the publish context's portals:
 * to A, then to B, each with a 2 s keep-alive. Rejects if either connect fails.
 */
async function consumerPaths(nqn: string): Promise<[FabricController, FabricController]> {
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
  const pathA = await connect(A);
  const pathB = await connect(B);
  return [pathA, pathB];
}

/** A copy's attachment record admitting `node`'s nexus host (what the manager keeps per copy). */
function nexusAdmission(c: NVMePartition, node: string): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: attachmentNameFor(c.metadata.name, c.metadata.uid as string), namespace: ns },
    spec: {
      partitionName: c.metadata.name,
      partitionUID: c.metadata.uid as string,
      nodeId: `${node}/${nexusHostNqnFor(node)}`,
      hostNQN: nexusHostNqnFor(node),
      attachmentId: `nexus-${c.metadata.name}-${node}`,
    },
  } as NVMeVolumeAttachment;
}

/**
 * Replicated volume `name` (32 MiB, two copies: <name>-r0 on drive `serials[0]` of node A,
 * <name>-r1 on `serials[1]` of node B), as the manager sets it up: both copies admitting node A's
 * nexus host, current at generation 1, served by A; and the consumer admitted
 * (serveReplicatedVolume). Resolves once A exports it and the consumer's admission is enforced.
 */
async function servedOnA(name: string, serials: readonly [string, string]) {
  const { uid: volUid, copies } = await serveReplicatedVolume(lab as ReplicatedLab, {
    name,
    sizeBytes: 32 * MiB,
    copies: serials.map((serial, i) => [serial, `${name}-r${i}`] as const),
    servingNode: NODE_A,
    consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
  });
  return { volUid, copies, vaName: attachmentNameFor(name, volUid), nqn: nqnFor(externalIdFor(volUid)) };
}

/** Fences node A from both copies and moves the volume to B, as a failover does. */
async function failOverToB(name: string, volUid: string, copies: readonly NVMePartition[]): Promise<void> {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  for (const c of copies) {
    const a = await vas.get(attachmentNameFor(c.metadata.name, c.metadata.uid as string), ns);
    await vas.replace({ ...(a as NVMeVolumeAttachment), spec: nexusAdmission(c, NODE_B).spec });
  }
  await parts.mergePatch(name, ns, { metadata: { uid: volUid }, spec: { nodeName: NODE_B } });
}

/** Deletes the consumer's attachment, the volume, the copies' attachments and the copies; waits for no export of `nqn` on either node. */
async function removeReplicated(name: string, vaName: string, nqn: string, copies: readonly NVMePartition[]) {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  await vas.delete(vaName, ns);
  await parts.delete(name, ns);
  await eventually(async () => (await parts.get(name, ns)) === undefined, 30_000, "volume gone");
  for (const c of copies) await vas.delete(attachmentNameFor(c.metadata.name, c.metadata.uid as string), ns);
  for (const c of copies) await parts.delete(c.metadata.name, ns);
  await eventually(
    async () => nodes.every((n) => !n.emulator.state().subsystems.some((s) => s.nqn === nqn)),
    60_000,
    "no export of the volume left on either node",
  );
}
