// The CSI controller acts on storage.distort.io/rotate-keys against a real kube-apiserver: a new
// generation on a partition rotates its key Secret once and records KeysRotated; a kernel-backend
// partition is refused with a KeyRotationUnsupported Warning and its Secret is left alone.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMePartition } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { realClock } from "../lib/clock.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { kubeVolumeKeyStore, ROTATION_GENERATION_KEY } from "../lib/kube/volume-keys.ts";
import { silentLogger } from "../lib/log.ts";
import { hostKeyPairFrom } from "../lib/nvme/dhchap-keys.ts";
import { ROTATE_KEYS_ANNOTATION } from "./controller/key-rotation.ts";
import { CsiController } from "./controller.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:4d5e6f7a-8b9c-4dae-8f01-2b3c4d5e6f7a";

let tc: TestCluster;
let ns: string;
let controller: CsiController;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("csi-rotate");
  controller = new CsiController({
    conn: tc.conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: 2 ** 30,
    events: new EventRecorder(tc.conn, {
      controller: "storage.distort.io/csi",
      instance: "test",
      logger: silentLogger,
    }),
  });
  await controller.start();
}, 300_000);

afterAll(async () => {
  await controller?.stop();
  await tc?.stop();
});

async function keyedPartition(name: string, backend: "spdk" | "kernel"): Promise<NVMePartition> {
  const p = await new ResourceClient(tc.conn, kinds.NVMePartition).create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name, namespace: ns },
    spec: {
      sizeBytes: 2 ** 30,
      backend,
      volumeManager: "partition",
      targetOptions: {
        transport: "tcp",
        dhchap: { mode: "unidirectional", hash: "sha256", dhgroup: "null", secretName: `dhchap-${name}` },
      },
    },
  } as NVMePartition);
  await kubeVolumeKeyStore(tc.conn).ensureHost(p, `dhchap-${name}`, HOST, "unidirectional", "sha256");
  return p;
}

const annotate = (name: string, generation: string) =>
  new ResourceClient(tc.conn, kinds.NVMePartition).mergePatch(name, ns, {
    metadata: { annotations: { [ROTATE_KEYS_ANNOTATION]: generation } },
  });

const eventFor = (name: string, reason: string) =>
  eventually(
    async () =>
      (await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns })).items.find(
        (e) => e.reason === reason && e.regarding?.name === name,
      ),
    15_000,
    `${reason} Event on ${name}`,
  );

test("a new rotate-keys generation rotates the volume's keys once and records KeysRotated", async () => {
  await keyedPartition("rot-spdk", "spdk");
  const store = kubeVolumeKeyStore(tc.conn);
  const before = hostKeyPairFrom((await store.read(ns, "dhchap-rot-spdk")) ?? {}, HOST);
  await annotate("rot-spdk", "1");
  const after = await eventually(
    async () => {
      const d = (await store.read(ns, "dhchap-rot-spdk")) ?? {};
      return d[ROTATION_GENERATION_KEY] === "1" ? d : undefined;
    },
    15_000,
    "Secret rotated",
  );
  expect(hostKeyPairFrom(after, HOST)?.secret).not.toBe(before?.secret);
  const ev = await eventFor("rot-spdk", "KeysRotated");
  expect(ev.note).toContain("generation 1");
  expect(ev.note).not.toContain(hostKeyPairFrom(after, HOST)?.secret as string);
});

test("a kernel-backend partition is refused with KeyRotationUnsupported; its Secret is unchanged", async () => {
  await keyedPartition("rot-kernel", "kernel");
  const store = kubeVolumeKeyStore(tc.conn);
  const before = await store.read(ns, "dhchap-rot-kernel");
  await annotate("rot-kernel", "1");
  const ev = await eventFor("rot-kernel", "KeyRotationUnsupported");
  expect(ev.type).toBe("Warning");
  expect(await store.read(ns, "dhchap-rot-kernel")).toEqual(before);
});
