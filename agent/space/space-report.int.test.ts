// A full lvstore end to end: the real kube-apiserver, the agent (runAgent) and the SPDK emulator
// with a fabric. Two thin partitions overcommit one small drive; writes over the fabric fill one
// until the lvstore has no free cluster, the other's write to an unallocated block fails with EIO,
// the agent records the drive's lvstore space and SpaceExhausted=True (with an Event) on the thin
// partitions; deleting the filler frees its clusters, the write succeeds and the condition clears.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlacedMany,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../../lab/harness/storage-node.ts";
import { connectController, createFabric, type FabricController } from "../../lab/sim/spdk/fabric.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { silentLogger } from "../../lib/log.ts";
import { attachmentNameFor } from "../../lib/volume-identity.ts";
import { parseAgentConfig } from "../config.ts";
import { type RunningAgent, runAgent } from "../main.ts";
import { SPACE_EXHAUSTED } from "./space-report.ts";

const MiB = 1024 * 1024;
const CLUSTER = 4 * MiB;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:7a2c9e41-5b3d-4f80-9c16-2e8d4b7a1f03";
const fabricDir = mkdtempSync(join(tmpdir(), "distort-sfab-"));
const fabric = createFabric(fabricDir);
let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;
const ctrls: FabricController[] = [];

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("agent-space");
  node = await startSimStorageNode({
    nodeName: "node-s",
    drives: [{ serial: "SIMS0001", pciAddress: "0000:3d:00.0", sizeBytes: 64 * MiB }],
    fabric,
  });
  const env = {
    ...node.agentEnv(tc.kubeconfigPath, ns),
    DISTORT_METRICS_PERIOD_MS: "1000",
    DISTORT_HEALTH_PORT: "0",
  };
  agent = await runAgent(parseAgentConfig(env), silentLogger);
}, 300_000);

afterAll(async () => {
  for (const c of ctrls) c.close();
  await agent?.stop();
  await node?.close();
  await tc?.stop();
  rmSync(fabricDir, { recursive: true, force: true });
});

test("two thin volumes overcommit a drive: the full lvstore fails writes with EIO, is reported, and recovers", async () => {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const device = (await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMS0001"),
    15_000,
    "NVMeDevice reported",
  )) as NVMeDevice;
  const claim = await claimDevice(tc.conn, device, ns);
  // Each as large as the whole drive: 2x overcommitted.
  const size = 64 * MiB;
  const thin = (name: string) => {
    const p = placedPartition(name, ns, device, claim, size);
    p.spec.volumeManager = "spdk-lvol";
    p.spec.thinProvisioning = true;
    return p;
  };
  const [fill, other] = await createPlacedMany(tc.conn, [thin("fill"), thin("other")], device);
  const exported = async (name: string) =>
    (await eventually(
      async () => {
        const p = await parts.get(name, ns);
        return p?.status?.state === "Exported" ? p : undefined;
      },
      60_000,
      `${name} Exported`,
    )) as NVMePartition;
  const open = async (p: NVMePartition, created: NVMePartition) => {
    const vaName = attachmentNameFor(p.metadata.name, created.metadata.uid as string);
    await vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name: vaName, namespace: ns },
      spec: {
        partitionName: p.metadata.name,
        partitionUID: created.metadata.uid as string,
        nodeId: "worker-s",
        hostNQN: HOST,
        attachmentId: `att-${p.metadata.name}`,
      },
    } as NVMeVolumeAttachment);
    await eventually(
      async () =>
        (await vas.get(vaName, ns))?.status?.observedAttachmentId === `att-${p.metadata.name}` || undefined,
      30_000,
      `${p.metadata.name} AccessReady`,
    );
    const c = await connectController(fabric, {
      trtype: "TCP",
      traddr: p.status?.portalIP as string,
      trsvcid: String(p.status?.portalPort),
      subnqn: p.status?.nqn as string,
      hostnqn: HOST,
      hostid: "worker-s",
    });
    ctrls.push(c);
    return c;
  };
  const a = await open(await exported("fill"), fill as NVMePartition);
  const b = await open(await exported("other"), other as NVMePartition);

  // The agent reports the drive's lvstore: every data cluster free (thin lvols took none).
  const before = (await eventually(
    async () => (await devices.get(device.metadata.name))?.status?.lvstore,
    30_000,
    "status.lvstore",
  )) as NonNullable<NonNullable<NVMeDevice["status"]>["lvstore"]>;
  expect(before.freeBytes).toBe(before.totalBytes);
  const clusters = before.totalBytes / CLUSTER;

  await b.write(1, 0, Buffer.alloc(4096, 0xbb));
  let filled = 0;
  for (let c = 0; c < size / CLUSTER; c++) {
    const e = await a.write(1, c * CLUSTER, Buffer.alloc(4096, 0xaa)).then(
      () => undefined,
      (err: { errno?: number }) => err.errno,
    );
    if (e !== undefined) {
      expect(e).toBe(5); // EIO, as SPDK's Internal Device Error reaches Linux
      break;
    }
    filled++;
  }
  expect(filled).toBe(clusters - 1);
  // The other volume's write needs a new cluster: an I/O error at the initiator.
  expect(await b.write(1, CLUSTER, Buffer.alloc(4096, 0xcc)).catch((e) => e.errno)).toBe(5);

  const exhausted = await eventually(
    async () => {
      const p = await parts.get("other", ns);
      const c = findCondition(p?.status?.conditions ?? [], SPACE_EXHAUSTED);
      return c?.status === "True" ? c : undefined;
    },
    30_000,
    "SpaceExhausted=True on other",
  );
  expect(exhausted.reason).toBe("LvstoreFull");
  expect(exhausted.message).toContain("writes to the");
  expect((await devices.get(device.metadata.name))?.status?.lvstore?.freeBytes).toBe(0);
  await eventually(
    async () =>
      (await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns })).items.some(
        (e) => e.reason === "SpaceExhausted" && e.type === "Warning" && e.regarding?.name === "other",
      ) || undefined,
    15_000,
    "SpaceExhausted Event",
  );

  // Deleting the filler frees its clusters: the failed write now lands, the condition clears.
  ctrls.shift()?.close();
  await vas.delete(attachmentNameFor("fill", (fill as NVMePartition).metadata.uid as string), ns);
  await parts.delete("fill", ns);
  // The agent deletes the lvol once the attachment is gone (a partition with one waits).
  await eventually(
    async () => (await parts.get("fill", ns)) === undefined || undefined,
    120_000,
    "fill gone",
  );
  await eventually(
    async () => {
      const p = await parts.get("other", ns);
      return findCondition(p?.status?.conditions ?? [], SPACE_EXHAUSTED)?.status === "False" || undefined;
    },
    30_000,
    "SpaceExhausted=False on other",
  );
  await b.write(1, CLUSTER, Buffer.alloc(4096, 0xcc));
  expect((await b.read(1, CLUSTER, 4096)).equals(Buffer.alloc(4096, 0xcc))).toBe(true);
}, 300_000);
