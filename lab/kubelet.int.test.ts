// The kubelet stand-in against a real control plane (attach-detach and PV binder controllers) and
// the real DISTORT stack, the test playing the external-attacher: registration, attach, mounts,
// the workload across Pods, teardown, attach errors, foreign drivers, restarts and expansion.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, statfsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { Controller, VolumeCapability_AccessMode_Mode as Mode } from "../gen/csi/v1/csi_pb.ts";
import { parseNodeId } from "../lib/csi-node-id.ts";
import { hostExec } from "../lib/exec.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { kubeError } from "../lib/kube/resource.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { type ControlPlane, startControlPlane } from "./cluster/control-plane.ts";
import { eventually, type TestCluster, testCluster } from "./cluster/test-support.ts";
import { FABRIC_LABEL, type Stack, startStack } from "./harness/stack.ts";
import { attachmentName, publishPath, stagingPath, uniqueVolumeName } from "./kubelet/naming.ts";
import { volumeCapabilityOf } from "./kubelet/volume-spec.ts";
import { type KubeletOptions, type RunningKubelet, startKubelet } from "./kubelet.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const run = randomBytes(3).toString("hex");
const WORKER = `kl-${run}-w1`;
const STORAGE = `kl-${run}-s1`;
const FINALIZER = "external-attacher/storage-distort-io";
const verbose = process.env.DISTORT_KUBELET_TEST_LOG === "1";
/** CAP_SYS_RESOURCE (bit 24) in this process's effective set: what online ext4 resize needs. */
const canResizeOnline = ((): boolean => {
  const hex = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1];
  return hex !== undefined && (BigInt(`0x${hex}`) & (1n << 24n)) !== 0n;
})();

let tc: TestCluster;
/** Run alone, this file needs a control plane with kube-controller-manager, so it starts one. */
let ownControlPlane: ControlPlane | undefined;
let stack: Stack | undefined;
let kubelet: RunningKubelet | undefined;
let controller: GrpcJsClient | undefined;
let attacher: { stop(): Promise<void>; failing: Set<string> } | undefined;
let rootDir = "";
let ns = "";
let core: k8s.CoreV1Api;
let storageApi: k8s.StorageV1Api;
const kubeletLines: string[] = [];
const volumeIds: string[] = [];

const logger = (level: "info" | "error", sink?: string[]): Logger =>
  createLogger({
    level: verbose ? "info" : level,
    sink: (line) => {
      sink?.push(line);
      if (verbose) process.stderr.write(`${line}\n`);
    },
  });

function kubeletOptions(): KubeletOptions {
  const csi = stack?.csi.get(WORKER);
  if (!csi) throw new Error("no CSI node service for the worker");
  return {
    kubeconfigPath: tc.kubeconfigPath,
    nodeName: WORKER,
    csiEndpoint: csi.address,
    rootDir,
    labels: { "lab.distort.io/role": "consumer" },
    logger: logger("info", kubeletLines),
    leaseRenewMs: 1_000,
    heartbeatMs: 5_000,
    pollMs: 200,
    resyncMs: 1_000,
    killGraceMs: 2_000,
  };
}

/** Mount points under /proc/self/mountinfo (field 5). */
function mountPoints(): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .flatMap((l) => {
      const f = l.split(" ");
      return f[4] ? [f[4].replace(/\\040/g, " ")] : [];
    });
}
const mounted = (path: string) => mountPoints().includes(path);

/**
 * The external-attacher's part, in the test: a VolumeAttachment for DISTORT gets a finalizer,
 * ControllerPublishVolume and status attached=true with the publish context; one being deleted
 * gets ControllerUnpublishVolume and loses the finalizer. Volumes in `failing` get attachError.
 */
function startAttacher(csi: GrpcJsClient) {
  const failing = new Set<string>();
  const busy = new Set<string>();
  let stopped = false;
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  const handle = async (va: k8s.V1VolumeAttachment) => {
    const name = va.metadata?.name as string;
    const pvName = va.spec.source.persistentVolumeName;
    if (!pvName) return;
    const pv = await core.readPersistentVolume({ name: pvName }).catch(() => undefined);
    const volumeId = pv?.spec?.csi?.volumeHandle;
    const finalizers = va.metadata?.finalizers ?? [];
    if (va.metadata?.deletionTimestamp) {
      if (!finalizers.includes(FINALIZER)) return;
      if (volumeId && !failing.has(volumeId))
        await csi.unary(Controller.method.controllerUnpublishVolume, { volumeId, nodeId: va.spec.nodeName });
      await storageApi.patchVolumeAttachment(
        { name, body: { metadata: { finalizers: finalizers.filter((f) => f !== FINALIZER) } } },
        merge,
      );
      return;
    }
    if (va.status?.attached || !pv || !volumeId) return;
    if (failing.has(volumeId)) {
      if (va.status?.attachError) return;
      await storageApi.patchVolumeAttachmentStatus(
        {
          name,
          body: {
            status: { attached: false, attachError: { message: `injected attach failure for ${volumeId}` } },
          },
        },
        merge,
      );
      return;
    }
    if (!finalizers.includes(FINALIZER))
      await storageApi.patchVolumeAttachment(
        { name, body: { metadata: { finalizers: [...finalizers, FINALIZER] } } },
        merge,
      );
    const res = await csi.unary(
      Controller.method.controllerPublishVolume,
      {
        volumeId,
        nodeId: va.spec.nodeName,
        volumeCapability: volumeCapabilityOf(pv),
        readonly: false,
        volumeContext: pv.spec?.csi?.volumeAttributes ?? {},
      },
      { timeoutMs: 60_000 },
    );
    await storageApi.patchVolumeAttachmentStatus(
      { name, body: { status: { attached: true, attachmentMetadata: res.publishContext } } },
      merge,
    );
  };
  const loop = (async () => {
    while (!stopped) {
      try {
        const list = await storageApi.listVolumeAttachment();
        for (const va of list.items) {
          const name = va.metadata?.name as string;
          if (va.spec.attacher !== DRIVER_NAME || va.spec.nodeName !== WORKER || busy.has(name)) continue;
          busy.add(name);
          void handle(va)
            .catch((err) => {
              if (verbose) process.stderr.write(`attacher: ${name}: ${String(err)}\n`);
            })
            .finally(() => busy.delete(name));
        }
      } catch {
        // The API server is briefly unavailable: next round.
      }
      await Bun.sleep(200);
    }
  })();
  return {
    failing,
    async stop() {
      stopped = true;
      await loop;
    },
  };
}

async function createVolume(
  name: string,
  bytes: number,
  block = false,
): Promise<{ volumeId: string; context: Record<string, string> }> {
  // Probe stays not-ready on hosts without nvme-cli (the node half checks its tools); the
  // controller answers UNAVAILABLE until its caches synced, so the call is retried.
  const res = await eventually(
    () =>
      (controller as GrpcJsClient).unary(
        Controller.method.createVolume,
        {
          name,
          capacityRange: { requiredBytes: BigInt(bytes) },
          volumeCapabilities: [
            {
              accessType: block ? { case: "block", value: {} } : { case: "mount", value: { fsType: "ext4" } },
              accessMode: { mode: Mode.SINGLE_NODE_WRITER },
            },
          ],
          parameters: { transport: "tcp" },
        },
        { timeoutMs: 120_000 },
      ),
    120_000,
    `CreateVolume ${name}`,
  );
  const v = res.volume;
  if (!v) throw new Error("CreateVolume returned no volume");
  volumeIds.push(v.volumeId);
  return { volumeId: v.volumeId, context: v.volumeContext };
}

/** A static PV for `volumeHandle` pre-bound to claim `claim`, and the claim; resolves once Bound. */
async function boundClaim(
  claim: string,
  pvName: string,
  csi: k8s.V1CSIPersistentVolumeSource,
  size = "256Mi",
  volumeMode: "Filesystem" | "Block" = "Filesystem",
) {
  await core.createPersistentVolume({
    body: {
      metadata: { name: pvName },
      spec: {
        capacity: { storage: size },
        accessModes: ["ReadWriteOnce"],
        persistentVolumeReclaimPolicy: "Retain",
        storageClassName: "",
        volumeMode,
        claimRef: { namespace: ns, name: claim },
        csi,
      },
    },
  });
  await core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name: claim },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName: "",
        volumeMode,
        volumeName: pvName,
        resources: { requests: { storage: size } },
      },
    },
  });
  await eventually(
    async () =>
      (await core.readNamespacedPersistentVolumeClaim({ name: claim, namespace: ns })).status?.phase ===
      "Bound",
    30_000,
    `claim ${claim} bound`,
  );
}

async function createPod(
  name: string,
  claim: string,
  args: string[],
  opts: { restartPolicy?: string; block?: boolean } = {},
): Promise<string> {
  const p = await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        nodeName: WORKER,
        restartPolicy: opts.restartPolicy ?? "Never",
        containers: [
          {
            name: "work",
            image: "distort/workload",
            args,
            ...(opts.block
              ? { volumeDevices: [{ name: "data", devicePath: "/dev/xvda" }] }
              : { volumeMounts: [{ name: "data", mountPath: "/data" }] }),
          },
        ],
        volumes: [{ name: "data", persistentVolumeClaim: { claimName: claim } }],
      },
    },
  });
  return p.metadata?.uid as string;
}

const readPod = (name: string) => core.readNamespacedPod({ name, namespace: ns });

async function podGone(name: string): Promise<boolean> {
  try {
    await readPod(name);
    return false;
  } catch (err) {
    return kubeError(err, "get pod").kind === "not-found";
  }
}

async function inUse(): Promise<string[]> {
  return (await core.readNode({ name: WORKER })).status?.volumesInUse ?? [];
}

function terminatedMessage(pod: k8s.V1Pod): string | undefined {
  return pod.status?.containerStatuses?.[0]?.state?.terminated?.message;
}

async function deletePodAndWait(name: string): Promise<void> {
  await core.deleteNamespacedPod({ name, namespace: ns }).catch(() => {});
  await eventually(() => podGone(name), 60_000, `pod ${name} gone`);
}

beforeAll(async () => {
  if (!process.env.DISTORT_TEST_KUBECONFIG) {
    ownControlPlane = await startControlPlane({ controllerManager: true });
    process.env.DISTORT_TEST_KUBECONFIG = ownControlPlane.kubeconfigPath;
  }
  tc = await testCluster();
  core = tc.conn.api(k8s.CoreV1Api);
  storageApi = tc.conn.api(k8s.StorageV1Api);
  stack = await startStack({
    kubeconfigPath: tc.kubeconfigPath,
    storageNodes: [
      {
        name: STORAGE,
        drives: [{ serial: `KL${run}01`.toUpperCase(), pciAddress: "0000:3b:00.0", sizeBytes: 4 * GiB }],
      },
    ],
    consumerNodes: [WORKER],
    csiAllInOne: true,
    identities: "admin",
    namespace: `kl-${run}`,
    logger: logger("error"),
    fast: true,
  });
  const address = stack.csiController?.address;
  if (!address) throw new Error("the stack serves no CSI controller");
  controller = new GrpcJsClient(address);
  rootDir = join(mkdtempSync(join(tmpdir(), "distort-kubelet-")), "var", "lib", "kubelet");
  kubelet = await startKubelet(kubeletOptions());
  attacher = startAttacher(controller);
  ns = await tc.namespace("kubelet");
}, 600_000);

afterAll(async () => {
  if (ns && kubelet) {
    const pods = await core.listNamespacedPod({ namespace: ns }).catch(() => ({ items: [] as k8s.V1Pod[] }));
    for (const p of pods.items)
      await core.deleteNamespacedPod({ name: p.metadata?.name as string, namespace: ns }).catch(() => {});
    await eventually(
      async () => (await core.listNamespacedPod({ namespace: ns })).items.length === 0,
      60_000,
      "test pods gone",
    ).catch((err) => process.stderr.write(`cleanup: ${String(err)}\n`));
    // The attach-detach controller detaches; the attacher unpublishes and lets the objects go.
    await eventually(
      async () =>
        (await storageApi.listVolumeAttachment()).items.every(
          (va) => va.spec.nodeName !== WORKER || va.spec.attacher !== DRIVER_NAME,
        ),
      90_000,
      "volume attachments gone",
    ).catch((err) => process.stderr.write(`cleanup: ${String(err)}\n`));
  }
  await attacher?.stop();
  await kubelet?.stop();
  // Safety net: nothing of the stand-in may stay mounted when the stack and its devices go.
  if (rootDir) {
    const left = mountPoints().filter((m) => m.startsWith(rootDir));
    for (const m of left.reverse()) await hostExec.run(["umount", "-l", m]).catch(() => {});
    if (left.length) process.stderr.write(`cleanup: unmounted leftovers ${left.join(", ")}\n`);
  }
  for (const volumeId of volumeIds)
    await controller
      ?.unary(Controller.method.deleteVolume, { volumeId }, { timeoutMs: 60_000 })
      .catch(() => {});
  controller?.close();
  await stack?.stop();
  if (rootDir) rmSync(join(rootDir, "..", "..", ".."), { recursive: true, force: true });
  await tc?.stop();
  if (ownControlPlane) {
    delete process.env.DISTORT_TEST_KUBECONFIG;
    await ownControlPlane.stop();
  }
}, 300_000);

describe("kubelet stand-in", () => {
  let volumeId = "";
  let writerSha = "";
  const pvName = `kl-${run}-pv`;
  const claim = "data";
  let blockVolumeId = "";
  const blockPv = `kl-${run}-pv-blk`;

  test("registers the Node, its Lease and its CSINode from the driver's NodeGetInfo", async () => {
    const node = await core.readNode({ name: WORKER });
    expect(node.metadata?.labels).toMatchObject({
      "kubernetes.io/hostname": WORKER,
      "kubernetes.io/os": "linux",
      "lab.distort.io/role": "consumer",
      [FABRIC_LABEL]: "lab",
    });
    expect(node.metadata?.annotations?.["volumes.kubernetes.io/controller-managed-attach-detach"]).toBe(
      "true",
    );
    // The driver's node ID is "<node>/<host NQN>" (lib/csi-node-id.ts); the stand-in records it verbatim.
    const ids = JSON.parse(node.metadata?.annotations?.["csi.volume.kubernetes.io/nodeid"] ?? "{}");
    expect(parseNodeId(ids[DRIVER_NAME]).nodeName).toBe(WORKER);
    expect(node.status?.conditions?.find((c) => c.type === "Ready")).toMatchObject({
      status: "True",
      reason: "KubeletReady",
    });
    expect(node.status?.capacity).toMatchObject({ cpu: "2", memory: "8Gi", pods: "110" });
    expect(node.status?.allocatable?.["ephemeral-storage"]).toBeString();
    expect(node.status?.nodeInfo).toMatchObject({ kubeletVersion: "v1.36.1", operatingSystem: "linux" });

    const csiNode = await storageApi.readCSINode({ name: WORKER });
    expect(csiNode.spec.drivers).toEqual([
      { name: DRIVER_NAME, nodeID: ids[DRIVER_NAME], topologyKeys: [FABRIC_LABEL] },
    ]);
    expect(csiNode.metadata?.ownerReferences?.[0]).toMatchObject({
      kind: "Node",
      name: WORKER,
      uid: node.metadata?.uid,
    });

    const coordination = tc.conn.api(k8s.CoordinationV1Api);
    const lease = await coordination.readNamespacedLease({ name: WORKER, namespace: "kube-node-lease" });
    expect(lease.spec?.holderIdentity).toBe(WORKER);
    const first = new Date(lease.spec?.renewTime as Date).getTime();
    await eventually(
      async () =>
        new Date(
          (await coordination.readNamespacedLease({ name: WORKER, namespace: "kube-node-lease" })).spec
            ?.renewTime as Date,
        ).getTime() > first,
      5_000,
      "lease renewed",
    );
  });

  test("a writer Pod is attached, staged, published, writes its pattern and Succeeds; then its volume is released", async () => {
    const v = await createVolume(`kl-${run}-vol`, 256 * MiB);
    volumeId = v.volumeId;
    await boundClaim(claim, pvName, {
      driver: DRIVER_NAME,
      volumeHandle: volumeId,
      volumeAttributes: v.context,
      fsType: "ext4",
    });
    const uid = await createPod("writer", claim, ["write", "--bytes=16Mi", "--seed=kubelet-test"]);
    const pod = await eventually(
      async () => {
        const p = await readPod("writer");
        return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : undefined;
      },
      120_000,
      "writer finished",
    );
    expect(pod.status?.phase).toBe("Succeeded");
    const line = terminatedMessage(pod) as string;
    const result = JSON.parse(line) as { mode: string; bytes: number; sha256: string; ok: boolean };
    expect(result).toMatchObject({ mode: "write", bytes: 16 * MiB, ok: true });
    expect(result.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(pod.status?.message).toBe(line);
    expect(pod.status?.containerStatuses?.[0]?.state?.terminated).toMatchObject({
      exitCode: 0,
      reason: "Completed",
    });
    writerSha = result.sha256;

    // The attach-detach controller saw it attached, under the names kubelet uses.
    const va = await storageApi.readVolumeAttachment({ name: attachmentName(volumeId, DRIVER_NAME, WORKER) });
    expect(va.spec.source.persistentVolumeName).toBe(pvName);

    // A terminated Pod's volumes are unmounted, as kubelet does, and stop being in use.
    const unique = uniqueVolumeName(DRIVER_NAME, volumeId);
    await eventually(async () => !(await inUse()).includes(unique), 30_000, "volume no longer in use");
    const staging = stagingPath(rootDir, {
      driver: DRIVER_NAME,
      volumeHandle: volumeId,
      pvName,
      mode: "Filesystem",
    });
    expect(mounted(staging)).toBe(false);
    expect(mounted(publishPath(rootDir, { podUID: uid, pvName, mode: "Filesystem" }))).toBe(false);
    for (const step of [
      "attached",
      "staged at",
      "published at",
      "workload started",
      "workload finished",
      "unpublished",
      "unstaged",
    ])
      expect(kubeletLines.some((l) => (JSON.parse(l) as { msg: string }).msg.includes(step))).toBe(true);
  }, 180_000);

  test("a holder keeps the volume staged while a verifier on the same node reads the pattern back", async () => {
    const holderUid = await createPod("holder", claim, ["hold"]);
    const staging = stagingPath(rootDir, {
      driver: DRIVER_NAME,
      volumeHandle: volumeId,
      pvName,
      mode: "Filesystem",
    });
    const holderPath = publishPath(rootDir, { podUID: holderUid, pvName, mode: "Filesystem" });
    const holder = await eventually(
      async () => {
        const p = await readPod("holder");
        return p.status?.phase === "Running" ? p : undefined;
      },
      120_000,
      "holder running",
    );
    expect(holder.status?.containerStatuses?.[0]).toMatchObject({ ready: true, started: true });
    expect(holder.status?.conditions?.find((c) => c.type === "Ready")?.status).toBe("True");
    expect(mounted(staging)).toBe(true);
    expect(mounted(holderPath)).toBe(true);
    const unique = uniqueVolumeName(DRIVER_NAME, volumeId);
    expect(await inUse()).toContain(unique);
    expect((await core.readNode({ name: WORKER })).status?.volumesAttached?.map((a) => a.name)).toContain(
      unique,
    );

    const verifierUid = await createPod("verifier", claim, ["verify", "--bytes=16Mi", "--seed=kubelet-test"]);
    const verifier = await eventually(
      async () => {
        const p = await readPod("verifier");
        return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : undefined;
      },
      120_000,
      "verifier finished",
    );
    expect(verifier.status?.phase).toBe("Succeeded");
    const result = JSON.parse(terminatedMessage(verifier) as string);
    expect(result).toEqual({ mode: "verify", bytes: 16 * MiB, sha256: writerSha, ok: true });

    // The verifier's publication goes; the holder's and the staging stay.
    const verifierPath = publishPath(rootDir, { podUID: verifierUid, pvName, mode: "Filesystem" });
    await eventually(() => !mounted(verifierPath), 30_000, "verifier unpublished");
    expect(mounted(staging)).toBe(true);
    expect(mounted(holderPath)).toBe(true);
    expect(await inUse()).toContain(unique);
    await deletePodAndWait("verifier");
  }, 300_000);

  test("a volume expanded by the controller is grown on the node and the claim shows the new size", async () => {
    const res = await (controller as GrpcJsClient).unary(
      Controller.method.controllerExpandVolume,
      { volumeId, capacityRange: { requiredBytes: BigInt(512 * MiB) } },
      { timeoutMs: 120_000 },
    );
    expect(res.nodeExpansionRequired).toBe(true);
    // What the external-resizer does once the controller side is done.
    const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
    await core.patchPersistentVolume(
      { name: pvName, body: { spec: { capacity: { storage: "512Mi" } } } },
      merge,
    );
    const resizer = (status: Record<string, unknown>) =>
      core.patchNamespacedPersistentVolumeClaimStatus(
        { name: claim, namespace: ns, body: { status } },
        merge,
      );
    await resizer({
      allocatedResources: { storage: "512Mi" },
      allocatedResourceStatuses: { storage: "NodeResizePending" },
    });
    const readClaim = () => core.readNamespacedPersistentVolumeClaim({ name: claim, namespace: ns });
    if (!canResizeOnline) {
      // Online ext4 growth needs CAP_SYS_RESOURCE; without it NodeExpandVolume fails, and kubelet
      // records that on the claim and keeps the resize in progress for a retry.
      const pvc = await eventually(
        async () => {
          const c = await readClaim();
          return c.status?.conditions?.find((x) => x.type === "NodeResizeError") ? c : undefined;
        },
        60_000,
        "NodeResizeError on the claim",
      );
      expect(pvc.status?.conditions?.find((x) => x.type === "NodeResizeError")?.message).toContain(
        "failed to expand pvc with NodeExpandVolume",
      );
      expect(pvc.status?.allocatedResourceStatuses?.storage).toBe("NodeResizeInProgress");
      expect(pvc.status?.capacity?.storage).toBe("256Mi");
      // An administrator gives up on the resize, so the later tests see a quiet claim.
      await resizer({ allocatedResourceStatuses: null, conditions: [] });
      return;
    }
    const pvc = await eventually(
      async () => {
        const c = await readClaim();
        return c.status?.capacity?.storage === "512Mi" ? c : undefined;
      },
      60_000,
      "claim capacity updated",
    );
    expect(pvc.status?.allocatedResourceStatuses?.storage).toBeUndefined();
    expect(pvc.status?.conditions?.some((c) => c.type === "FileSystemResizePending")).toBeFalsy();
    const holderUid = (await readPod("holder")).metadata?.uid as string;
    const s = statfsSync(publishPath(rootDir, { podUID: holderUid, pvName, mode: "Filesystem" }));
    expect(s.blocks * s.bsize).toBeGreaterThan(400 * MiB);
  }, 180_000);

  test("a restarted kubelet re-publishes a live Pod and tears down one deleted while it was away", async () => {
    const goneUid = await createPod("short-lived", claim, ["hold"]);
    await eventually(
      async () => (await readPod("short-lived")).status?.phase === "Running",
      120_000,
      "second holder running",
    );
    const gonePath = publishPath(rootDir, { podUID: goneUid, pvName, mode: "Filesystem" });
    expect(mounted(gonePath)).toBe(true);

    await kubelet?.stop();
    kubelet = undefined;
    // Removed for good while no kubelet watches: only the disk remembers its volume.
    await core.deleteNamespacedPod({ name: "short-lived", namespace: ns, gracePeriodSeconds: 0 });
    await eventually(() => podGone("short-lived"), 10_000, "pod force-deleted");
    expect(mounted(gonePath)).toBe(true);

    kubelet = await startKubelet(kubeletOptions());
    await eventually(() => !mounted(gonePath), 30_000, "orphan unpublished");
    await eventually(
      () => !existsSync(join(rootDir, "pods", goneUid)),
      10_000,
      "orphan's pod directory removed",
    );
    const holder = await eventually(
      async () => {
        const p = await readPod("holder");
        return (p.status?.containerStatuses?.[0]?.restartCount ?? 0) >= 1 && p.status?.phase === "Running"
          ? p
          : undefined;
      },
      60_000,
      "holder restarted under the new kubelet",
    );
    expect(
      mounted(publishPath(rootDir, { podUID: holder.metadata?.uid as string, pvName, mode: "Filesystem" })),
    ).toBe(true);
  }, 240_000);

  test("deleting a Pod unpublishes, unstages, clears volumesInUse and removes the Pod", async () => {
    const holderUid = (await readPod("holder")).metadata?.uid as string;
    const staging = stagingPath(rootDir, {
      driver: DRIVER_NAME,
      volumeHandle: volumeId,
      pvName,
      mode: "Filesystem",
    });
    await core.deleteNamespacedPod({ name: "holder", namespace: ns });
    await eventually(() => podGone("holder"), 60_000, "holder gone");
    expect(mounted(publishPath(rootDir, { podUID: holderUid, pvName, mode: "Filesystem" }))).toBe(false);
    expect(mounted(staging)).toBe(false);
    expect(existsSync(join(rootDir, "pods", holderUid))).toBe(false);
    expect(await inUse()).not.toContain(uniqueVolumeName(DRIVER_NAME, volumeId));
    // With nothing in use, the attach-detach controller detaches and the attacher lets go.
    await eventually(
      () =>
        storageApi
          .readVolumeAttachment({ name: attachmentName(volumeId, DRIVER_NAME, WORKER) })
          .then(() => false)
          .catch((err) => kubeError(err, "get").kind === "not-found"),
      90_000,
      "volume detached",
    );
  }, 180_000);

  test("a Block volume is published as a device file the workload writes and verifies", async () => {
    const v = await createVolume(`kl-${run}-blk`, 64 * MiB, true);
    blockVolumeId = v.volumeId;
    await boundClaim(
      "raw",
      blockPv,
      { driver: DRIVER_NAME, volumeHandle: v.volumeId, volumeAttributes: v.context },
      "64Mi",
      "Block",
    );
    const uid = await createPod("raw", "raw", ["write-verify", "--bytes=8Mi", "--seed=raw"], { block: true });
    const pod = await eventually(
      async () => {
        const p = await readPod("raw");
        return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : undefined;
      },
      120_000,
      "block pod finished",
    );
    expect(pod.status?.phase).toBe("Succeeded");
    expect(JSON.parse(terminatedMessage(pod) as string)).toMatchObject({ mode: "write-verify", ok: true });
    const published = publishPath(rootDir, { podUID: uid, pvName: blockPv, mode: "Block" });
    expect(kubeletLines.join("\n")).toContain(published);
    await eventually(
      async () => !(await inUse()).includes(uniqueVolumeName(DRIVER_NAME, v.volumeId)),
      30_000,
      "block volume released",
    );
    const staging = stagingPath(rootDir, {
      driver: DRIVER_NAME,
      volumeHandle: v.volumeId,
      pvName: blockPv,
      mode: "Block",
    });
    expect(existsSync(staging)).toBe(false);
    expect(existsSync(published)).toBe(false);
    await deletePodAndWait("raw");
  }, 180_000);

  test("a Block claim waiting for the node is grown there and finished as kubelet does", async () => {
    // The driver grows a raw block volume without the node (nodeExpansionRequired is false);
    // marking the claim NodeResizePending here still shows what kubelet does when asked.
    const uid = await createPod("raw-hold", "raw", ["hold"], { block: true });
    await eventually(
      async () => (await readPod("raw-hold")).status?.phase === "Running",
      120_000,
      "raw-hold running",
    );
    const res = await (controller as GrpcJsClient).unary(
      Controller.method.controllerExpandVolume,
      {
        volumeId: blockVolumeId,
        capacityRange: { requiredBytes: BigInt(128 * MiB) },
        volumeCapability: {
          accessType: { case: "block", value: {} },
          accessMode: { mode: Mode.SINGLE_NODE_WRITER },
        },
      },
      { timeoutMs: 120_000 },
    );
    expect(res.capacityBytes).toBeGreaterThanOrEqual(BigInt(128 * MiB));
    const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
    await core.patchPersistentVolume(
      { name: blockPv, body: { spec: { capacity: { storage: "128Mi" } } } },
      merge,
    );
    await core.patchNamespacedPersistentVolumeClaimStatus(
      {
        name: "raw",
        namespace: ns,
        body: {
          status: {
            allocatedResources: { storage: "128Mi" },
            allocatedResourceStatuses: { storage: "NodeResizePending" },
            conditions: [{ type: "FileSystemResizePending", status: "True" }],
          },
        },
      },
      merge,
    );
    const pvc = await eventually(
      async () => {
        const c = await core.readNamespacedPersistentVolumeClaim({ name: "raw", namespace: ns });
        return c.status?.capacity?.storage === "128Mi" ? c : undefined;
      },
      60_000,
      "block claim capacity updated",
    );
    expect(pvc.status?.allocatedResourceStatuses).toBeUndefined();
    expect(pvc.status?.conditions ?? []).toEqual([]);
    const device = publishPath(rootDir, { podUID: uid, pvName: blockPv, mode: "Block" });
    const size = await hostExec.run(["blockdev", "--getsize64", device]);
    expect(Number(size.stdout.trim())).toBeGreaterThanOrEqual(128 * MiB);
    await deletePodAndWait("raw-hold");
  }, 180_000);

  test("an attachment error shows in the waiting Pod's status", async () => {
    const handle = `kl-${run}-never-attaches`;
    attacher?.failing.add(handle);
    await boundClaim("unlucky", `kl-${run}-pv-unlucky`, {
      driver: DRIVER_NAME,
      volumeHandle: handle,
      volumeAttributes: {},
    });
    await createPod("unlucky", "unlucky", ["hold"]);
    const pod = await eventually(
      async () => {
        const p = await readPod("unlucky");
        return p.status?.message?.includes("injected attach failure") ? p : undefined;
      },
      60_000,
      "attach error in the pod status",
    );
    expect(pod.status?.phase).toBe("Pending");
    expect(pod.status?.message).toContain(attachmentName(handle, DRIVER_NAME, WORKER));
    expect(pod.status?.conditions?.find((c) => c.type === "PodReadyToStartContainers")).toMatchObject({
      status: "False",
      reason: "VolumesNotReady",
    });
    await deletePodAndWait("unlucky");
  }, 120_000);

  test("a Pod whose volume belongs to another driver fails with the reason", async () => {
    await boundClaim("foreign", `kl-${run}-pv-foreign`, { driver: "other.example.com", volumeHandle: "x" });
    await createPod("foreign", "foreign", ["hold"]);
    const pod = await eventually(
      async () => {
        const p = await readPod("foreign");
        return p.status?.phase === "Failed" ? p : undefined;
      },
      60_000,
      "foreign pod failed",
    );
    expect(pod.status?.message).toContain("uses CSI driver other.example.com");
    expect(pod.status?.reason).toBe("UnsupportedVolume");
    await deletePodAndWait("foreign");
  }, 120_000);
});
