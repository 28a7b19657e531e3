// Rebuilds onto a copy of a replicated volume, end to end through two agents, against the real
// kube-apiserver and two emulated nvmf_tgt processes joined by loopback TCP. A consumer writes
// through the volume; node B's target dies, so its copy leaves the current set; more writes land on
// node A's copy alone; B comes back, and A's agent rebuilds B's copy (Rebuilding, with progress)
// and records it Online at the volume's generation. The copy, read through its own export, then
// holds exactly the volume's bytes. A rebuild cut off by another loss of B is not recorded Online
// and starts again from zero.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash, randomUUID } from "node:crypto";
import { kinds, type ReplicaStatus } from "../api/index.ts";
import { eventually, type TestCluster } from "../lab/cluster/test-support.ts";
import {
  type ReplicatedLab,
  serveReplicatedVolume,
  startReplicatedLab,
} from "../lab/harness/replicated-lab.ts";
import type { SimStorageNode } from "../lab/harness/storage-node.ts";
import type { SimFabric } from "../lab/sim/spdk/emulator.ts";
import { connectController, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { nexusHostNqnFor } from "../lib/volume-identity.ts";
import type { RunningAgent } from "./main.ts";
import { externalIdFor, nqnFor } from "./partitions/identity.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const A = "127.0.52.1";
const B = "127.0.52.2";
const PORT = 45000 + Math.floor(Math.random() * 4000);
const NODE_A = "rb-a";
const NODE_B = "rb-b";
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;
/** The rebuild's bandwidth cap: 63 MiB at 16 MB/s takes about 4 s, long enough to watch. */
const BANDWIDTH_MB_SEC = 16;

let lab: ReplicatedLab | undefined;
let tc: TestCluster;
let ns: string;
let fabric: SimFabric;
let nodes: SimStorageNode[];
let agents: RunningAgent[];

beforeAll(async () => {
  lab = await startReplicatedLab({
    namespacePrefix: "rebuild",
    nodes: [
      {
        name: NODE_A,
        address: A,
        drives: [{ serial: "SIMRBA01", pciAddress: "0000:3c:00.0", sizeBytes: 4 * GiB }],
      },
      {
        name: NODE_B,
        address: B,
        drives: [{ serial: "SIMRBB01", pciAddress: "0000:3c:00.0", sizeBytes: 4 * GiB }],
      },
    ],
    port: PORT,
    agentEnv: {
      DISTORT_NEXUS_DEGRADE_AFTER_MS: "2000",
      DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: String(BANDWIDTH_MB_SEC),
    },
  });
  ({ tc, ns, fabric, nodes, agents } = lab);
}, 300_000);

afterAll(async () => {
  await lab?.close();
});

function sha(b: Buffer): string {
  return createHash("sha256").update(b).digest("hex");
}

/** Reads `len` bytes from `at` in 1 MiB requests. */
async function readAll(c: FabricController, at: number, len: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  for (let o = 0; o < len; o += MiB) parts.push(await c.read(1, at + o, Math.min(MiB, len - o)));
  return Buffer.concat(parts);
}

test("a copy that missed writes rejoins only through a rebuild, and then holds exactly the volume's data; an interrupted rebuild is never recorded Online", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const _vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const nodeB = nodes[1] as SimStorageNode;

  const nexusHost = nexusHostNqnFor(NODE_A);
  const {
    uid: volUid,
    served,
    copies,
  } = await serveReplicatedVolume(lab as ReplicatedLab, {
    name: "vol",
    sizeBytes: 64 * MiB,
    copies: [
      ["SIMRBA01", "vol-r0"],
      ["SIMRBB01", "vol-r1"],
    ],
    servingNode: NODE_A,
    consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
  });
  const nqn = nqnFor(externalIdFor(volUid));
  const volBytes = served.status?.allocatedBytes as number;
  expect(volBytes).toBe(63 * MiB);
  const connect = () =>
    connectController(fabric, {
      trtype: "TCP",
      traddr: A,
      trsvcid: String(PORT),
      subnqn: nqn,
      hostnqn: CONSUMER,
      hostid: CONSUMER_ID,
    });
  const entryOf = async (name: string): Promise<ReplicaStatus | undefined> =>
    (await parts.get("vol", ns))?.status?.replicas?.find((e) => e.name === name);

  // 1. A pattern through the volume, in both copies.
  const first = Buffer.alloc(2 * MiB);
  for (let i = 0; i < first.length; i++) first[i] = (i * 7 + 13) % 251;
  const consumer = await connect();
  await consumer.write(1, 4 * MiB, first);
  await consumer.flush(1);

  // 2. B's target dies: its copy holds the next write until A's agent records it Faulted at
  // generation 2 and drops it; that write and the next ones are on A's copy alone.
  await nodeB.emulator.crash();
  const second = Buffer.alloc(3 * MiB, 0x5a);
  await Promise.race([
    consumer.write(1, 20 * MiB, second),
    Bun.sleep(30_000).then(() => Promise.reject(new Error("write never completed"))),
  ]);
  const third = Buffer.alloc(1 * MiB);
  for (let i = 0; i < third.length; i++) third[i] = (i * 31 + 5) % 256;
  await consumer.write(1, 40 * MiB, third);
  await consumer.flush(1);
  const down = await parts.get("vol", ns);
  expect(down?.status?.dataGeneration).toBe(2);
  expect(down?.status?.replicas?.find((e) => e.name === "vol-r1")).toMatchObject({
    state: "Faulted",
    generation: 1,
  });

  // 3. B comes back: A's agent admits its copy to a rebuild, which runs at the capped bandwidth
  // (progress visible in the status) while the consumer keeps writing.
  await nodeB.emulator.restart();
  const seen: ReplicaStatus[] = [];
  const rebuilding = await eventually(
    async () => {
      const e = await entryOf("vol-r1");
      if (e) seen.push(e);
      return e?.state === "Rebuilding" && (e.rebuild?.bytesDone ?? 0) > 0 ? e : undefined;
    },
    60_000,
    "vol-r1 Rebuilding with progress",
  );
  expect(rebuilding.generation).toBe(1);
  expect(rebuilding.rebuild?.bytesTotal).toBe(volBytes);
  expect(rebuilding.rebuild?.percent).toBeLessThan(100);
  const t0 = Date.now();
  const during = Buffer.alloc(1 * MiB, 0xc3);
  await consumer.write(1, 60 * MiB, during);
  await consumer.flush(1);
  const online = await eventually(
    async () => {
      const e = await entryOf("vol-r1");
      if (e) seen.push(e);
      return e?.state === "Online" ? e : undefined;
    },
    60_000,
    "vol-r1 Online after its rebuild",
  );
  // The rest took at least what the cap allows (unthrottled, the emulator copies 63 MiB in ~0.1 s).
  const rest = volBytes - (rebuilding.rebuild?.bytesDone as number);
  expect(Date.now() - t0).toBeGreaterThanOrEqual((rest / (BANDWIDTH_MB_SEC * MiB)) * 1000 * 0.8);
  const after = await parts.get("vol", ns);
  expect(online.generation).toBe(after?.status?.dataGeneration as number);
  expect(online.rebuild).toBeUndefined();
  // It was never current before the rebuild: every version seen before Online was behind.
  const firstOnline = seen.findIndex((e) => e.state === "Online");
  expect(seen.slice(0, firstOnline).every((e) => e.generation === 1 && e.state !== "Online")).toBe(true);
  const metrics = await (await fetch(`http://127.0.0.1:${agents[0]?.healthPort}/metrics`)).text();
  expect(metrics).toMatch(
    new RegExp(`distort_rebuilds_completed_total\\{namespace="${ns}",volume="vol"\\} 1`),
  );

  // 4. Proof by I/O: vol-r1, read through its own export (past the raid's superblock area), holds
  // exactly what the volume serves, and that holds every acknowledged write.
  const volumeData = await readAll(consumer, 0, volBytes);
  expect(volumeData.subarray(4 * MiB, 6 * MiB).equals(first)).toBe(true);
  expect(volumeData.subarray(20 * MiB, 23 * MiB).equals(second)).toBe(true);
  expect(volumeData.subarray(40 * MiB, 41 * MiB).equals(third)).toBe(true);
  expect(volumeData.subarray(60 * MiB, 61 * MiB).equals(during)).toBe(true);
  const copyData = async () => {
    const reader = await connectController(fabric, {
      trtype: "TCP",
      traddr: B,
      trsvcid: String(PORT),
      subnqn: copies[1]?.status?.nqn as string,
      hostnqn: nexusHost,
      hostid: randomUUID(),
    });
    try {
      return await readAll(reader, 1 * MiB, volBytes);
    } finally {
      reader.close();
    }
  };
  expect(sha(await copyData())).toBe(sha(volumeData));

  // 5. Interrupted: B dies again (generation 3), comes back, and dies once more while its rebuild
  // runs. The copy is not recorded Online; it is Stale at its old generation, and once B is back
  // its rebuild starts again from zero and finishes.
  await nodeB.emulator.crash();
  const fourth = Buffer.alloc(1 * MiB, 0x77);
  await Promise.race([
    consumer.write(1, 10 * MiB, fourth),
    Bun.sleep(30_000).then(() => Promise.reject(new Error("write never completed"))),
  ]);
  await consumer.flush(1);
  expect((await parts.get("vol", ns))?.status?.dataGeneration).toBe(3);
  await nodeB.emulator.restart();
  const midway = await eventually(
    async () => {
      const e = await entryOf("vol-r1");
      return e?.state === "Rebuilding" && (e.rebuild?.bytesDone ?? 0) >= 16 * MiB ? e : undefined;
    },
    60_000,
    "vol-r1 Rebuilding past 16 MiB",
  );
  expect(midway.generation).toBe(2);
  await nodeB.emulator.crash();
  const cut = await eventually(
    async () => {
      const e = await entryOf("vol-r1");
      // The first state after Rebuilding, whatever it is: it must be Stale, never Online.
      return e && e.state !== "Rebuilding" ? e : undefined;
    },
    30_000,
    "vol-r1 out of Rebuilding after its rebuild was cut off",
  );
  expect(cut.state).toBe("Stale");
  expect(cut.generation).toBe(2);
  expect(cut.message).toMatch(/starts again from zero/);
  // The consumer's writes go on without it (the lost controller was dropped).
  const fifth = Buffer.alloc(1 * MiB, 0x99);
  await Promise.race([
    consumer.write(1, 30 * MiB, fifth),
    Bun.sleep(30_000).then(() => Promise.reject(new Error("write never completed"))),
  ]);
  await consumer.flush(1);
  // Held down for a while: it stays Stale, never Online.
  await Bun.sleep(3000);
  expect(await entryOf("vol-r1")).toMatchObject({ state: "Stale", generation: 2 });
  await nodeB.emulator.restart();
  const again: ReplicaStatus[] = [];
  await eventually(
    async () => {
      const e = await entryOf("vol-r1");
      if (e?.state === "Rebuilding" && e.rebuild) again.push(e);
      return e?.state === "Online" ? e : undefined;
    },
    90_000,
    "vol-r1 Online after its second rebuild",
  );
  // The second rebuild began from zero, not where the cut one stopped.
  expect(again[0]?.rebuild?.bytesDone ?? 0).toBeLessThan(midway.rebuild?.bytesDone as number);
  expect((await entryOf("vol-r1"))?.generation).toBe(3);
  const finalVolume = await readAll(consumer, 0, volBytes);
  expect(finalVolume.subarray(10 * MiB, 11 * MiB).equals(fourth)).toBe(true);
  expect(finalVolume.subarray(30 * MiB, 31 * MiB).equals(fifth)).toBe(true);
  expect(sha(await copyData())).toBe(sha(finalVolume));
  consumer.close();
}, 300_000);
