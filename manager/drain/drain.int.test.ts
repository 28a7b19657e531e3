// Drain of storage nodes, end to end: three agents on emulated nvmf_tgt processes joined by
// loopback TCP, and the real manager (placement, replica controller, drain controller), against
// the real kube-apiserver. A replicas=2 volume is served from node A with copies on A and B; a
// consumer writes through A. Draining B (a copy node, not the serving node) while a bounded
// writer keeps writing: a replacement copy is placed on C (never on the draining node), rebuilt by
// A, and only then is B's copy retired by A (Stale "retired: drain of node B"), its admission
// withdrawn and its partition deleted. Every acknowledged write reads back through A; the volume
// ends with 2 Online copies at the current generation; B ends Drained with nothing on it. A
// single-copy volume on a draining node blocks the drain, named in the condition, untouched.

import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash, randomUUID } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { externalIdFor, nqnFor } from "../../agent/partitions/identity.ts";
import {
  kinds,
  type NVMePartition,
  type NVMeVolumeAttachment,
  type RDMAStorageNode,
} from "../../api/index.ts";
import { eventually, type TestCluster } from "../../lab/cluster/test-support.ts";
import {
  type ReplicatedLab,
  serveReplicatedVolume,
  startReplicatedLab,
} from "../../lab/harness/replicated-lab.ts";
import { claimDevice } from "../../lab/harness/storage-node.ts";
import { connectController, type FabricController } from "../../lab/sim/spdk/fabric.ts";
import { realClock } from "../../lib/clock.ts";
import { EventRecorder } from "../../lib/kube/events.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { parseConfig } from "../config.ts";
import { type RunningManager, startManager } from "../manager.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const ADDR = ["127.0.54.1", "127.0.54.2", "127.0.54.3"] as const;
const NODES = ["dr-a", "dr-b", "dr-c"] as const;
const SERIALS = ["SIMDRA01", "SIMDRB01", "SIMDRC01"] as const;
const PORT = 45000 + Math.floor(Math.random() * 4000);
const CONSUMER_ID = randomUUID();
const CONSUMER = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER_ID}`;
const VOL_BYTES = 64 * MiB;

let lab: ReplicatedLab | undefined;
let tc: TestCluster;
let ns: string;
let manager: RunningManager | undefined;
let devC: Awaited<ReturnType<ResourceClient<import("../../api/index.ts").NVMeDevice>["get"]>>;
const registry = new Registry();
/**
 * The manager sees only this test's objects (DISTORT_LABEL_SELECTOR): integration tests share one
 * API server, and another test's unplaced partition would otherwise be placed on these nodes (in
 * CI a leftover single-copy volume landed on a drained node and blocked its drain).
 */
const SCOPE = "storage.distort.io/test-scope";

beforeAll(async () => {
  lab = await startReplicatedLab({
    namespacePrefix: "drain",
    nodes: NODES.map((name, i) => ({
      name,
      address: ADDR[i] as string,
      drives: [{ serial: SERIALS[i] as string, pciAddress: "0000:3e:00.0", sizeBytes: 2 * GiB }],
    })),
    port: PORT,
    agentEnv: { DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: "64" },
  });
  ({ tc, ns } = lab);
}, 300_000);

afterAll(async () => {
  await manager?.stop();
  await lab?.close();
});

/** Labels every object of this test the manager must see: its storage nodes, drives, claims, partitions. */
async function scopeToTest(): Promise<void> {
  const label = { metadata: { labels: { [SCOPE]: ns } } };
  const nodes = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  for (const n of NODES) await nodes.mergePatch(n, ns, label);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  for (const d of (await devices.list()).items)
    if ((NODES as readonly string[]).includes(d.spec.nodeName))
      await devices.mergePatch(d.metadata.name, undefined, label);
  const claims = new ResourceClient(tc.conn, kinds.NVMeDeviceClaim);
  for (const c of (await claims.list({ namespace: ns })).items)
    await claims.mergePatch(c.metadata.name, ns, label);
  const all = new ResourceClient(tc.conn, kinds.NVMePartition);
  for (const p of (await all.list({ namespace: ns })).items) await all.mergePatch(p.metadata.name, ns, label);
}

async function startTestManager(): Promise<void> {
  await scopeToTest();
  const config = parseConfig(
    {
      DISTORT_KUBECONFIG: tc.kubeconfigPath,
      DISTORT_NAMESPACE: ns,
      DISTORT_LABEL_SELECTOR: `${SCOPE}=${ns}`,
      DISTORT_LEADER_ELECT: "false",
      DISTORT_HEARTBEAT_STALENESS_MS: "60000",
      DISTORT_RESYNC_MS: "0",
      DISTORT_HEALTH_PORT: "0",
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

async function eventsIn(namespace: string) {
  return (await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace })).items;
}

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

/** A block of `len` bytes unique to (seed, n). */
function block(seed: number, n: number, len: number): Buffer {
  const b = Buffer.alloc(len);
  for (let j = 0; j < len; j++) b[j] = (j * 31 + n * 7 + seed) % 253;
  return b;
}

const parts = () => new ResourceClient(tc.conn, kinds.NVMePartition);
const storageNodes = () => new ResourceClient(tc.conn, kinds.RDMAStorageNode);
const drained = (n: RDMAStorageNode | undefined) => n?.status?.conditions?.find((c) => c.type === "Drained");

/** On a failure: the volume, its copies and the Events, to see where it stopped. */
async function dump(name: string): Promise<void> {
  const all = (await parts().list({ namespace: ns })).items;
  const strip = (p: NVMePartition) => ({
    name: p.metadata.name,
    node: p.spec.nodeName,
    del: p.metadata.deletionTimestamp,
    ann: p.metadata.annotations,
    state: p.status?.state,
    gen: p.status?.dataGeneration,
    replicas: p.status?.replicas,
    released: p.status?.releasedBy,
    conds: p.status?.conditions?.map((c) => `${c.type}=${c.status} ${c.reason}: ${c.message}`),
  });
  for (const p of all.filter((x) => x.metadata.name === name || x.spec.replicaOf?.name === name))
    process.stderr.write(`${JSON.stringify(strip(p))}\n`);
  for (const e of (await eventsIn(ns)).slice(-40)) process.stderr.write(`event ${e.reason}: ${e.note}\n`);
}

/** A volume of this test (in its scope), placed by the manager: spdk, partition, TCP. */
function createVolume(name: string, sizeBytes: number, replicas?: number): Promise<NVMePartition> {
  return parts().create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name, namespace: ns, labels: { [SCOPE]: ns } },
    spec: {
      sizeBytes,
      ...(replicas === undefined ? {} : { replicas }),
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "tcp" },
    },
  } as NVMePartition);
}

async function setDrain(node: string, drain: boolean): Promise<void> {
  await storageNodes().mergePatch(node, ns, { spec: { drain } });
}

test("draining a copy node: replacement on the third node first, then the old copy retired and deleted; every acknowledged write reads back", async () => {
  const served = await serveReplicatedVolume(lab as ReplicatedLab, {
    name: "vd",
    sizeBytes: VOL_BYTES,
    copies: [
      [SERIALS[0], "vd-r0"],
      [SERIALS[1], "vd-r1"],
    ],
    servingNode: NODES[0],
    consumer: { hostNQN: CONSUMER, nodeId: `consumer-1/${CONSUMER}` },
  });
  // The third node's drive is claimed too, so placement has somewhere to put a replacement.
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  devC = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === SERIALS[2]),
    30_000,
    "node C's drive reported",
  );
  await claimDevice(tc.conn, devC as NonNullable<typeof devC>, ns);
  await startTestManager();

  const consumer: FabricController = await connectController(lab!.fabric, {
    trtype: "TCP",
    traddr: ADDR[0],
    trsvcid: String(PORT),
    subnqn: nqnFor(externalIdFor(served.uid)),
    hostnqn: CONSUMER,
    hostid: CONSUMER_ID,
  });
  // 1. A known pattern before the drain.
  const acked = new Map<number, string>();
  const BLOCK = 256 * 1024;
  for (let n = 0; n < 16; n++) {
    const b = block(1, n, BLOCK);
    await consumer.write(1, n * BLOCK, b);
    acked.set(n * BLOCK, sha(b));
  }
  await consumer.flush(1);

  // 2. Drain node B while a bounded writer keeps writing (overwrites and new blocks), logging
  // every acknowledged write's checksum.
  await setDrain(NODES[1], true);
  let stop = false;
  let writeErrors = 0;
  let writesDuring = 0;
  const writer = (async () => {
    const deadline = Date.now() + 120_000;
    for (let i = 0; i < 4000 && !stop && Date.now() < deadline; i++) {
      const n = i % 200;
      const at = n * BLOCK;
      if (at + BLOCK > VOL_BYTES - MiB) continue;
      const b = block(2 + i, n, BLOCK);
      try {
        await consumer.write(1, at, b);
        acked.set(at, sha(b));
        writesDuring++;
      } catch {
        writeErrors++;
        // An unacknowledged write may or may not have landed: its old checksum is no promise.
        acked.delete(at);
      }
      await Bun.sleep(5);
    }
  })();

  // The replacement is placed on C (never on the draining B), becomes current, and only then is
  // B's copy retired by the serving node and deleted.
  const seenRetired: string[] = [];
  let sawThree = false;
  const done = await eventually(
    async () => {
      const v = await parts().get("vd", ns);
      const rs = v?.status?.replicas ?? [];
      if (rs.length === 3) sawThree = true;
      const r1 = rs.find((e) => e.name === "vd-r1");
      if (r1?.message?.startsWith("retired:")) seenRetired.push(r1.message);
      const gone = !(await parts().get("vd-r1", ns));
      const online = rs.filter((e) => e.state === "Online" && e.generation === v?.status?.dataGeneration);
      return gone && rs.length === 2 && online.length === 2 ? v : undefined;
    },
    120_000,
    "vd-r1 replaced and removed",
  ).catch(async (err) => {
    await dump("vd");
    throw err;
  });
  stop = true;
  await writer;
  expect(writeErrors).toBe(0);
  expect(writesDuring).toBeGreaterThan(0);
  expect(sawThree).toBe(true);
  const replacement = done.status?.replicas?.find((e) => e.name !== "vd-r0");
  expect(replacement?.nodeName).toBe(NODES[2]);
  expect(done.spec.nodeName).toBe(NODES[0]);
  // The serving node recorded the retirement (the manager does not lower copies).
  const events = await eventsIn(ns);
  const reasons = new Set(events.map((e) => e.reason));
  for (const r of ["ReplicaReplacing", "ReplicaRetiring", "CopyRetired", "ReplicaMoved", "DrainStarted"])
    expect(reasons.has(r), `event ${r}`).toBe(true);
  if (seenRetired.length > 0) expect(seenRetired[0]).toBe(`retired: drain of node ${NODES[1]}`);

  // 3. Every acknowledged write reads back through the serving node.
  for (const [at, want] of acked) expect(sha(await consumer.read(1, at, BLOCK)), `block at ${at}`).toBe(want);

  // The replacement copy itself, read through its own export as the serving node's host (past
  // the raid's superblock area), holds exactly what the volume serves: it was rebuilt, not empty.
  const volBytes = served.served.status?.allocatedBytes as number;
  const readAll = async (c: FabricController, from: number) => {
    const out: Buffer[] = [];
    for (let o = 0; o < volBytes; o += MiB) out.push(await c.read(1, from + o, Math.min(MiB, volBytes - o)));
    return Buffer.concat(out);
  };
  const volumeData = await readAll(consumer, 0);
  const copyC = (await parts().get(replacement?.name as string, ns)) as NVMePartition;
  const reader = await connectController(lab!.fabric, {
    trtype: "TCP",
    traddr: ADDR[2],
    trsvcid: String(PORT),
    subnqn: copyC.status?.nqn as string,
    hostnqn: nexusHostNqnFor(NODES[0]),
    hostid: randomUUID(),
  });
  try {
    expect(sha(await readAll(reader, MiB))).toBe(sha(volumeData));
  } finally {
    reader.close();
  }

  // 4. B ends with nothing of DISTORT: no partition, no export, Drained=True.
  const nodeB = await eventually(
    async () => {
      const n = await storageNodes().get(NODES[1], ns);
      return drained(n)?.status === "True" ? n : undefined;
    },
    60_000,
    "node B Drained",
  );
  expect(nodeB.status?.exportCount ?? 0).toBe(0);
  const onB = (await parts().list({ namespace: ns })).items.filter((p) => p.spec.nodeName === NODES[1]);
  expect(onB).toEqual([]);
  const subsystemsB = lab?.nodes[1]?.emulator.state().subsystems ?? [];
  expect(subsystemsB.filter((s) => s.subtype === "NVMe").map((s) => s.nqn)).toEqual([]);
  expect(registry.render()).toMatch(/distort_drain_replicas_moved_total 1/);
  consumer.close();
  await setDrain(NODES[1], false);
}, 300_000);

test("a single-copy volume on a draining node blocks the drain: named in Drained, left untouched", async () => {
  try {
    // Placed by the manager: A and B are cordoned, so only C can take it.
    for (const n of [NODES[0], NODES[1]])
      await storageNodes().mergePatch(n, ns, { spec: { unschedulable: true } });
    await createVolume("solo", 16 * MiB);
    const solo = await eventually(
      async () => {
        const p = await parts().get("solo", ns);
        return p?.status?.state === "Exported" ? p : undefined;
      },
      30_000,
      "solo Exported",
    );
    await setDrain(NODES[2], true);
    const cond = await eventually(
      async () => {
        const c = drained(await storageNodes().get(NODES[2], ns));
        return c?.reason === "SingleCopyVolumes" ? c : undefined;
      },
      30_000,
      "Drained False with SingleCopyVolumes",
    );
    expect(solo.spec.nodeName).toBe(NODES[2]);
    expect(cond.status).toBe("False");
    expect(cond.message).toContain(`single-copy volumes ${ns}/solo (cannot move`);
    // Untouched: still Exported on C, not deleted.
    await Bun.sleep(2000);
    const after = (await parts().get("solo", ns)) as NVMePartition;
    expect(after.metadata.uid).toBe(solo.metadata.uid);
    expect(after.metadata.deletionTimestamp).toBeUndefined();
    expect(after.status?.state).toBe("Exported");
    const events = await eventsIn(ns);
    expect(events.some((e) => e.reason === "DrainBlocked" && e.regarding?.name === "solo")).toBe(true);
    // With every node cordoned or draining, a new volume is refused with the reason.
    await createVolume("nowhere", 16 * MiB);
    const refused = await eventually(
      async () => {
        const c = (await parts().get("nowhere", ns))?.status?.conditions?.find((x) => x.type === "Scheduled");
        return c?.status === "False" ? c : undefined;
      },
      30_000,
      "nowhere unschedulable",
    );
    expect(refused.reason).toBe("Cordoned");
    expect(refused.message).toContain(`node ${NODES[2]} draining`);
    expect(refused.message).toContain(`node ${NODES[0]} cordoned`);
  } catch (err) {
    // Where it stopped: every node's Drained condition and what the manager placed where.
    for (const n of NODES) {
      const rec = await storageNodes().get(n, ns);
      process.stderr.write(`${n}: ${JSON.stringify(drained(rec))} spec ${JSON.stringify(rec?.spec)}\n`);
    }
    for (const p of (await parts().list({ namespace: ns })).items)
      process.stderr.write(
        `${p.metadata.name} on ${p.spec.nodeName} ${p.status?.state} replicaOf=${p.spec.replicaOf?.name ?? "-"}\n`,
      );
    for (const e of (await eventsIn(ns)).slice(-20)) process.stderr.write(`event ${e.reason}: ${e.note}\n`);
    throw err;
  } finally {
    // Neither single-copy volume may outlive this test: once the nodes are schedulable again
    // "nowhere" is placed, and on the node a later test drains it would block that drain.
    for (const name of ["nowhere", "solo"])
      await parts()
        .delete(name, ns)
        .catch(() => {});
    await setDrain(NODES[2], false);
    for (const n of [NODES[0], NODES[1]])
      await storageNodes().mergePatch(n, ns, { spec: { unschedulable: null } } as never);
    await eventually(
      async () => ((await parts().get("nowhere", ns)) || (await parts().get("solo", ns)) ? undefined : true),
      60_000,
      "the single-copy volumes gone",
    );
  }
}, 180_000);

test("draining the serving node: replacement first, its own copy retired, then a planned handover (release, fence, serve elsewhere); every acknowledged write reads back through the new serving node", async () => {
  const CONSUMER2_ID = randomUUID();
  const CONSUMER2 = `nqn.2014-08.org.nvmexpress:uuid:${CONSUMER2_ID}`;
  // Made by the manager this time: A cordoned while the copies are placed, so they go to B and
  // C; the volume is served from its first copy's node, which then drains.
  await storageNodes().mergePatch(NODES[0], ns, { spec: { unschedulable: true } });
  const vh = await createVolume("vh", VOL_BYTES, 2);
  const uid = vh.metadata.uid as string;
  const first = await eventually(
    async () => {
      const p = await parts().get("vh", ns);
      return p?.spec.nodeName && p.status?.state === "Exported" ? p : undefined;
    },
    60_000,
    "vh served and Exported",
  );
  await storageNodes().mergePatch(NODES[0], ns, { spec: { unschedulable: null } } as never);
  const S = first.spec.nodeName as string;
  expect([NODES[1] as string, NODES[2] as string]).toContain(S);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vaName = attachmentNameFor("vh", uid);
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "vh",
      partitionUID: uid,
      nodeId: `consumer-2/${CONSUMER2}`,
      hostNQN: CONSUMER2,
      attachmentId: "att-vh",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-vh",
    20_000,
    "consumer of vh admitted",
  );
  const served = { uid };
  const subnqn = nqnFor(externalIdFor(served.uid));
  const connectTo = async (node: string) =>
    connectController(lab!.fabric, {
      trtype: "TCP",
      traddr: ADDR[NODES.indexOf(node as (typeof NODES)[number])] as string,
      trsvcid: String(PORT),
      subnqn,
      hostnqn: CONSUMER2,
      hostid: CONSUMER2_ID,
      connectTimeoutMs: 2000,
    });
  let consumer = await connectTo(S);
  const acked = new Map<number, string>();
  const BLOCK = 256 * 1024;
  for (let n = 0; n < 16; n++) {
    const b = block(5, n, BLOCK);
    await consumer.write(1, n * BLOCK, b);
    acked.set(n * BLOCK, sha(b));
  }
  await consumer.flush(1);

  await setDrain(S, true);
  // The writer: each write is retried (on whichever node serves now) until acknowledged; only
  // acknowledged writes are logged. Like a multipath initiator moving to the new path.
  let stop = false;
  let retries = 0;
  let writes = 0;
  const writer = (async () => {
    const deadline = Date.now() + 60_000;
    for (let i = 0; i < 3000 && !stop && Date.now() < deadline; i++) {
      const n = i % 200;
      const at = n * BLOCK;
      const b = block(6 + i, n, BLOCK);
      for (let attempt = 0; attempt < 300 && Date.now() < deadline; attempt++) {
        try {
          await Promise.race([
            consumer.write(1, at, b),
            Bun.sleep(5000).then(() => Promise.reject(new Error("write timed out"))),
          ]);
          acked.set(at, sha(b));
          writes++;
          break;
        } catch {
          // Not acknowledged: no promise either way; the retry overwrites it.
          acked.delete(at);
          retries++;
          consumer.close();
          await Bun.sleep(200);
          const v = await parts().get("vh", ns);
          try {
            consumer = await connectTo(v?.spec.nodeName as string);
          } catch {}
        }
      }
      await Bun.sleep(5);
    }
  })();

  const done = await eventually(
    async () => {
      const v = await parts().get("vh", ns);
      const rs = v?.status?.replicas ?? [];
      const online = rs.filter((e) => e.state === "Online" && e.generation === v?.status?.dataGeneration);
      // Done: served elsewhere, the request and the release record cleared, the old copy gone.
      return v?.spec.nodeName !== S &&
        v?.status?.releasedBy === undefined &&
        v?.metadata.annotations?.["storage.distort.io/handover-from"] === undefined &&
        !(await parts().list({ namespace: ns })).items.some(
          (p) => p.spec.replicaOf?.uid === uid && p.spec.nodeName === S,
        ) &&
        rs.length === 2 &&
        online.length === 2
        ? v
        : undefined;
    },
    60_000,
    "vh handed over and its copy on B removed",
  ).catch(async (err) => {
    await dump("vh");
    throw err;
  });
  stop = true;
  await writer;
  expect(writes).toBeGreaterThan(0);
  expect(done.spec.nodeName).not.toBe(S);
  expect(done.status?.replicas?.every((e) => e.nodeName !== S)).toBe(true);
  expect(done.metadata.annotations?.["storage.distort.io/handover-from"]).toBeUndefined();
  expect(done.status?.releasedBy).toBeUndefined();
  const reasons = new Set((await eventsIn(ns)).map((e) => e.reason));
  for (const r of ["HandoverRequested", "Released", "HandedOver", "CopyRetired"])
    expect(reasons.has(r), `event ${r}`).toBe(true);

  // Every acknowledged write reads back through the new serving node.
  consumer.close();
  consumer = await connectTo(done.spec.nodeName as string);
  for (const [at, want] of acked) expect(sha(await consumer.read(1, at, BLOCK)), `block at ${at}`).toBe(want);
  consumer.close();

  // B ends with nothing of DISTORT.
  let lastDrained = "";
  const nodeB = await eventually(
    async () => {
      const n = await storageNodes().get(S, ns);
      const c = drained(n);
      lastDrained = `${c?.reason}: ${c?.message}`;
      return c?.status === "True" ? n : undefined;
    },
    // The agent's report (its exports gone) and the drain controller's pass, on a loaded machine.
    180_000,
    "the old serving node Drained",
  ).catch((err: Error) => {
    throw new Error(`${err.message} (last: ${lastDrained})`);
  });
  expect(nodeB.status?.exportCount ?? 0).toBe(0);
  const subsystemsB =
    lab?.nodes[NODES.indexOf(S as (typeof NODES)[number])]?.emulator.state().subsystems ?? [];
  expect(subsystemsB.filter((s) => s.subtype === "NVMe").map((s) => s.nqn)).toEqual([]);
  process.stderr.write(`handover: ${writes} writes acknowledged, ${retries} retried\n`);
  await setDrain(S, false);
}, 300_000);
