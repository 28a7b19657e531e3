// The DPU path as DPF drives it: a PVC provisioned by the real external-provisioner, published to
// the DPU's node through the CSI controller (NVIDIA's attacher's call), attached into SNAP by the
// vendor plugin (the SNAP node driver's calls), bytes through SNAP, then detached and unpublished.
// On the real cluster the plugin is the chart's dpu DaemonSet on node-d under its kubelet, SNAP the
// lab's stand-in beside it (lab/cluster/dpu-node.ts), and the fabric TCP between node IPs.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { status as GrpcStatus } from "@grpc/grpc-js";
import * as k8s from "@kubernetes/client-node";
import { namesFor } from "../dpu/devices/names.ts";
import { exportOnTarget } from "../dpu/testing.ts";
import {
  Controller,
  ControllerServiceCapability_RPC_Type as ControllerCap,
  VolumeCapability_AccessMode_Mode as Mode,
} from "../gen/csi/v1/csi_pb.ts";
import {
  AccessMode,
  StoragePluginServiceCapability_RPC_Type as PluginCap,
  StoragePluginService,
} from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { connectController, createTcpFabric, type FabricController } from "../lab/sim/spdk/fabric.ts";
import { patternBytes } from "../lab/workload.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { LEGACY_HOST_NQN_ANNOTATION } from "../lib/kube/node-directory.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { PublishContextKeys, VolumeContextKeys } from "../lib/volume-context.ts";
import { quantityBytes, type VolumeCapabilityInit } from "./kubelet/volume-spec.ts";
import { deletePod, type E2eLab, e2eLab, until, waitWorkload } from "./support.ts";
import { blockWorkloadPod } from "./user-steps.ts";

const MiB = 1024 * 1024;
/** What the test writes through SNAP and a consumer Pod reads back. */
const DATA_BYTES = 4 * MiB;
/** Fabric frames are buffered whole; moderate chunks keep each one cheap. */
const IO_CHUNK = 256 * 1024;

let lab: E2eLab;
let dpu: NonNullable<E2eLab["dpu"]>;
let ns: string;
let csi: GrpcJsClient;
let plugin: GrpcJsClient;
let snapClient: SpdkClient;
let snap: SpdkMethods;
const targets: { node: string; client: SpdkClient; m: SpdkMethods }[] = [];
/** Volumes this file may have left published to the DPU or attached in SNAP, for afterAll. */
const touched = new Set<string>();
/** Host-facing subsystems this file created in SNAP. */
const hostSubsystems = new Set<string>();

beforeAll(async () => {
  lab = await e2eLab();
  if (!lab.dpu) throw new Error("the lab runs no DPU node");
  dpu = lab.dpu;
  ns = await lab.newNamespace("dpu");
  csi = new GrpcJsClient(`unix://${lab.csiControllerSocket}`);
  plugin = new GrpcJsClient(`unix://${dpu.pluginSocket}`);
  snapClient = new SpdkClient({ socketPath: dpu.snapSocket, logger: silentLogger });
  snap = new SpdkMethods(snapClient);
  for (const s of lab.storage) {
    const client = new SpdkClient({ socketPath: s.spdkSocket, logger: silentLogger });
    targets.push({ node: s.name, client, m: new SpdkMethods(client) });
  }
}, 600_000);

afterAll(async () => {
  // Leave the shared lab as it was even after a failure: SNAP, the plugin and the ACLs.
  for (const nqn of hostSubsystems) await snap?.nvmfDeleteSubsystem(nqn).catch(() => {});
  for (const volumeId of touched) {
    const { bdev } = namesFor(volumeId);
    await plugin
      ?.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName: bdev })
      .catch(() => {});
    await csi
      ?.unary(
        Controller.method.controllerUnpublishVolume,
        { volumeId, nodeId: dpu.name },
        { timeoutMs: 60_000 },
      )
      .catch(() => {});
  }
  if (ns) await lab.core.deleteNamespace({ name: ns }).catch(() => {});
  csi?.close();
  plugin?.close();
  await snapClient?.close();
  for (const t of targets) await t.client.close();
  await lab?.stop();
}, 180_000);

/** A Block PVC of the Immediate class, bound by the external-provisioner; returns its PV. */
async function blockVolume(name: string): Promise<k8s.V1PersistentVolume> {
  await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        accessModes: ["ReadWriteOnce"],
        volumeMode: "Block",
        storageClassName: "distort-lab-immediate",
        resources: { requests: { storage: "1Gi" } },
      },
    },
  });
  const pvName = await until(`PVC ${ns}/${name} bound`, async () => {
    const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name, namespace: ns });
    return pvc.status?.phase === "Bound" ? pvc.spec?.volumeName : undefined;
  });
  const pv = await lab.core.readPersistentVolume({ name: pvName });
  if (!pv.spec?.csi?.volumeHandle) throw new Error(`PV ${pvName} has no CSI volume handle`);
  touched.add(pv.spec.csi.volumeHandle);
  return pv;
}

let singleNodeMultiWriter: boolean | undefined;

/**
 * The volume_capability the external-attacher (and NVIDIA's drop-in replacement of it) derives
 * from a PV: block or mount by volumeMode; ReadWriteOnce is SINGLE_NODE_MULTI_WRITER when the
 * controller offers that capability, else SINGLE_NODE_WRITER.
 */
async function attacherCapability(pv: k8s.V1PersistentVolume): Promise<VolumeCapabilityInit> {
  if (singleNodeMultiWriter === undefined) {
    const caps = await csi.unary(Controller.method.controllerGetCapabilities, {});
    singleNodeMultiWriter = caps.capabilities.some(
      (c) => c.type.case === "rpc" && c.type.value.type === ControllerCap.SINGLE_NODE_MULTI_WRITER,
    );
  }
  const modes = pv.spec?.accessModes ?? [];
  if (modes.length !== 1 || modes[0] !== "ReadWriteOnce")
    throw new Error(`access modes ${modes} not mapped here`);
  const accessMode = {
    mode: singleNodeMultiWriter ? Mode.SINGLE_NODE_MULTI_WRITER : Mode.SINGLE_NODE_WRITER,
  };
  if (pv.spec?.volumeMode === "Block") return { accessMode, accessType: { case: "block", value: {} } };
  return {
    accessMode,
    accessType: {
      case: "mount",
      value: { fsType: pv.spec?.csi?.fsType ?? "", mountFlags: [...(pv.spec?.mountOptions ?? [])] },
    },
  };
}

/** ControllerPublishVolume for the DPU's node, as NVIDIA's attacher calls it for an SVVolumeAttachment. */
async function publishToDpu(pv: k8s.V1PersistentVolume) {
  const src = pv.spec?.csi as k8s.V1CSIPersistentVolumeSource;
  return csi.unary(
    Controller.method.controllerPublishVolume,
    {
      volumeId: src.volumeHandle,
      nodeId: dpu.name,
      volumeCapability: await attacherCapability(pv),
      readonly: src.readOnly ?? false,
      volumeContext: src.volumeAttributes ?? {},
    },
    { timeoutMs: 90_000 },
  );
}

function unpublishFromDpu(volumeId: string) {
  return csi.unary(
    Controller.method.controllerUnpublishVolume,
    { volumeId, nodeId: dpu.name },
    { timeoutMs: 90_000 },
  );
}

/** CreateDevice as the SNAP node driver sends it for a Block volume of the host cluster. */
function createDevice(pv: k8s.V1PersistentVolume, publishContext: Record<string, string>) {
  const src = pv.spec?.csi as k8s.V1CSIPersistentVolumeSource;
  return plugin.unary(StoragePluginService.method.createDevice, {
    volumeId: src.volumeHandle,
    accessModes: [AccessMode.RWO],
    volumeMode: "Block",
    publishContext,
    volumeContext: src.volumeAttributes ?? {},
    // DPF passes the policy's parameters and its own keys; the plugin ignores what is not its.
    storageParameters: { policy: "distort-e2e" },
  });
}

/** The gRPC status code and message of a call that must fail. */
async function failure(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (err) {
    if (err instanceof GrpcCallError) return { code: err.code, details: err.details };
    throw err;
  }
  throw new Error("the call succeeded");
}

/** The storage node exporting `nqn`, with the subsystem as its target reports it now. */
async function targetOf(nqn: string) {
  for (const t of targets) {
    const sub = (await t.m.nvmfGetSubsystems()).find((s) => s.nqn === nqn);
    if (sub) return { ...t, sub };
  }
  throw new Error(`no storage node exports ${nqn}`);
}

const aclOf = async (nqn: string) => (await targetOf(nqn)).sub.hosts.map((h) => h.nqn);

const ourController = async (volumeId: string) =>
  (await snap.bdevNvmeGetControllers()).find((c) => c.name === namesFor(volumeId).controller);

/**
 * SNAP showing `bdev` to the host: real SNAP creates an emulated NVMe controller on the PCIe bus;
 * the SNAP emulator has no PCIe side, so its NVMe-oF target stands in, exporting the bdev on the
 * lab's fabric (on the cluster: TCP on the DPU's node IP) where the test plays the host. Either
 * way SNAP claims the bdev.
 */
async function exposeToHost(bdev: string): Promise<{ nqn: string; ctrl: FabricController }> {
  const nqn = `nqn.2026-02.io.distort.e2e:snap-host-${randomBytes(4).toString("hex")}`;
  const hostNqn = `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}`;
  const listener = {
    trtype: "TCP" as const,
    adrfam: "ipv4" as const,
    traddr: dpu.address,
    trsvcid: String(20000 + (randomBytes(2).readUInt16BE() % 20000)),
  };
  hostSubsystems.add(nqn);
  await exportOnTarget(snap, { nqn, bdevName: bdev, listeners: [listener], hosts: [{ nqn: hostNqn }] });
  const fabric = createTcpFabric();
  const ctrl = await connectController(fabric, {
    ...listener,
    subnqn: nqn,
    hostnqn: hostNqn,
    hostid: randomUUID(),
  });
  return { nqn, ctrl };
}

async function writeAll(ctrl: FabricController, data: Buffer): Promise<void> {
  for (let off = 0; off < data.length; off += IO_CHUNK)
    await ctrl.write(1, off, data.subarray(off, off + IO_CHUNK));
}

async function readAll(ctrl: FabricController, length: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  for (let off = 0; off < length; off += IO_CHUNK)
    parts.push(await ctrl.read(1, off, Math.min(IO_CHUNK, length - off)));
  return Buffer.concat(parts);
}

test("a CSI volume reaches SNAP through the DPU plugin as the DPU's host NQN; its bytes reach a consumer Pod after detach", async () => {
  // kubelet stored the DPU's node ID, host NQN included, in its CSINode (the plugin writes nothing
  // on its Node); ControllerPublish admits exactly that NQN.
  const node = await lab.core.readNode({ name: dpu.name });
  expect(node.metadata?.annotations?.[LEGACY_HOST_NQN_ANNOTATION]).toBeUndefined();
  const csiNode = await lab.conn.api(k8s.StorageV1Api).readCSINode({ name: dpu.name });
  expect(csiNode.spec.drivers?.find((d) => d.name === "storage.distort.io")?.nodeID).toBe(
    `${dpu.name}/${dpu.hostNqn}`,
  );
  const caps = await plugin.unary(StoragePluginService.method.storagePluginGetCapabilities, {});
  expect(caps.capabilities.map((c) => c.type.value?.type)).toContain(PluginCap.CREATE_DELETE_BLOCK_DEVICE);

  const pv = await blockVolume("via-dpu");
  const src = pv.spec?.csi as k8s.V1CSIPersistentVolumeSource;
  const volumeId = src.volumeHandle;
  const nqn = src.volumeAttributes?.[VolumeContextKeys.nqn] as string;
  // Every path the volume context lists (the lab's storage nodes have two portals), else the one.
  const attrs = src.volumeAttributes ?? {};
  const portals = (
    attrs[VolumeContextKeys.portals] ??
    `${attrs[VolumeContextKeys.portalIP]}:${attrs[VolumeContextKeys.portalPort]}`
  )
    .split(",")
    .map((p) => ({ traddr: p.slice(0, p.lastIndexOf(":")), trsvcid: p.slice(p.lastIndexOf(":") + 1) }));
  expect(nqn).toBeString();
  // Provisioned, but nobody is admitted yet.
  expect(await aclOf(nqn)).toEqual([]);

  // NVIDIA's attacher: ControllerPublishVolume for the DPU node.
  const published = await publishToDpu(pv);
  expect(published.publishContext[PublishContextKeys.hostNQN]).toBe(dpu.hostNqn);
  expect(published.publishContext[PublishContextKeys.attachmentId]).toBeString();
  expect(await aclOf(nqn)).toEqual([dpu.hostNqn]);

  // The SNAP node driver: CreateDevice with the publish context; a retry is the same device.
  const { deviceName } = await createDevice(pv, published.publishContext);
  expect(deviceName).toBe(namesFor(volumeId).bdev);
  expect((await createDevice(pv, published.publishContext)).deviceName).toBe(deviceName);
  const listed = await plugin.unary(StoragePluginService.method.listDevices, { maxEntries: 100 });
  expect(listed.entries.map((e) => [e.volumeId, e.deviceName])).toContainEqual([volumeId, deviceName]);
  const got = await plugin.unary(StoragePluginService.method.getDevice, { volumeId, deviceName });
  expect(got.volumeMode).toBe("Block");
  expect(got.publishContext).toEqual(published.publishContext);

  // SNAP: one NVMe-oF controller to the volume's subsystem, a path per portal, connected as the DPU...
  const ctrlr = await ourController(volumeId);
  const byAddress = (a: { trid: { traddr?: string } }, b: { trid: { traddr?: string } }) =>
    String(a.trid.traddr).localeCompare(String(b.trid.traddr));
  expect(ctrlr?.ctrlrs.map((c) => ({ trid: c.trid, hostnqn: c.host?.nqn })).sort(byAddress)).toEqual(
    [...portals]
      .sort((a, b) => a.traddr.localeCompare(b.traddr))
      .map((p) => ({
        trid: expect.objectContaining({ trtype: "TCP", subnqn: nqn, ...p }),
        hostnqn: dpu.hostNqn,
      })),
  );
  // ...whose namespace is the bdev SNAP hands out, the volume's full size...
  const [bdev] = await snap.bdevGetBdevs({ name: deviceName });
  expect(bdev?.driver_specific?.nvme?.[0]?.trid.subnqn).toBe(nqn);
  expect((bdev?.num_blocks ?? 0) * (bdev?.block_size ?? 0)).toBe(
    Number(quantityBytes(pv.spec?.capacity?.storage ?? "0")),
  );
  // ...and the storage node's target sees that connection from the DPU's host NQN.
  const target = await targetOf(nqn);
  expect((await target.m.nvmfSubsystemGetControllers(nqn)).map((c) => c.hostnqn)).toEqual(
    portals.map(() => dpu.hostNqn),
  );

  // Bytes through SNAP: the host writes the pattern on SNAP's device and reads it back.
  const seed = `dpu-e2e-${randomBytes(4).toString("hex")}`;
  const data = patternBytes(seed, DATA_BYTES);
  const host = await exposeToHost(deviceName);
  try {
    await writeAll(host.ctrl, data);
    expect((await readAll(host.ctrl, DATA_BYTES)).equals(data)).toBe(true);

    // DPF deletes the device from SNAP before DeleteDevice; while SNAP still shows it, the plugin refuses.
    const busy = await failure(
      plugin.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName }),
    );
    expect(busy.code).toBe(GrpcStatus.FAILED_PRECONDITION);
    expect(await ourController(volumeId)).toBeDefined();
  } finally {
    host.ctrl.close();
    await snap.nvmfDeleteSubsystem(host.nqn);
    hostSubsystems.delete(host.nqn);
  }

  // Detach: DeleteDevice leaves nothing of the volume in SNAP; the target loses the DPU's connection.
  await plugin.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName });
  expect(await ourController(volumeId)).toBeUndefined();
  expect(await snap.bdevGetBdevs({ name: deviceName }).catch(() => [])).toEqual([]);
  const after = await plugin.unary(StoragePluginService.method.listDevices, { maxEntries: 100 });
  expect(after.entries.map((e) => e.volumeId)).not.toContain(volumeId);
  await until("the target to drop the DPU's controller", async () =>
    (await target.m.nvmfSubsystemGetControllers(nqn)).every((c) => c.hostnqn !== dpu.hostNqn),
  );

  // ControllerUnpublish answers only once the agent revoked the ACL: the DPU is out at once...
  await unpublishFromDpu(volumeId);
  expect(await aclOf(nqn)).not.toContain(dpu.hostNqn);
  // ...and the fabric enforces it: SNAP's attach is refused by the target now.
  const refused = await failure(createDevice(pv, published.publishContext));
  expect(refused.code).toBe(GrpcStatus.FAILED_PRECONDITION);
  expect(refused.details).toContain(dpu.hostNqn);
  expect(await ourController(volumeId)).toBeUndefined();
  await plugin.unary(StoragePluginService.method.deleteDevice, { volumeId, deviceName });
  touched.delete(volumeId);

  // A consumer Pod on a worker node reads what the host wrote through SNAP, byte for byte.
  const worker = lab.consumers[0]?.name as string;
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: blockWorkloadPod("reader", worker, "via-dpu", [
      "verify",
      `--bytes=${DATA_BYTES}`,
      `--seed=${seed}`,
    ]),
  });
  const read = await waitWorkload(lab, ns, "reader");
  expect(read).toMatchObject({ ok: true, bytes: DATA_BYTES });
  expect(read.sha256).toBe(createHash("sha256").update(data).digest("hex"));
  await deletePod(lab, ns, "reader");
}, 400_000);

test("a volume published to a worker is refused to the DPU (single writer) until the worker lets go", async () => {
  const pv = await blockVolume("held");
  const src = pv.spec?.csi as k8s.V1CSIPersistentVolumeSource;
  const volumeId = src.volumeHandle;
  const nqn = src.volumeAttributes?.[VolumeContextKeys.nqn] as string;
  const holder = lab.consumers[1]?.name ?? (lab.consumers[0]?.name as string);

  // A Pod on a worker holds the volume: the real attacher published it there.
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: blockWorkloadPod("holder", holder, "held", ["hold"]),
  });
  const va = await until(`the volume attached to ${holder} and the Pod running`, async () => {
    const pod = await lab.core.readNamespacedPod({ name: "holder", namespace: ns });
    if (pod.status?.phase === "Failed") throw new Error(`holder failed: ${pod.status.message}`);
    if (pod.status?.phase !== "Running") return undefined;
    const vas = await lab.storageApi.listVolumeAttachment();
    return vas.items.find(
      (a) =>
        a.spec.source.persistentVolumeName === pv.metadata?.name &&
        a.spec.nodeName === holder &&
        a.status?.attached,
    );
  });
  const workerNqn = va.status?.attachmentMetadata?.[PublishContextKeys.hostNQN] as string;
  expect(workerNqn).toBeString();
  expect(workerNqn).not.toBe(dpu.hostNqn);
  expect(await aclOf(nqn)).toEqual([workerNqn]);

  // NVIDIA's attacher for the DPU is refused, naming the holder; the ACL is untouched.
  const refused = await failure(publishToDpu(pv));
  expect(refused.code).toBe(GrpcStatus.FAILED_PRECONDITION);
  expect(refused.details).toContain(`published to node ${holder}`);
  expect(await aclOf(nqn)).toEqual([workerNqn]);

  // The plugin refuses the worker's publication before touching SNAP...
  const foreign = await failure(createDevice(pv, va.status?.attachmentMetadata ?? {}));
  expect(foreign.code).toBe(GrpcStatus.FAILED_PRECONDITION);
  expect(foreign.details).toContain(`published to host ${workerNqn}`);
  expect(await ourController(volumeId)).toBeUndefined();
  // ...and without any publication the target itself refuses the DPU's host NQN.
  const unadmitted = await failure(createDevice(pv, {}));
  expect(unadmitted.code).toBe(GrpcStatus.FAILED_PRECONDITION);
  expect(await ourController(volumeId)).toBeUndefined();
  await plugin.unary(StoragePluginService.method.deleteDevice, {
    volumeId,
    deviceName: namesFor(volumeId).bdev,
  });
  expect(
    (await (await targetOf(nqn)).m.nvmfSubsystemGetControllers(nqn)).map((c) => c.hostnqn),
  ).not.toContain(dpu.hostNqn);

  // Once the worker's Pod is gone and the volume detached from it, the DPU gets it.
  await deletePod(lab, ns, "holder");
  await until(`the volume detached from ${holder}`, async () => {
    const vas = await lab.storageApi.listVolumeAttachment();
    return !vas.items.some((a) => a.spec.source.persistentVolumeName === pv.metadata?.name);
  });
  const published = await publishToDpu(pv);
  expect(published.publishContext[PublishContextKeys.hostNQN]).toBe(dpu.hostNqn);
  expect(await aclOf(nqn)).toEqual([dpu.hostNqn]);
  await unpublishFromDpu(volumeId);
  expect(await aclOf(nqn)).toEqual([]);
  touched.delete(volumeId);
}, 400_000);
