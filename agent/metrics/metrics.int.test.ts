// The agent's /metrics end to end: the real kube-apiserver, the agent process wiring (runAgent),
// the SPDK emulator with a fabric. An Exported, attached partition's I/O counters, connected hosts
// and lvstore space scraped over HTTP move after real writes and reads over the fabric.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../../lab/harness/storage-node.ts";
import { connectController, createFabric } from "../../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { silentLogger } from "../../lib/log.ts";
import { attachmentNameFor } from "../../lib/volume-identity.ts";
import { parseAgentConfig } from "../config.ts";
import { type RunningAgent, runAgent } from "../main.ts";

const GiB = 1024 ** 3;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:3c1e7b52-0a9d-4f6e-8b21-6d5c4b3a2f10";
const fabricDir = mkdtempSync(join(tmpdir(), "distort-mfab-"));
const fabric = createFabric(fabricDir);
let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;

/** One scrape of the agent's /metrics: the value of `name{labels}` (undefined when absent). */
async function scrape(name: string, labels: Record<string, string>): Promise<number | undefined> {
  const text = await (await fetch(`http://127.0.0.1:${agent.healthPort}/metrics`)).text();
  const want = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort();
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\} (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = (m[2] as string).split(",").sort();
    if (want.every((w) => have.includes(w))) return Number(m[3]);
  }
  return undefined;
}

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("agent-metrics");
  node = await startSimStorageNode({
    nodeName: "node-m",
    drives: [{ serial: "SIMM0001", pciAddress: "0000:3c:00.0", sizeBytes: 2 * GiB }],
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
  await agent?.stop();
  await node?.close();
  await tc?.stop();
  rmSync(fabricDir, { recursive: true, force: true });
});

test("an exported volume's I/O, hosts and lvstore space move on /metrics after fabric I/O", async () => {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const device = (await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMM0001"),
    15_000,
    "NVMeDevice reported",
  )) as NVMeDevice;
  const claim = await claimDevice(tc.conn, device, ns);
  const created = await createPlaced(
    tc.conn,
    placedPartition("vol1", ns, device, claim, 64 * 1024 * 1024),
    device,
  );
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const exported = (await eventually(
    async () => {
      const p = await parts.get("vol1", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "Exported",
  )) as NVMePartition;
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vaName = attachmentNameFor("vol1", created.metadata.uid as string);
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "vol1",
      partitionUID: created.metadata.uid as string,
      nodeId: "worker-m",
      hostNQN: HOST,
      attachmentId: "att-m",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-m" || undefined,
    15_000,
    "AccessReady",
  );

  const vol = { namespace: ns, partition: "vol1" };
  const writes0 = await eventually(
    async () => scrape("distort_volume_write_ops_total", vol),
    15_000,
    "volume series",
  );
  expect(await scrape("distort_volume_served", vol)).toBe(1);
  const lvsFree0 = await eventually(
    async () => scrape("distort_lvstore_free_bytes", {}),
    15_000,
    "lvstore series",
  );

  const ctrl = await connectController(fabric, {
    trtype: "TCP",
    traddr: exported.status?.portalIP as string,
    trsvcid: String(exported.status?.portalPort),
    subnqn: exported.status?.nqn as string,
    hostnqn: HOST,
    hostid: "worker-m",
  });
  try {
    for (let i = 0; i < 16; i++) await ctrl.write(1, i * 65536, Buffer.alloc(65536, i + 1));
    for (let i = 0; i < 4; i++) await ctrl.read(1, i * 65536, 65536);
    await eventually(
      async () => ((await scrape("distort_volume_connected_hosts", vol)) === 1 ? true : undefined),
      15_000,
      "one connected host",
    );
    const writes = await eventually(
      async () => {
        const w = await scrape("distort_volume_write_ops_total", vol);
        return w !== undefined && w >= writes0 + 16 ? w : undefined;
      },
      15_000,
      "write ops counted",
    );
    expect(writes - writes0).toBe(16);
    expect(await scrape("distort_volume_written_bytes_total", vol)).toBeGreaterThanOrEqual(16 * 65536);
    expect(await scrape("distort_volume_read_ops_total", vol)).toBeGreaterThanOrEqual(4);
    expect(await scrape("distort_volume_write_seconds_total", vol)).toBeGreaterThan(0);
  } finally {
    ctrl.close();
  }
  // A thick lvol took its clusters at creation: the lvstore's free space is below its total.
  const total = await scrape("distort_lvstore_total_bytes", {});
  expect(lvsFree0).toBeLessThan(total as number);
  expect(await scrape("distort_spdk_reactor_busy_seconds_total", { lcore: "0" })).toBeGreaterThanOrEqual(0);
}, 120_000);
