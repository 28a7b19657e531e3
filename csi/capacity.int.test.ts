// CSIStorageCapacity end to end below the scheduler: the real external-provisioner in capacity mode
// asks this controller's GetCapacity per topology segment (CSINode topology keys x Node labels)
// over the real socket and publishes one object per segment and class in the real API server.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type RDMAStorageNode } from "../api/index.ts";
import { Controller, Identity } from "../gen/csi/v1/csi_pb.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { ensureSidecars } from "../lab/cluster/tools.ts";
import { realClock } from "../lib/clock.ts";
import { register, serveGrpc } from "../lib/grpc/server.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { CsiController } from "./controller.ts";
import { createIdentityService } from "./identity.ts";

const GiB = 1024 ** 3;
const KEY = "topology.storage.distort.io/fabric";

let tc: TestCluster;
let root: string;
let provisionerBin: string;
const cleanups: (() => unknown)[] = [];

beforeAll(async () => {
  provisionerBin = (await ensureSidecars()).provisioner;
  tc = await testCluster();
  root = await mkdtemp(join(tmpdir(), "distort-capacity-"));
}, 600_000);
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  if (root) await rm(root, { recursive: true, force: true });
  await tc?.stop();
});

async function storageNode(ns: string, name: string, fabric: string): Promise<void> {
  const client = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  const created = await client.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name, namespace: ns, labels: { [KEY]: fabric } },
    spec: { nodeName: name },
  } as RDMAStorageNode);
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  const cond = (type: string) => ({
    type,
    status: "True" as const,
    reason: "Test",
    message: "",
    lastTransitionTime: now,
  });
  await client.replaceStatus({
    ...created,
    status: {
      lastHeartbeatTime: now,
      rdmaIP: "192.0.2.10",
      transport: "rdma",
      conditions: [cond("Ready"), cond("NVMeInventoryReady")],
    },
  });
}

async function device(ns: string, name: string, node: string, freeBytes: number): Promise<void> {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const d = await devices.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDevice",
    metadata: { name },
    spec: {
      nodeName: node,
      pciAddress: "0000:01:00.0",
      serial: name,
      model: "sim",
      allocatableBytes: 100 * GiB,
      numaNode: 0,
    },
  } as NVMeDevice);
  await devices.replaceStatus({
    ...d,
    status: {
      phase: "Claimed",
      claimRef: { namespace: ns, name: "c", uid: "u" },
      freeBytes,
      reservations: [],
      conditions: [],
    },
  });
  cleanups.push(() => devices.delete(name).catch(() => {}));
}

async function setFree(name: string, freeBytes: number): Promise<void> {
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const d = (await devices.get(name)) as NVMeDevice;
  await devices.replaceStatus({
    ...d,
    status: { ...(d.status as NonNullable<NVMeDevice["status"]>), freeBytes },
  });
}

test("the external-provisioner publishes one CSIStorageCapacity per segment: the largest volume one device there can hold", async () => {
  const ns = await tc.namespace("capacity");
  const tag = ns.slice(-8);
  const fa = `a-${tag}`;
  const fb = `b-${tag}`;
  const core = tc.conn.api(k8s.CoreV1Api);
  const storage = tc.conn.api(k8s.StorageV1Api);

  // Two consumer nodes in two segments, registered for the driver with the segment's key.
  for (const [node, fabric] of [
    [`w-a-${tag}`, fa],
    [`w-b-${tag}`, fb],
  ] as const) {
    await core.createNode({ body: { metadata: { name: node, labels: { [KEY]: fabric } } } });
    await storage.createCSINode({
      body: {
        metadata: { name: node },
        spec: { drivers: [{ name: DRIVER_NAME, nodeID: node, topologyKeys: [KEY] }] },
      },
    });
    cleanups.push(() => core.deleteNode({ name: node }).catch(() => {}));
    cleanups.push(() => storage.deleteCSINode({ name: node }).catch(() => {}));
  }
  // Segment a: 30 GiB free over two drives, 20 GiB on the best one. Segment b: one 40 GiB drive.
  await storageNode(ns, `s-a-${tag}`, fa);
  await storageNode(ns, `s-b-${tag}`, fb);
  await device(ns, `d1-${tag}`, `s-a-${tag}`, 10 * GiB);
  await device(ns, `d2-${tag}`, `s-a-${tag}`, 20 * GiB);
  await device(ns, `d3-${tag}`, `s-b-${tag}`, 40 * GiB);
  const sc = `capacity-${tag}`;
  await storage.createStorageClass({
    body: {
      metadata: { name: sc },
      provisioner: DRIVER_NAME,
      volumeBindingMode: "WaitForFirstConsumer",
      parameters: { backend: "spdk" },
    },
  });
  cleanups.push(() => storage.deleteStorageClass({ name: sc }).catch(() => {}));

  const controller = new CsiController({
    conn: tc.conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: GiB,
    events: new EventRecorder(tc.conn, {
      controller: "storage.distort.io/csi",
      instance: "t",
      logger: silentLogger,
    }),
  });
  const socketPath = join(root, "csi.sock");
  const server = await serveGrpc({
    socketPath,
    services: [
      register(
        Identity,
        createIdentityService({
          vendorVersion: "test",
          controllerService: true,
          readiness: [() => controller.notReadyReason()],
          logger: silentLogger,
        }),
      ),
      register(Controller, controller.service()),
    ],
    logger: silentLogger,
  });
  await controller.start();
  cleanups.push(
    () => server.close(),
    () => controller.stop(),
  );
  const log = Bun.file(join(root, "provisioner.log"));
  const proc = Bun.spawn(
    [
      provisionerBin,
      `--csi-address=${socketPath}`,
      `--kubeconfig=${tc.kubeconfigPath}`,
      "--enable-capacity",
      // No Pod runs this process: the objects get no owner (the chart's Deployment owns them).
      "--capacity-ownerref-level=-1",
      "--capacity-poll-interval=2s",
      "--extra-create-metadata",
    ],
    { env: { ...process.env, NAMESPACE: ns }, stdout: log, stderr: log },
  );
  cleanups.push(async () => {
    proc.kill();
    await proc.exited;
  });

  type Seen = Record<string, { capacity?: string; maximum?: string }>;
  const published = async (): Promise<Seen> => {
    const list = await storage.listNamespacedCSIStorageCapacity({ namespace: ns });
    const out: Seen = {};
    for (const c of list.items) {
      if (c.storageClassName !== sc) continue;
      // Other tests' nodes share this API server (a CSINode without the fabric key is a segment
      // of its own to the provisioner); only this test's two segments are its to check.
      const fabric = c.nodeTopology?.matchLabels?.[KEY] ?? "(none)";
      if (fabric !== fa && fabric !== fb) continue;
      out[fabric] = {
        capacity: c.capacity?.toString(),
        maximum: c.maximumVolumeSize?.toString(),
      };
    }
    return out;
  };
  const want = (a: string, b: string): Seen => ({
    [fa]: { capacity: a, maximum: a },
    [fb]: { capacity: b, maximum: b },
  });
  const diagnose = async () => `provisioner log:\n${(await log.text()).slice(-3000)}`;
  const reach = async (expected: Seen, what: string) => {
    try {
      await eventually(async () => Bun.deepEquals(await published(), expected), 60_000, what);
    } catch (err) {
      throw new Error(`${String(err)}; last seen ${JSON.stringify(await published())}\n${await diagnose()}`);
    }
  };
  // The provisioner writes quantities as the API server canonicalises them (binary SI).
  await reach(want("20Gi", "40Gi"), "one object per segment: 20Gi in a (not the 30Gi sum), 40Gi in b");
  expect(await published()).toEqual(want("20Gi", "40Gi"));

  // A drive filling up in b shows at the next poll; a is unchanged.
  await setFree(`d3-${tag}`, 6 * GiB);
  await reach(want("20Gi", "6Gi"), "segment b shrinking to 6Gi");
  expect(await published()).toEqual(want("20Gi", "6Gi"));
}, 180_000);
