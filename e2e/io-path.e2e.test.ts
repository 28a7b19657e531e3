// Block I/O through the target, end to end: after a forced takeover the old node's next direct
// write fails with an I/O error within the class's timeouts and never reaches the volume, and a
// target killed during a Pod's writes stalls them until it is back, while one kept down past
// ctrl_loss_tmo fails the Pod's I/O with EIO and the node reports the volume inaccessible.
// Parametrised by backend: each entry names the StorageClass whose volumes it serves (the kernel
// class places them on the lab's kernel-backend node: nvmet on simulated configfs, parted on a loop
// device).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { kinds } from "../api/index.ts";
import { FENCED_ANNOTATION } from "../csi/controller/fencing.ts";
import { Node as NodeService, VolumeHealthErrorType } from "../gen/csi/v1/csi_pb.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";
import { stagingPath } from "./kubelet/naming.ts";
import { hostNqnOf, targetRevoked, type VolumeTarget, volumeTarget } from "./storage-target.ts";
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

const DRIVER = "storage.distort.io";
const OUT_OF_SERVICE = "node.kubernetes.io/out-of-service";
const BLOCK = 4096;

/**
 * Backends under test: the lab's StorageClass of each. `targetProcess`: the target is a process of
 * its own that can be killed and restarted (nvmf_tgt); nvmet lives in the storage node's kernel,
 * where a crash of the target is a crash of the node, so the kill -9 test is SPDK's only.
 */
const BACKENDS = [
  { backend: "spdk", baseClass: "distort-lab", targetProcess: true },
  { backend: "kernel", baseClass: "distort-lab-kernel", targetProcess: false },
] as const;

let lab: E2eLab;
const frozen = new Set<number>();
const thaw = () => {
  for (const pid of frozen) {
    try {
      process.kill(pid, "SIGCONT");
    } catch {}
  }
  frozen.clear();
};
process.on("exit", thaw);
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  thaw();
  await lab.stop();
});

/** A copy of `base` with these reconnect timers (seconds), so a test sees them play out quickly. */
async function classWith(
  base: string,
  t: { ctrlLossTmo: number; reconnectDelay: number; fastIoFailTmo: number },
) {
  const name = `e2e-io-${randomBytes(3).toString("hex")}`;
  const b = await lab.storageApi.readStorageClass({ name: base });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name },
      provisioner: b.provisioner,
      parameters: {
        ...b.parameters,
        ctrlLossTmo: String(t.ctrlLossTmo),
        reconnectDelay: String(t.reconnectDelay),
        fastIoFailTmo: String(t.fastIoFailTmo),
      },
      reclaimPolicy: "Delete",
      volumeBindingMode: "Immediate",
      allowVolumeExpansion: b.allowVolumeExpansion,
    },
  });
  return name;
}

function consumer(node: string) {
  const c = lab.consumers.find((x) => x.name === node);
  if (!c) throw new Error(`no consumer node ${node}`);
  return c;
}

/** The block device mounted at the volume's staging path on `node` (from the node's mount table). */
function stagedDevice(node: string, t: VolumeTarget): string {
  const handle = `${t.partition.metadata.namespace}/${t.partition.metadata.name}/${t.partition.metadata.uid}`;
  const staged = stagingPath(consumer(node).kubeletRoot, {
    driver: DRIVER,
    volumeHandle: handle,
    pvName: "",
    mode: "Filesystem",
  });
  for (const line of lab.mountinfo(node).split("\n")) {
    const f = line.split(" ");
    if (f[4] !== staged) continue;
    const dash = f.indexOf("-");
    const source = f[dash + 2];
    if (source?.startsWith("/dev/")) return source;
  }
  throw new Error(`nothing is staged at ${staged} on ${node}`);
}

/** One direct 4 KiB write of `byte` at block `block` of `device`, from a child process. */
async function directWrite(device: string, block: number, byte: number, timeoutMs: number) {
  const src = `/tmp/e2e-io-block-${byte}`;
  await Bun.write(src, Buffer.alloc(BLOCK, byte));
  const p = Bun.spawn(
    [
      "timeout",
      String(Math.ceil(timeoutMs / 1000)),
      "dd",
      `if=${src}`,
      `of=${device}`,
      `bs=${BLOCK}`,
      "count=1",
      `seek=${block}`,
      "oflag=direct",
      "conv=notrunc",
      "status=none",
    ],
    { stdout: "pipe", stderr: "pipe" },
  );
  const started = Date.now();
  const code = await p.exited;
  return { code, stderr: await new Response(p.stderr).text(), ms: Date.now() - started };
}

/** Block `block` of `device` read directly (not from a cache). */
async function directRead(device: string, block: number): Promise<Buffer> {
  const p = Bun.spawn(
    ["dd", `if=${device}`, `bs=${BLOCK}`, "count=1", `skip=${block}`, "iflag=direct", "status=none"],
    {
      stdout: "pipe",
      stderr: "pipe",
    },
  );
  const out = Buffer.from(await new Response(p.stdout).arrayBuffer());
  if ((await p.exited) !== 0) throw new Error(`reading ${device}: ${await new Response(p.stderr).text()}`);
  return out;
}

async function deviceBlocks(device: string): Promise<number> {
  const p = Bun.spawn(["blockdev", "--getsize64", device], { stdout: "pipe" });
  const n = Number((await new Response(p.stdout).text()).trim());
  await p.exited;
  return Math.floor(n / BLOCK);
}

async function setOutOfService(node: string, on: boolean): Promise<void> {
  const n = await lab.core.readNode({ name: node });
  const others = (n.spec?.taints ?? []).filter((x) => x.key !== OUT_OF_SERVICE);
  const taints = on
    ? [...others, { key: OUT_OF_SERVICE, value: "nodeshutdown", effect: "NoExecute" }]
    : others;
  await lab.core.patchNode(
    { name: node, body: { spec: { taints } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
}

async function cleanUp(ns: string, sc: string, pods: string[]): Promise<void> {
  for (const p of pods) await deletePod(lab, ns, p, 180_000).catch(() => {});
  try {
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  await lab.core.deleteNamespace({ name: ns }).catch(() => {});
  await lab.storageApi.deleteStorageClass({ name: sc }).catch(() => {});
}

/** The CSI node's NodeGetVolumeHealth for the volume staged on `node`. */
async function nodeHealth(node: string, t: VolumeTarget): Promise<{ status: string; reason: string }[]> {
  const c = consumer(node);
  const client = new GrpcJsClient(`unix://${c.kubeletRoot}/plugins/${DRIVER}/csi.sock`);
  try {
    const handle = `${t.partition.metadata.namespace}/${t.partition.metadata.name}/${t.partition.metadata.uid}`;
    const r = await client.unary(NodeService.method.nodeGetVolumeHealth, { volumeId: handle });
    return (r.volumeHealth?.healthStatuses ?? []).map((h) => ({
      status: VolumeHealthErrorType[h.status] ?? String(h.status),
      reason: h.reason,
    }));
  } finally {
    client.close();
  }
}

/**
 * kubelet's own verdict on a PVC's volume (feature gate CSIVolumeHealth): its
 * kubelet_volume_stats_health_status_abnormal gauge, read through the API server's node proxy;
 * undefined while kubelet has not measured the volume yet.
 */
async function kubeletAbnormal(node: string, ns: string, pvc: string): Promise<number | undefined> {
  const res = await lab.conn.request(`/api/v1/nodes/${node}/proxy/metrics`);
  if (!res.ok) throw new Error(`kubelet metrics of ${node}: HTTP ${res.status}`);
  const want = `kubelet_volume_stats_health_status_abnormal{namespace="${ns}",persistentvolumeclaim="${pvc}"}`;
  const line = (await res.text()).split("\n").find((l) => l.startsWith(want));
  return line === undefined ? undefined : Number(line.slice(want.length).trim());
}

async function startPod(ns: string, pod: string, node: string, args: string[]): Promise<void> {
  await lab.core.createNamespacedPod({ namespace: ns, body: workloadPod(pod, node, "data", args) });
}

async function podReport(
  ns: string,
  pod: string,
  timeoutMs: number,
  running = false,
): Promise<WorkloadReport> {
  return until(
    `${ns}/${pod} to report`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name: pod, namespace: ns });
      const done = p.status?.phase === "Failed" || p.status?.phase === "Succeeded";
      const msg = p.status?.message ?? p.status?.containerStatuses?.[0]?.state?.terminated?.message;
      if ((done || (running && p.status?.phase === "Running")) && msg?.startsWith("{"))
        return JSON.parse(msg) as WorkloadReport;
      // A held workload under a real kubelet has no termination message yet: its line is in the log.
      if (running && p.status?.phase === "Running") {
        const line = String(await lab.core.readNamespacedPodLog({ name: pod, namespace: ns }))
          .split("\n")
          .find((l) => l.startsWith("{"));
        if (line) return JSON.parse(line) as WorkloadReport;
      }
      return undefined;
    },
    timeoutMs,
  );
}

for (const { backend, baseClass, targetProcess } of BACKENDS) {
  describe(`I/O through the target (${backend})`, () => {
    test("forced takeover: the old node's next direct write fails within the timeouts and never reaches the volume", async () => {
      const [a, b] = lab.consumers;
      if (!a || !b) throw new Error("the lab needs two consumer nodes");
      const timers = { ctrlLossTmo: 60, reconnectDelay: 1, fastIoFailTmo: 3 };
      const sc = await classWith(baseClass, timers);
      const ns = await lab.newNamespace("io-takeover");
      try {
        await createPvc(lab, ns, "data", { storageClass: sc });
        await startPod(ns, "writer", a.name, ["write", "--bytes=8Mi", `--seed=${ns}`, "--then-hold"]);
        const written = await podReport(ns, "writer", 180_000, true);
        expect(written.ok).toBe(true);
        const t = await volumeTarget(lab, ns, "data");
        expect(t.backend).toBe(backend);
        const nqnA = await hostNqnOf(lab, a.name);
        const devA = stagedDevice(a.name, t);
        const last = (await deviceBlocks(devA)) - 1;
        // Before the revoke the old node's writes reach the volume.
        expect((await directWrite(devA, last, 0x11, 30_000)).code).toBe(0);

        // worker-a "dies" (its kubelet and node plugin stop; its kernel keeps running), the
        // operator fences it and takes it out of service, and the volume moves to worker-b.
        for (const name of [a.kubelet, a.csi]) {
          const pid = lab.pid(name);
          if (pid === undefined) throw new Error(`${name} is not running`);
          frozen.add(pid);
          process.kill(pid, "SIGSTOP");
        }
        await startPod(ns, "reader", b.name, ["verify", "--bytes=8Mi", `--seed=${ns}`, "--then-hold"]);
        const atts = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
        await atts.mergePatch(t.attachmentName, t.partition.metadata.namespace, {
          metadata: { annotations: { [FENCED_ANNOTATION]: "true" } },
        });
        await lab.core.deleteNamespacedPod({
          name: "writer",
          namespace: ns,
          body: { gracePeriodSeconds: 0 },
        });
        await setOutOfService(a.name, true);
        await until("worker-a revoked on the target", async () => await targetRevoked(t, nqnA), 180_000);

        // The old node's next direct write: an I/O error within fast_io_fail_tmo (plus one
        // reconnect delay and scheduling slack), not a success.
        const late = await directWrite(devA, last - 1, 0x22, 60_000);
        expect(late.code).not.toBe(0);
        expect(late.stderr).toContain("Input/output error");
        expect(late.ms).toBeLessThan((timers.fastIoFailTmo + timers.reconnectDelay) * 1000 + 10_000);

        const read = await waitHeld(lab, ns, "reader", 300_000);
        expect(read).toMatchObject({ ok: true, sha256: written.sha256 });
        const devB = stagedDevice(b.name, t);
        // The bytes on the new node: the pre-revoke write is there, the post-revoke one is not.
        expect((await directRead(devB, last)).equals(Buffer.alloc(BLOCK, 0x11))).toBe(true);
        expect((await directRead(devB, last - 1)).includes(Buffer.alloc(64, 0x22))).toBe(false);
      } finally {
        await setOutOfService(a.name, false).catch(() => {});
        thaw();
        await cleanUp(ns, sc, ["writer", "reader"]);
      }
    }, 900_000);

    test.if(targetProcess)(
      "kill -9 of the target during a Pod's writes stalls them until it is back; kept down past ctrl_loss_tmo the Pod's I/O fails with EIO",
      async () => {
        const [a] = lab.consumers;
        if (!a) throw new Error("the lab needs a consumer node");
        const timers = { ctrlLossTmo: 15, reconnectDelay: 1, fastIoFailTmo: -1 };
        const sc = await classWith(baseClass, timers);
        const ns = await lab.newNamespace("io-target");
        let stopped: number | undefined;
        try {
          await createPvc(lab, ns, "data", { storageClass: sc, size: "2Gi" });
          const t = await volumeTarget(lab, ns, "data");
          const storage = lab.storage.find((s) => s.name === t.storageNode);
          if (!storage) throw new Error(`no storage node ${t.storageNode}`);
          await startPod(ns, "writer", a.name, [
            "write-verify",
            "--bytes=512Mi",
            `--seed=${ns}`,
            "--then-hold",
          ]);
          await until(
            "writer running",
            async () => {
              const p = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
              return p.status?.phase === "Running";
            },
            180_000,
          );
          // kubelet asks the node plugin for the volume's condition (NodeGetVolumeStats): healthy.
          await until(
            "kubelet measured the volume healthy",
            async () => (await kubeletAbnormal(a.name, ns, "data")) === 0,
            120_000,
          );
          const old = await lab.kill(storage.target);
          // While the target is away the path reconnects: the node says so.
          const down = await nodeHealth(a.name, t);
          await lab.waitRestarted(storage.target, old, 60_000);
          const report = await podReport(ns, "writer", 300_000, true);
          expect(report).toMatchObject({ mode: "write-verify", bytes: 512 * 1024 * 1024, ok: true });
          expect(down.length === 0 || down.some((h) => h.reason === "ControllerNotLive")).toBe(true);
          await until("volume healthy again", async () => (await nodeHealth(a.name, t)).length === 0, 60_000);

          // Now the target stays away (stopped: it neither answers nor closes) past ctrl_loss_tmo.
          const pid = lab.pid(storage.target);
          if (pid === undefined) throw new Error("target not running");
          stopped = pid;
          process.kill(pid, "SIGSTOP");
          await startPod(ns, "late", a.name, ["write", "--bytes=4Mi", `--seed=${ns}-late`]);
          const failed = await podReport(ns, "late", 180_000);
          expect(failed.ok).toBe(false);
          expect((failed as WorkloadReport & { error?: string }).error ?? "").toMatch(
            /EIO|Input\/output error|ENOTCONN|EROFS/,
          );
          const health = await nodeHealth(a.name, t);
          expect(health.some((h) => h.status === "INACCESSIBLE")).toBe(true);
          // ...and kubelet reports the volume abnormal from the condition the node plugin gives it.
          await until(
            "kubelet reports the volume abnormal",
            async () => (await kubeletAbnormal(a.name, ns, "data")) === 1,
            120_000,
          );
        } finally {
          if (stopped !== undefined) process.kill(stopped, "SIGCONT");
          await cleanUp(ns, sc, ["writer", "late"]);
        }
      },
      900_000,
    );
  });
}
