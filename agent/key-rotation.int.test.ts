// DH-HMAC-CHAP key rotation end to end on the agent, the nvmf_tgt emulator and the simulated
// fabric: a host connected with the old keys keeps doing I/O through the rotation, a new connect
// with the old keys is refused, one with the new keys is admitted, and the old keys leave the node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kinds, type NVMeVolumeAttachment } from "../api/index.ts";
import { ROTATE_KEYS_ANNOTATION, rotateKeysIfAsked } from "../csi/controller/key-rotation.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import {
  connectController,
  createFabric,
  FabricConnectError,
  type UnixSimFabric,
} from "../lab/sim/spdk/fabric.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { kubeVolumeKeyStore, ROTATION_GENERATION_KEY } from "../lib/kube/volume-keys.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { hostKeyPairFrom } from "../lib/nvme/dhchap-keys.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor } from "../lib/volume-identity.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";

const GiB = 1024 ** 3;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f";
const HOSTID = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f";
const SECRET = "dhchap-rotation";

let tc: TestCluster;
let fabric: UnixSimFabric;
let node: SimStorageNode;
let agent: RunningAgent;
let spdk: SpdkClient;
let fabricDir: string;
let ns: string;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("key-rotation");
  fabricDir = mkdtempSync(join(tmpdir(), "distort-rot-"));
  fabric = createFabric(join(fabricDir, "f"));
  node = await startSimStorageNode({
    nodeName: "node-rot",
    drives: [{ serial: "SIMROT01", pciAddress: "0000:3d:00.0", sizeBytes: 2 * GiB }],
    fabric,
  });
  agent = await runAgent(
    parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns)),
    createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }),
  );
  spdk = new SpdkClient({ socketPath: node.spdkSocket, logger: silentLogger });
}, 300_000);

afterAll(async () => {
  await spdk?.close();
  await agent?.stop();
  await node?.close();
  await tc?.stop();
  if (fabricDir) rmSync(fabricDir, { recursive: true, force: true });
});

test("rotation: the connected host's I/O continues, the old keys are refused at connect, the new ones admitted", async () => {
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const m = new SpdkMethods(spdk);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMROT01"),
    15_000,
    "NVMeDevice reported",
  );
  const claim = await claimDevice(tc.conn, device, ns);
  const want = placedPartition("rot", ns, device, claim, 64 * 1024 * 1024);
  want.spec.targetOptions = {
    transport: "tcp",
    dhchap: { mode: "bidirectional", hash: "sha256", dhgroup: "null", secretName: SECRET },
  };
  const created = await createPlaced(tc.conn, want, device);
  const uid = created.metadata.uid as string;
  // What ControllerPublish does: the host's pair in the volume's Secret, then the attachment.
  const store = kubeVolumeKeyStore(tc.conn);
  await store.ensureHost(created, SECRET, HOST, "bidirectional", "sha256");
  const exported = await eventually(
    async () => {
      const p = await parts.get("rot", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "Exported",
  );
  const nqn = exported.status?.nqn as string;
  const vaName = attachmentNameFor("rot", uid);
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "rot",
      partitionUID: uid,
      nodeId: "worker-1",
      hostNQN: HOST,
      attachmentId: "att-1",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
    20_000,
    "AccessReady",
  );
  const hostEntry = async () => (await m.nvmfGetSubsystems(nqn))[0]?.hosts.find((h) => h.nqn === HOST);
  const before = await hostEntry();
  expect(before?.dhchap_key).toBeString();
  expect(before?.dhchap_ctrlr_key).toBeString();
  const oldPair = hostKeyPairFrom((await store.read(ns, SECRET)) ?? {}, HOST);
  if (!oldPair?.ctrlSecret) throw new Error("no bidirectional pair in the Secret");
  const connect = (pair: { secret: string; ctrlSecret?: string }) =>
    connectController(fabric, {
      trtype: "TCP",
      traddr: "127.0.0.1",
      trsvcid: "4420",
      subnqn: nqn,
      hostnqn: HOST,
      hostid: HOSTID,
      dhchap: { secret: pair.secret, ...(pair.ctrlSecret ? { ctrlSecret: pair.ctrlSecret } : {}) },
    });

  // A connected host writing and reading back blocks the whole time (bounded in count and time).
  const live = await connect(oldPair);
  const io = { done: 0, errors: [] as string[], stop: false };
  const deadline = Date.now() + 90_000;
  const loop = (async () => {
    for (let i = 0; !io.stop && i < 200_000 && Date.now() < deadline; i++) {
      const data = Buffer.alloc(4096, i % 251);
      const at = (i % 64) * 4096;
      try {
        await live.write(1, at, data);
        if (!(await live.read(1, at, 4096)).equals(data)) io.errors.push(`block ${i}: read back differs`);
        io.done++;
      } catch (err) {
        io.errors.push(String(err));
        return;
      }
    }
  })();
  try {
    await eventually(() => io.done >= 20 || io.errors.length > 0, 20_000, "I/O running");

    // The operator asks for a rotation; the CSI controller acts on it (as CsiController does on
    // the annotation) and the agent's next pass swaps the keys in.
    const annotated = await parts.mergePatch("rot", ns, {
      metadata: { annotations: { [ROTATE_KEYS_ANNOTATION]: "1" } },
    });
    expect((await rotateKeysIfAsked(annotated, { keys: store, logger: silentLogger })).action).toBe("rotate");
    const data = (await store.read(ns, SECRET)) ?? {};
    expect(data[ROTATION_GENERATION_KEY]).toBe("1");
    const newPair = hostKeyPairFrom(data, HOST);
    expect(newPair?.secret).not.toBe(oldPair.secret);
    expect(newPair?.ctrlSecret).not.toBe(oldPair.ctrlSecret);
    const after = await eventually(
      async () => {
        const h = await hostEntry();
        return h && h.dhchap_key !== before?.dhchap_key && h.dhchap_ctrlr_key !== before?.dhchap_ctrlr_key
          ? h
          : undefined;
      },
      30_000,
      "new keys installed on the target",
    );
    // The old keys leave the keyring (nothing uses them once swapped out), the new ones stay.
    const names = await eventually(
      async () => {
        const n = (await m.keyringGetKeys()).map((k) => k.name);
        return n.includes(before?.dhchap_key as string) || n.includes(before?.dhchap_ctrlr_key as string)
          ? undefined
          : n;
      },
      20_000,
      "old keys collected",
    );
    expect(names).toEqual(expect.arrayContaining([after.dhchap_key, after.dhchap_ctrlr_key]));

    // The connected host went on: more I/O after the swap, none failed.
    const atSwap = io.done;
    await eventually(() => io.done >= atSwap + 20 || io.errors.length > 0, 20_000, "I/O after the rotation");
    expect(io.errors).toEqual([]);
    expect((await m.nvmfSubsystemGetControllers(nqn)).filter((c) => c.hostnqn === HOST)).toHaveLength(1);

    // A new connect with the old keys is refused; with the new keys it is admitted and does I/O.
    const refused = await connect(oldPair).then(
      (c) => {
        c.close();
        return undefined;
      },
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(FabricConnectError);
    const fresh = await connect(newPair as { secret: string; ctrlSecret?: string });
    try {
      const block = Buffer.alloc(4096, 0xa5);
      await fresh.write(1, 100 * 4096, block);
      expect((await fresh.read(1, 100 * 4096, 4096)).equals(block)).toBe(true);
    } finally {
      fresh.close();
    }
    // The same generation again changes nothing.
    await rotateKeysIfAsked(annotated, { keys: store, logger: silentLogger });
    expect(hostKeyPairFrom((await store.read(ns, SECRET)) ?? {}, HOST)).toEqual(newPair);
  } finally {
    io.stop = true;
    await loop;
    live.close();
  }
  expect(io.errors).toEqual([]);
}, 180_000);
