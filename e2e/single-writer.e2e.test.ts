// Single writer end to end: a ReadWriteOnce volume held on one node is never attached to, nor
// admitted on the target for, a second node until the first lets go, by detaching normally or
// because an operator declared the first node dead; the second node then reads the data intact.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Code } from "@connectrpc/connect";
import * as k8s from "@kubernetes/client-node";
import { kinds } from "../api/index.ts";
import { ACCESS_ANNOTATION, FENCED_ANNOTATION, PREVIOUS_NODE_ANNOTATION } from "../csi/controller/fencing.ts";
import { Controller, VolumeCapability_AccessMode_Mode as Mode } from "../gen/csi/v1/csi_pb.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";
import { PublishContextKeys } from "../lib/volume-context.ts";
import { stagingPath } from "./kubelet/naming.ts";
import {
  allowedHosts,
  eventsFor,
  HostsRecorder,
  hostNqnOf,
  readAttachment,
  targetRpc,
  type VolumeTarget,
  volumeTarget,
} from "./storage-target.ts";
import {
  createPvc,
  deletePod,
  type E2eLab,
  e2eLab,
  until,
  type WorkloadReport,
  workloadPod,
} from "./support.ts";
import { waitHeld } from "./user-steps.ts";

/** A CSI node ID of `node`: "<node>/<host NQN>" (lib/csi-node-id.ts), or the bare name an older publish used. */
const nodeIdOf = (node: string) => new RegExp(`^${node.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}(/|$)`);

const DRIVER = "storage.distort.io";
const BYTES = 16 * 1024 * 1024;
const OUT_OF_SERVICE = "node.kubernetes.io/out-of-service";

let lab: E2eLab;
/** Processes a test froze, and nodes it took out of service: undone even if the test is cut short. */
const frozenPids = new Set<number>();
const outOfServiceNodes = new Set<string>();
const thaw = () => {
  for (const pid of frozenPids) {
    try {
      process.kill(pid, "SIGCONT");
    } catch {
      // gone already
    }
  }
  frozenPids.clear();
};
process.on("exit", thaw);
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  thaw();
  for (const node of outOfServiceNodes) await setOutOfService(node, false).catch(() => {});
  await lab.stop();
});

/** The two consumer nodes: the first holder and the one that waits for it. */
function nodes(): [string, string] {
  const [a, b] = lab.consumers;
  if (!a || !b) throw new Error("the lab needs two consumer nodes");
  return [a.name, b.name];
}

/** Starts a Pod that writes the pattern and then keeps the volume; resolves with what it wrote. */
async function startHolder(
  ns: string,
  pod: string,
  node: string,
  claim: string,
  seed: string,
): Promise<WorkloadReport> {
  await lab.core.createNamespacedPod({
    namespace: ns,
    body: workloadPod(pod, node, claim, ["write", `--bytes=${BYTES}`, `--seed=${seed}`, "--then-hold"]),
  });
  const r = await waitHeld(lab, ns, pod, 180_000);
  if (!r.ok) throw new Error(`holder could not write: ${JSON.stringify(r)}`);
  return r;
}

/** The kcm attach-detach controller's refusal to attach a held RWO volume to the waiting Pod's node. */
async function multiAttachRefused(ns: string, pod: string): Promise<k8s.CoreV1Event> {
  return until(`Multi-Attach refusal for ${ns}/${pod}`, async () =>
    (await eventsFor(lab, ns, "Pod", pod)).find(
      (e) => e.reason === "FailedAttachVolume" && (e.message ?? "").includes("Multi-Attach error"),
    ),
  );
}

/** VolumeAttachments of this driver for `pv` on `node`. */
async function attachmentsOn(pv: string, node: string): Promise<k8s.V1VolumeAttachment[]> {
  const vas = await lab.storageApi.listVolumeAttachment();
  return vas.items.filter(
    (va) =>
      va.spec.attacher === DRIVER && va.spec.nodeName === node && va.spec.source.persistentVolumeName === pv,
  );
}

/**
 * Asserts the target's ACL history: only `first` until it was revoked, `second` admitted only
 * afterwards, never both; ends with `second` alone.
 */
function expectHandOver(states: string[][], first: string, second: string): void {
  const lastFirst = states.findLastIndex((s) => s.includes(first));
  const firstSecond = states.findIndex((s) => s.includes(second));
  expect(states.filter((s) => s.includes(first) && s.includes(second))).toEqual([]);
  expect(lastFirst).toBeGreaterThanOrEqual(0);
  expect(firstSecond).toBeGreaterThan(lastFirst);
  expect(states.every((s) => s.length <= 1)).toBe(true);
  expect(states.at(-1)).toEqual([second]);
}

/** The PV bound to the test's claim "data". */
async function pvOf(ns: string): Promise<string> {
  const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  if (!pvc.spec?.volumeName) throw new Error(`claim ${ns}/data is not bound`);
  return pvc.spec.volumeName;
}

/** The CSI capability behind a publication's access annotation ("mount:ext4:SINGLE_NODE_MULTI_WRITER"). */
function capabilityOf(access: string | undefined) {
  const [kind, fsType, mode] = (access ?? "").split(":");
  const m = Mode[mode as keyof typeof Mode];
  if (kind !== "mount" || m === undefined) throw new Error(`unexpected publication access ${access}`);
  return { accessType: { case: "mount" as const, value: { fsType: fsType ?? "" } }, accessMode: { mode: m } };
}

/** Deletes the test's Pods, claim and namespace, and waits until the volume is gone from the target. */
async function cleanUp(ns: string, t: VolumeTarget | undefined, pods: string[]): Promise<void> {
  for (const p of pods) await deletePod(lab, ns, p, 180_000);
  try {
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  if (t) {
    const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
    await until(
      `partition ${t.partition.metadata.name} deleted`,
      async () => !(await parts.get(t.partition.metadata.name, t.partition.metadata.namespace)),
      180_000,
    );
  }
  await lab.core.deleteNamespace({ name: ns });
}

/**
 * Makes a consumer node "die": its kubelet and node plugin stop answering. Frozen rather than
 * killed, because the lab restarts killed processes and a restarted kubelet would tear its Pods
 * down cleanly, which a dead node never does. thaw() resumes them.
 */
function freeze(node: string): void {
  const consumer = lab.consumers.find((c) => c.name === node);
  if (!consumer) throw new Error(`no consumer node ${node}`);
  for (const name of [consumer.kubelet, consumer.csi]) {
    const pid = lab.pid(name);
    if (pid === undefined) throw new Error(`${name} is not running`);
    frozenPids.add(pid);
    process.kill(pid, "SIGSTOP");
  }
}

/** Adds or removes the node.kubernetes.io/out-of-service taint an operator puts on a dead node. */
async function setOutOfService(node: string, on: boolean): Promise<void> {
  const n = await lab.core.readNode({ name: node });
  const others = (n.spec?.taints ?? []).filter((x) => x.key !== OUT_OF_SERVICE);
  const taints = on
    ? [...others, { key: OUT_OF_SERVICE, value: "nodeshutdown", effect: "NoExecute" }]
    : others;
  if (on) outOfServiceNodes.add(node);
  await lab.core.patchNode(
    { name: node, body: { spec: { taints } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
  if (!on) outOfServiceNodes.delete(node);
}

/**
 * Waits until a node that was frozen serves again: Ready without node-lifecycle taints, and its
 * kubelet has torn down the volume the dead node had staged.
 */
async function recovered(node: string, t: VolumeTarget): Promise<void> {
  const consumer = lab.consumers.find((c) => c.name === node);
  if (!consumer) throw new Error(`no consumer node ${node}`);
  const handle = `${t.partition.metadata.namespace}/${t.partition.metadata.name}/${t.partition.metadata.uid}`;
  const staged = stagingPath(consumer.kubeletRoot, {
    driver: DRIVER,
    volumeHandle: handle,
    pvName: "",
    mode: "Filesystem",
  });
  // The thawed kubelet kills the force-deleted Pod's container and unstages at once, but the
  // unmount flushes the filesystem through a path the takeover revoked: the NVMe host holds that
  // I/O until the class's fast_io_fail_tmo has passed since the path was lost, then fails it and
  // the unmount completes (measured on the real cluster: NodeUnstage 48.8 s with 60 s there).
  // Bound: that timeout plus two minutes for the kubelet's own passes.
  const sc = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  const fastIoFailS = Number(sc.parameters?.fastIoFailTmo ?? 0);
  await until(
    `${node} unstaged the volume`,
    async () => !lab.mountPoints(node).includes(staged),
    (Math.max(0, fastIoFailS) + 120) * 1000,
  );
  await until(
    `${node} Ready and untainted again`,
    async () => {
      const n = await lab.core.readNode({ name: node });
      const ready = n.status?.conditions?.find((c) => c.type === "Ready")?.status === "True";
      return ready && !(n.spec?.taints ?? []).some((x) => x.key.startsWith("node.kubernetes.io/"));
    },
    300_000,
  );
}

describe("single writer", () => {
  test("a second node waits while the first holds the volume, then reads its data once it moves", async () => {
    const [nodeA, nodeB] = nodes();
    const ns = await lab.newNamespace("sw-move");
    let t: VolumeTarget | undefined;
    let recorder: HostsRecorder | undefined;
    try {
      await createPvc(lab, ns, "data");
      const written = await startHolder(ns, "writer", nodeA, "data", ns);
      t = await volumeTarget(lab, ns, "data");
      const pvName = await pvOf(ns);
      const [nqnA, nqnB] = [await hostNqnOf(lab, nodeA), await hostNqnOf(lab, nodeB)];
      expect(nqnA).not.toBe(nqnB);
      recorder = new HostsRecorder(t.spdkSocket, t.nqn);

      await lab.core.createNamespacedPod({
        namespace: ns,
        // The reader holds on: a reader that ended would let the volume detach again before the ACL
        // history is read.
        body: workloadPod("reader", nodeB, "data", [
          "verify",
          `--bytes=${BYTES}`,
          `--seed=${ns}`,
          "--then-hold",
        ]),
      });
      await multiAttachRefused(ns, "reader");
      // The reader's kubelet is waiting for an attachment that does not come: its container is not
      // created (a real kubelet says no more in the Pod's status; the refusal is the Event above).
      await until("reader waiting for its attachment", async () => {
        const p = await lab.core.readNamespacedPod({ name: "reader", namespace: ns });
        const waiting = p.status?.containerStatuses?.[0]?.state?.waiting;
        return (
          p.status?.phase === "Pending" && (waiting === undefined || waiting.reason === "ContainerCreating")
        );
      });
      expect(await attachmentsOn(pvName, nodeB)).toEqual([]);
      const { rpc, close } = targetRpc(t.spdkSocket);
      try {
        expect(await allowedHosts(rpc, t.nqn)).toEqual([nqnA]);
      } finally {
        await close();
      }
      expect((await readAttachment(lab, t))?.spec.nodeId).toMatch(nodeIdOf(nodeA));

      await deletePod(lab, ns, "writer", 180_000);
      const read = await waitHeld(lab, ns, "reader", 240_000);
      expect(read).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: written.sha256 });
      expect(await attachmentsOn(pvName, nodeA)).toEqual([]);
      await recorder.stop();
      expectHandOver(recorder.states(), nqnA, nqnB);
    } finally {
      await recorder?.stop();
      await cleanUp(ns, t, ["writer", "reader"]);
    }
  }, 600_000);

  test("a dead node's volume moves once the operator fences it and takes the node out of service: revoke before grant", async () => {
    const [nodeA, nodeB] = nodes();
    const ns = await lab.newNamespace("sw-dead");
    let t: VolumeTarget | undefined;
    let recorder: HostsRecorder | undefined;
    let froze = false;
    try {
      await createPvc(lab, ns, "data");
      const written = await startHolder(ns, "writer", nodeA, "data", ns);
      t = await volumeTarget(lab, ns, "data");
      const [nqnA, nqnB] = [await hostNqnOf(lab, nodeA), await hostNqnOf(lab, nodeB)];
      const before = await readAttachment(lab, t);
      expect(before?.spec).toMatchObject({ nodeId: expect.stringMatching(nodeIdOf(nodeA)), hostNQN: nqnA });
      recorder = new HostsRecorder(t.spdkSocket, t.nqn);

      froze = true;
      freeze(nodeA);
      await lab.core.createNamespacedPod({
        namespace: ns,
        // The reader holds on: a reader that ended would let the volume detach again before the ACL
        // history is read.
        body: workloadPod("reader", nodeB, "data", [
          "verify",
          `--bytes=${BYTES}`,
          `--seed=${ns}`,
          "--then-hold",
        ]),
      });
      await multiAttachRefused(ns, "reader");

      // The operator, having made sure worker-a is down: fences its publication as the design
      // asks, removes its Pod for good, and declares the node out of service so kcm detaches
      // without waiting for an unmount the dead node will never report.
      const atts = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
      await atts.mergePatch(t.attachmentName, t.partition.metadata.namespace, {
        metadata: { annotations: { [FENCED_ANNOTATION]: "true" } },
      });
      await lab.core.deleteNamespacedPod({ name: "writer", namespace: ns, body: { gracePeriodSeconds: 0 } });
      await setOutOfService(nodeA, true);

      const read = await waitHeld(lab, ns, "reader", 300_000);
      expect(read).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: written.sha256 });
      await recorder.stop();
      expectHandOver(recorder.states(), nqnA, nqnB);
      // kcm detached worker-a first (ControllerUnpublish revoked its host and removed the
      // publication), so worker-b's is a new one: the fence did not have to move anything.
      const after = await readAttachment(lab, t);
      expect(after?.spec).toMatchObject({ nodeId: expect.stringMatching(nodeIdOf(nodeB)), hostNQN: nqnB });
      expect(after?.metadata.uid).not.toBe(before?.metadata.uid);
      expect(after?.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();
      expect(await attachmentsOn(await pvOf(ns), nodeA)).toEqual([]);
    } finally {
      await recorder?.stop();
      await setOutOfService(nodeA, false).catch(() => {});
      thaw();
      if (froze && t) await recovered(nodeA, t);
      await cleanUp(ns, t, ["writer", "reader"]);
    }
  }, 600_000);

  test("fenced takeover in ControllerPublish: refused until the holder is fenced, then revoke before grant; the late unpublish changes nothing", async () => {
    const [nodeA, nodeB] = nodes();
    const ns = await lab.newNamespace("sw-fence");
    let t: VolumeTarget | undefined;
    let recorder: HostsRecorder | undefined;
    let froze = false;
    const client = new GrpcJsClient(`unix://${lab.csiControllerSocket}`);
    try {
      await createPvc(lab, ns, "data");
      const written = await startHolder(ns, "writer", nodeA, "data", ns);
      t = await volumeTarget(lab, ns, "data");
      const [nqnA, nqnB] = [await hostNqnOf(lab, nodeA), await hostNqnOf(lab, nodeB)];
      const before = await readAttachment(lab, t);
      if (!before) throw new Error("the holder has no NVMeVolumeAttachment");
      recorder = new HostsRecorder(t.spdkSocket, t.nqn);
      froze = true;
      freeze(nodeA);
      await lab.core.createNamespacedPod({
        namespace: ns,
        // The reader holds on: a reader that ended would let the volume detach again before the ACL
        // history is read.
        body: workloadPod("reader", nodeB, "data", [
          "verify",
          `--bytes=${BYTES}`,
          `--seed=${ns}`,
          "--then-hold",
        ]),
      });
      await multiAttachRefused(ns, "reader");

      // kcm never publishes a held RWO volume to a second node (it detaches first), so the
      // publication a CO without that guard would make is sent to the CSI controller directly,
      // with the capability the attacher uses for this volume.
      const pv = await lab.core.readPersistentVolume({ name: await pvOf(ns) });
      const volumeId = pv.spec?.csi?.volumeHandle as string;
      const publishB = () =>
        client.unary(
          Controller.method.controllerPublishVolume,
          {
            volumeId,
            nodeId: nodeB,
            volumeCapability: capabilityOf(before.metadata.annotations?.[ACCESS_ANNOTATION]),
            readonly: false,
          },
          { timeoutMs: 60_000 },
        );
      const refused = await publishB().then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(refused).toBeInstanceOf(GrpcCallError);
      expect((refused as GrpcCallError).code).toBe(Code.FailedPrecondition);
      expect((refused as GrpcCallError).details).toContain(`${FENCED_ANNOTATION}=true`);
      const { rpc, close } = targetRpc(t.spdkSocket);
      try {
        expect(await allowedHosts(rpc, t.nqn)).toEqual([nqnA]);
      } finally {
        await close();
      }

      // The operator has made sure worker-a is down and fences it.
      const atts = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
      await atts.mergePatch(t.attachmentName, t.partition.metadata.namespace, {
        metadata: { annotations: { [FENCED_ANNOTATION]: "true" } },
      });
      const published = await publishB();
      const taken = await readAttachment(lab, t);
      expect(taken?.metadata.uid).toBe(before.metadata.uid);
      expect(taken?.spec).toMatchObject({ nodeId: expect.stringMatching(nodeIdOf(nodeB)), hostNQN: nqnB });
      expect(taken?.metadata.annotations?.[PREVIOUS_NODE_ANNOTATION]).toMatch(nodeIdOf(nodeA));
      expect(taken?.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();
      expect(published.publishContext[PublishContextKeys.attachmentId]).toBe(
        taken?.spec.attachmentId as string,
      );
      const takenOver = await until("TakenOver event on the partition", async () =>
        (
          await eventsFor(
            lab,
            t?.partition.metadata.namespace as string,
            "NVMePartition",
            t?.partition.metadata.name as string,
          )
        ).find((e) => e.reason === "TakenOver"),
      );
      expect(takenOver.message).toContain(nodeA);

      // Kubernetes catches up: the dead node's Pod is removed for good and the node declared out
      // of service; kcm's detach from worker-a (ControllerUnpublish for worker-a) must leave
      // worker-b's access alone, and the attach to worker-b finds it in place.
      await lab.core.deleteNamespacedPod({ name: "writer", namespace: ns, body: { gracePeriodSeconds: 0 } });
      await setOutOfService(nodeA, true);
      const read = await waitHeld(lab, ns, "reader", 300_000);
      expect(read).toMatchObject({ mode: "verify", bytes: BYTES, ok: true, sha256: written.sha256 });
      expect(await attachmentsOn(pv.metadata?.name as string, nodeA)).toEqual([]);
      expect((await readAttachment(lab, t))?.spec.attachmentId).toBe(taken?.spec.attachmentId as string);
      await recorder.stop();
      const states = recorder.states();
      expectHandOver(states, nqnA, nqnB);
      // Once admitted, worker-b was never removed again (the stale unpublish was a no-op).
      expect(states.slice(states.findIndex((s) => s.includes(nqnB)))).toEqual([[nqnB]]);
    } finally {
      client.close();
      await recorder?.stop();
      await setOutOfService(nodeA, false).catch(() => {});
      thaw();
      if (froze && t) await recovered(nodeA, t);
      await cleanUp(ns, t, ["writer", "reader"]);
    }
  }, 600_000);
});
