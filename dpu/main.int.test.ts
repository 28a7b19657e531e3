// The distort-dpu binary as a process: configured by environment only, against a real
// kube-apiserver (Node registration of the host NQN read from its file, the DH-HMAC-CHAP Secret)
// and the SNAP/target emulators; a SIGKILL leaves a stale socket that the next start replaces,
// records survive it, and SIGTERM exits cleanly.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { Identity as CsiIdentity, Node as CsiNode } from "../gen/csi/v1/csi_pb.ts";
import {
  AccessMode,
  IdentityService,
  StoragePluginService,
} from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { type SpdkEmulator, startSpdkEmulator } from "../lab/sim/spdk/emulator.ts";
import { createFabric } from "../lab/sim/spdk/fabric.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { LEGACY_HOST_NQN_ANNOTATION } from "../lib/kube/node-directory.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { VolumeContextKeys } from "../lib/volume-context.ts";
import { namesFor } from "./devices/names.ts";
import { StorageParameterKeys } from "./devices/request.ts";
import { exportOnTarget } from "./testing.ts";

const MAIN = join(import.meta.dir, "main.ts");
const HOST = "nqn.2014-08.org.nvmexpress:uuid:0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9";
// A valid DH-HMAC-CHAP secret (nvme gen-dhchap-key; check-dhchap-key: CRC ff1c9c56): the target now
// authenticates the initiator with it.
const SECRET = "DHHC-1:00:9gb8PYK0rmteVJT0wi+Kpv1Z5AXoNQAD0KKp/JiQgzNWnBz/:";

let tc: TestCluster;
let ns: string;
let nodeName: string;
let root: string;
let target: SpdkEmulator;
let snap: SpdkEmulator;
let targetClient: SpdkClient;

function spawnPlugin() {
  return Bun.spawn([process.execPath, MAIN], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      KUBECONFIG: tc.kubeconfigPath,
      NODE_NAME: nodeName,
      POD_NAMESPACE: ns,
      DISTORT_DPU_SOCKET: join(root, "plugins", "distort", "dpu.sock"),
      DISTORT_DPU_CSI_SOCKET: join(root, "csi", "csi.sock"),
      DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
      DISTORT_DPU_HOST_NQN_FILE: join(root, "hostnqn"),
      DISTORT_DPU_STATE_DIR: join(root, "state"),
      DISTORT_DPU_KEY_DIR: join(root, "keys"),
      DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
      DISTORT_HEALTH_HOST: "127.0.0.1",
      DISTORT_HEALTH_PORT: "0",
      DISTORT_LOG_LEVEL: "error",
    },
    stdout: "ignore",
    stderr: "inherit",
  });
}

async function readyClient(): Promise<GrpcJsClient> {
  const c = new GrpcJsClient(`unix://${join(root, "plugins", "distort", "dpu.sock")}`);
  await eventually(
    async () => (await c.unary(IdentityService.method.probe, {}, { timeoutMs: 1000 })).ready === true,
    20_000,
    "plugin ready",
  );
  return c;
}

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("dpu");
  nodeName = `dpu-${ns}`;
  const core = tc.conn.api(k8s.CoreV1Api);
  await core.createNode({ body: { metadata: { name: nodeName } } });
  await core.createNamespacedSecret({
    namespace: ns,
    body: { metadata: { name: "dpu-chap" }, stringData: { secret: SECRET } },
  });
  root = mkdtempSync(join(tmpdir(), "dpubin-"));
  writeFileSync(join(root, "hostnqn"), `${HOST}\n`);
  const fabric = createFabric(join(root, "f"));
  target = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "S5E", model: "Sim", sizeBytes: 64 * 1024 * 1024 }],
  });
  snap = await startSpdkEmulator({ socketPath: join(root, "snap.sock"), dataDir: join(root, "s"), fabric });
  targetClient = new SpdkClient({ socketPath: target.socketPath, logger: silentLogger });
}, 120_000);

afterAll(async () => {
  await tc.conn
    .api(k8s.CoreV1Api)
    .deleteNode({ name: nodeName })
    .catch(() => {});
  await targetClient.close();
  await snap.close();
  await target.close();
  await tc.stop();
  rmSync(root, { recursive: true, force: true });
});

test("reports its host NQN in its CSI node ID (nothing written on its Node), attaches with the Secret's key, survives SIGKILL, stops on SIGTERM", async () => {
  const tm = new SpdkMethods(targetClient);
  await tm.bdevNvmeAttachController({ name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  await tm.bdevLvolCreateLvstore({ bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  const lvol = await tm.bdevLvolCreate({
    lvs_name: "lvs0",
    lvol_name: "v1",
    size_in_mib: 8,
    thin_provision: true,
  });
  writeFileSync(join(root, "tkey"), SECRET, { mode: 0o600 });
  await tm.keyringFileAddKey({ name: "tkey", path: join(root, "tkey") });
  const nqn = "nqn.2026-02.io.distort:bin-1";
  await exportOnTarget(tm, {
    nqn,
    bdevName: lvol,
    listeners: [{ trtype: "TCP", adrfam: "ipv4", traddr: "10.40.0.1", trsvcid: "4420" }],
    hosts: [{ nqn: HOST, dhchapKey: "tkey" }],
  });

  let proc = spawnPlugin();
  let client = await readyClient();
  // kubelet (through the registrar) asks the CSI socket for the node ID it stores in CSINode.
  const csi = new GrpcJsClient(`unix://${join(root, "csi", "csi.sock")}`);
  try {
    expect((await csi.unary(CsiIdentity.method.getPluginInfo, {})).name).toBe("storage.distort.io");
    expect((await csi.unary(CsiIdentity.method.probe, {})).ready).toBe(true);
    expect((await csi.unary(CsiNode.method.nodeGetInfo, {})).nodeId).toBe(`${nodeName}/${HOST}`);
    expect((await csi.unary(CsiNode.method.nodeGetCapabilities, {})).capabilities).toEqual([]);
  } finally {
    csi.close();
  }
  const node = await tc.conn.api(k8s.CoreV1Api).readNode({ name: nodeName });
  expect(node.metadata?.annotations?.[LEGACY_HOST_NQN_ANNOTATION]).toBeUndefined();

  const req = {
    volumeId: "bin-vol",
    accessModes: [AccessMode.RWO],
    volumeMode: "Block",
    volumeContext: {
      [VolumeContextKeys.nqn]: nqn,
      [VolumeContextKeys.portalIP]: "10.40.0.1",
      [VolumeContextKeys.portalPort]: "4420",
      [VolumeContextKeys.transport]: "tcp",
    },
    storageParameters: {
      [StorageParameterKeys.dhchapSecretName]: "dpu-chap",
      [StorageParameterKeys.dhchapSecretKey]: "secret",
    },
  };
  const { deviceName } = await client.unary(StoragePluginService.method.createDevice, req);
  expect(deviceName).toBe(namesFor("bin-vol").bdev);
  expect(snap.state().keys.map((k) => k.name)).toEqual([namesFor("bin-vol").key]);
  expect(snap.state().nvmeControllers.map((c) => c.hostnqn)).toEqual([HOST]);

  // Killed: the socket file stays behind, stale; the next process replaces it and knows the device.
  client.close();
  proc.kill("SIGKILL");
  await proc.exited;
  expect(statSync(join(root, "plugins", "distort", "dpu.sock")).isSocket()).toBe(true);
  proc = spawnPlugin();
  client = await readyClient();
  const d = await client.unary(StoragePluginService.method.getDevice, { volumeId: "bin-vol", deviceName });
  expect(d.storageParameters).toEqual(req.storageParameters);
  expect((await client.unary(StoragePluginService.method.createDevice, req)).deviceName).toBe(deviceName);
  await client.unary(StoragePluginService.method.deleteDevice, { volumeId: "bin-vol", deviceName });
  expect(snap.state().nvmeControllers).toEqual([]);
  expect(snap.state().keys).toEqual([]);

  client.close();
  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
}, 60_000);

test("a missing host NQN file stops the binary at start with a clear message", async () => {
  const proc = Bun.spawn([process.execPath, MAIN], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      DISTORT_DPU_SOCKET: join(root, "other.sock"),
      DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
      DISTORT_DPU_HOST_NQN_FILE: join(root, "missing-hostnqn"),
      DISTORT_DPU_STATE_DIR: join(root, "state2"),
      DISTORT_HEALTH_PORT: "0",
    },
    stdout: "ignore",
    stderr: "pipe",
  });
  expect(await proc.exited).toBe(1);
  expect(await new Response(proc.stderr).text()).toContain("cannot read the host NQN");
  const bad = Bun.spawn([process.execPath, MAIN], {
    env: { DISTORT_LOG_LEVEL: "loud" },
    stderr: "pipe",
    stdout: "ignore",
  });
  expect(await bad.exited).toBe(2);
  expect(await new Response(bad.stderr).text()).toContain("DISTORT_LOG_LEVEL");
});
