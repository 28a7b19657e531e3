// DISTORT on the real-cluster lab: real kubelet nodes, installed only by `helm install`.
// Every DISTORT process is a container under a kubelet; the installed release is the chart plus
// the lab values; a Pod on one node writes and a Pod on another reads the same bytes through the
// fabric; a kubelet restart reconstructs a staged volume without staging it again; kill -9 of the
// emulated nvmf_tgt container stalls and resumes I/O; `helm uninstall` leaves nothing of DISTORT.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { sharedRealLab } from "../e2e/cluster-backend.ts";
import { chartParity } from "../lab/cluster/chart-parity.ts";
import { distortProcesses } from "../lab/cluster/containers.ts";
import { crashNode, restoreNode } from "../lab/cluster/node-faults.ts";
import { type RealLab, startRealLab } from "../lab/cluster/real-lab.ts";
import { type DemoNode, runDemo, type WorkloadReport, workloadPod, workloadReport } from "../lab/demo.ts";

const say = (s: string) => process.stdout.write(`  [cluster] ${s}\n`);
let lab: RealLab;
let dir: string;
let core: k8s.CoreV1Api;

// The run's shared lab (e2e/cluster-preload.ts; this file runs last, it uninstalls) or one of its own.
let own = false;

beforeAll(async () => {
  const shared = sharedRealLab();
  if (shared) lab = shared;
  else {
    own = true;
    dir = mkdtempSync(join(tmpdir(), "distort-cluster-"));
    lab = await startRealLab({ dir, progress: say });
  }
  core = lab.conn.api(k8s.CoreV1Api);
}, 1_800_000);

afterAll(async () => {
  if (!own) return;
  await lab?.stop();
  rmSync(dir, { recursive: true, force: true });
}, 300_000);

function demoNode(name: string): DemoNode {
  const node = lab.nodes.find((n) => n.name === name);
  if (!node) throw new Error(`no node ${name}`);
  return {
    name,
    kubeletRoot: "/var/lib/kubelet",
    mountinfo: () => readFileSync(`/proc/${node.holderPid}/mountinfo`, "utf8"),
  };
}

async function waitFor<T>(
  what: string,
  timeoutMs: number,
  fn: () => Promise<T | undefined | false>,
): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch((err: unknown) => {
      // A writer that reported an I/O error fails the test at once; anything else is retried.
      if (err instanceof WriterFailed) throw err;
      return undefined;
    });
    if (v !== undefined && v !== false) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(250);
  }
}

test("every DISTORT process is a container under a real kubelet", async () => {
  const procs = distortProcesses();
  const outside = procs.filter((p) => !p.cgroup.includes("kubepods"));
  expect(outside.map((p) => `${p.pid} ${p.cmd}`)).toEqual([]);
  const count = (re: RegExp) => procs.filter((p) => re.test(p.cmd)).length;
  // Two managers, a CSI node per node but the DPU, an agent, an emulated target and its watchdog
  // per SPDK storage node, the kernel agent variant (distort-agent-kernel-lab) on the kernel-backend node,
  // the DPU plugin on the DPU node (whose SNAP stand-in runs as snap-emulator: not DISTORT's).
  const dpus = lab.specs.filter((s) => s.dpu).length;
  expect(count(/distort-manager/)).toBe(2);
  expect(count(/distort-agent(\s|$)(?!.*--mode=target-watchdog)/)).toBe(
    lab.specs.filter((s) => s.storage).length,
  );
  // The target watchdog beside each emulated nvmf_tgt (the agent binary in its watchdog mode).
  expect(count(/distort-agent\s.*--mode=target-watchdog/)).toBe(lab.specs.filter((s) => s.storage).length);
  expect(count(/distort-agent-kernel-lab(\s|$)/)).toBe(lab.specs.filter((s) => s.kernel).length);
  expect(count(/nvmf_tgt/)).toBe(lab.specs.filter((s) => s.storage).length);
  expect(count(/distort-csi(-lab)?\b.*--mode=node/)).toBe(lab.nodes.length - dpus);
  expect(count(/distort-dpu(\s|$)/)).toBe(dpus);
  // One CSI controller replica in the lab values (a killed one comes back as the leader at once).
  expect(count(/distort-csi\b.*--mode=controller/)).toBe(1);
  const pods = await core.listPodForAllNamespaces();
  for (const p of pods.items)
    say(`${p.metadata?.namespace}/${p.metadata?.name} ${p.status?.phase} ${p.spec?.nodeName}`);
  expect(
    pods.items.filter((p) => p.metadata?.namespace === lab.namespace && p.status?.phase !== "Running"),
  ).toEqual([]);
});

test("the installed release is helm/distort with the lab values, nothing else", async () => {
  const diff = await chartParity({
    helm: lab.helmBin,
    kubeconfig: lab.kubeconfigPath,
    release: lab.release,
    namespace: lab.namespace,
    tag: lab.images.tag,
  });
  expect(diff).toEqual([]);
});

test("a Pod on one node writes, a Pod on another reads the same bytes", async () => {
  const { written, read } = await runDemo({
    conn: lab.conn,
    nodes: [demoNode("node-c"), demoNode("node-b")],
    say,
    image: workloadImage(),
    bytes: 16 * 1024 * 1024,
    timeoutMs: 240_000,
  });
  expect(written.ok).toBe(true);
  expect(read.ok).toBe(true);
  expect(read.sha256).toBe(written.sha256);
}, 400_000);

/** The mount ID and source of the staging mount of the demo volume on `node`, from the node's mount table. */
function stagingMount(node: string): { id: string; source: string } | undefined {
  const line = demoNode(node)
    .mountinfo?.()
    .split("\n")
    .find((l) => /\/plugins\/kubernetes\.io\/csi\/storage\.distort\.io\/[0-9a-f]+\/globalmount /.test(l));
  if (!line) return undefined;
  const f = line.split(" ");
  return { id: f[0] as string, source: f[f.indexOf("-") + 2] as string };
}

test("kubelet restart with a volume staged: reconstruction, no second stage, data intact", async () => {
  // The demo's reader holds the volume on node-b.
  const before = stagingMount("node-b");
  expect(before).toBeDefined();
  const node = lab.nodes.find((n) => n.name === "node-b");
  await node?.restartKubelet();
  await waitFor("node-b Ready again after the kubelet restart", 120_000, async () => {
    const n = await core.readNode({ name: "node-b" });
    return n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True");
  });
  // Give the volume manager its reconstruction pass; the reader keeps running meanwhile.
  await waitFor("the reader Running with its volume after the restart", 60_000, async () => {
    const p = await core.readNamespacedPod({ name: "reader", namespace: "demo" });
    return p.status?.phase === "Running" && p.status.containerStatuses?.[0]?.restartCount === 0;
  });
  const after = stagingMount("node-b");
  expect(after).toEqual(before);
  await core.deleteNamespacedPod({ name: "reader", namespace: "demo" });
  await waitFor("the reader gone", 120_000, async () =>
    (await core.readNamespacedPod({ name: "reader", namespace: "demo" }).catch(() => undefined)) === undefined
      ? true
      : undefined,
  );
  const report = await runWorkload("verify-after-restart", "node-b", [
    "verify",
    `--bytes=${16 * 1024 * 1024}`,
    "--seed=distort-lab",
  ]);
  expect(report.ok).toBe(true);
}, 400_000);

/** The workload image the lab imported into every node. */
function workloadImage(): string {
  const ref = lab.images.images.workload?.ref;
  if (!ref) throw new Error("the lab built no workload image");
  return ref;
}

/** Runs the workload in a Pod on `node` against the demo PVC and returns its report. */
async function runWorkload(name: string, node: string, args: string[]): Promise<WorkloadReport> {
  await core.createNamespacedPod({
    namespace: "demo",
    body: workloadPod(name, node, "demo-data", args, workloadImage()),
  });
  const report = await waitFor(`${name} to finish`, 240_000, async () => {
    const p = await core.readNamespacedPod({ name, namespace: "demo" });
    if (p.status?.phase === "Failed") throw new Error(`${name} failed: ${JSON.stringify(p.status)}`);
    return p.status?.phase === "Succeeded" ? workloadReport(p) : undefined;
  });
  await core.deleteNamespacedPod({ name, namespace: "demo" });
  await waitFor(`${name} gone`, 120_000, async () =>
    (await core.readNamespacedPod({ name, namespace: "demo" }).catch(() => undefined)) === undefined
      ? true
      : undefined,
  );
  return report;
}

/** The node the demo volume lives on, from its NVMePartition. */
async function volumeNode(): Promise<string> {
  const pvc = await core.readNamespacedPersistentVolumeClaim({ name: "demo-data", namespace: "demo" });
  const pv = await core.readPersistentVolume({ name: pvc.spec?.volumeName as string });
  const [ns, name] = (pv.spec?.csi?.volumeHandle ?? "").split("/");
  const custom = lab.conn.api(k8s.CustomObjectsApi);
  const part = (await custom.getNamespacedCustomObject({
    group: "storage.distort.io",
    version: "v1alpha1",
    namespace: ns as string,
    plural: "nvmepartitions",
    name: name as string,
  })) as { spec: { nodeName: string } };
  return part.spec.nodeName;
}

/** A Pod that keeps writing files to the demo volume and reading each back, failing on any error. */
async function startLoopWriter(name: string, node: string): Promise<void> {
  // A writer an earlier failed test left would hold the volume.
  for (const p of (await core.listNamespacedPod({ namespace: "demo" })).items)
    if (p.metadata?.name?.startsWith("loop-")) await deletePod(p.metadata.name);
  const image = lab.images.images.workload?.ref as string;
  const script = [
    "i=0",
    "while true; do",
    "  dd if=/dev/urandom of=/data/loop.tmp bs=64k count=16 conv=fsync 2>/dev/null || { echo WRITE-FAILED $i; exit 1; }",
    "  a=$(sha256sum < /data/loop.tmp) || { echo READ-FAILED $i; exit 1; }",
    "  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null",
    "  b=$(sha256sum < /data/loop.tmp) || { echo READ-FAILED $i; exit 1; }",
    '  [ "$a" = "$b" ] || { echo MISMATCH $i; exit 1; }',
    "  i=$((i+1)); echo round $i",
    "done",
  ].join("\n");
  const pod = workloadPod(name, node, "demo-data", [], image);
  const c = pod.spec?.containers[0] as k8s.V1Container;
  c.command = ["/bin/sh", "-c", script];
  c.args = [];
  await core.createNamespacedPod({ namespace: "demo", body: pod });
  await waitFor(`${name} Running`, 180_000, async () => {
    const p = await core.readNamespacedPod({ name, namespace: "demo" });
    return p.status?.phase === "Running";
  });
}

/** A loop writer stopped or reported an I/O error. */
class WriterFailed extends Error {}

/** The loop writer's rounds so far; throws WriterFailed if it stopped or reported a failure. */
async function loopRounds(name: string): Promise<number> {
  const p = await core.readNamespacedPod({ name, namespace: "demo" });
  const log = String(await core.readNamespacedPodLog({ name, namespace: "demo" }));
  if (
    /FAILED|MISMATCH/.test(log) ||
    p.status?.phase !== "Running" ||
    (p.status.containerStatuses?.[0]?.restartCount ?? 0) > 0
  )
    throw new WriterFailed(
      `${name} stopped writing: ${p.status?.phase}\n${log.split("\n").slice(-5).join("\n")}`,
    );
  return log.split("\n").filter((l) => l.startsWith("round ")).length;
}

async function deletePod(name: string): Promise<void> {
  await core.deleteNamespacedPod({ name, namespace: "demo" });
  await waitFor(`${name} gone`, 180_000, async () =>
    (await core.readNamespacedPod({ name, namespace: "demo" }).catch(() => undefined)) === undefined
      ? true
      : undefined,
  );
}

test("kill -9 of the node's nvmf_tgt container: kubelet restarts it, the agent re-adopts and replays, writes resume", async () => {
  const node = await volumeNode();
  await startLoopWriter("loop-target", "node-c");
  const before = await waitFor("a few rounds written", 60_000, async () =>
    (await loopRounds("loop-target")) >= 3 ? true : undefined,
  );
  expect(before).toBe(true);
  const target = distortProcesses().find(
    (p) => /nvmf_tgt/.test(p.cmd) && p.cgroup.includes(`/dlab-${node}/`),
  );
  expect(target).toBeDefined();
  process.kill(target?.pid as number, "SIGKILL");
  await waitFor("the nvmf-tgt container restarted by kubelet", 120_000, async () => {
    const st = (await targetPod(node))?.status?.containerStatuses?.find((c) => c.name === "nvmf-tgt");
    return (st?.restartCount ?? 0) >= 1 && st?.ready === true;
  });
  const after = await waitFor("the writer's log", 60_000, () => loopRounds("loop-target"));
  await waitFor("writes resumed after the target came back", 180_000, async () =>
    (await loopRounds("loop-target")) >= after + 3 ? true : undefined,
  );
  await deletePod("loop-target");
}, 600_000);

/** The nvmf_tgt Pod of a storage node (its own DaemonSet, agent.spdk.separateTarget). */
async function targetPod(node: string): Promise<k8s.V1Pod | undefined> {
  const pods = await core.listNamespacedPod({
    namespace: lab.namespace,
    fieldSelector: `spec.nodeName=${node}`,
  });
  return pods.items.find((p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "nvmf-tgt");
}

test("helm upgrade to a rebuilt image with a Pod writing: the agent is replaced, nvmf_tgt keeps serving, no I/O error", async () => {
  const node = await volumeNode();
  const tgtBefore = await targetPod(node);
  const tgtRestarts = tgtBefore?.status?.containerStatuses?.[0]?.restartCount;
  expect(tgtBefore?.metadata?.uid).toBeDefined();
  const tgtPid = distortProcesses().find(
    (p) => /nvmf_tgt/.test(p.cmd) && p.cgroup.includes(`/dlab-${node}/`),
  )?.pid;
  expect(tgtPid).toBeDefined();
  await startLoopWriter("loop-upgrade", "node-c");
  await waitFor("a few rounds written", 60_000, async () =>
    (await loopRounds("loop-upgrade")) >= 3 ? true : undefined,
  );
  const upgraded = await lab.rebuildImages(`${lab.images.tag}-r2`);
  await lab.helm([
    "upgrade",
    ...lab.chartArgs().map((a) => a.replace(lab.images.tag, upgraded)),
    "--wait",
    "--timeout=8m",
  ]);
  await waitFor("every DISTORT Pod but the targets running the rebuilt image", 300_000, async () => {
    const pods = await core.listNamespacedPod({ namespace: lab.namespace });
    // The spec names the image (the status may name another tag of the same digest). The
    // nvmf_tgt DaemonSet is OnDelete: an upgrade leaves its Pods alone.
    return pods.items.every(
      (p) =>
        p.metadata?.deletionTimestamp === undefined &&
        p.status?.phase === "Running" &&
        (p.status.containerStatuses ?? []).every((c) => c.ready) &&
        (p.metadata?.labels?.["app.kubernetes.io/component"] === "nvmf-tgt" ||
          (p.spec?.containers ?? []).every(
            (c) => !c.image?.startsWith("distort.lab/") || c.image.endsWith(`:${upgraded}`),
          )),
    );
  });
  // The volume's target is the very process it was: same Pod, no container restart, same pid.
  const tgtAfter = await targetPod(node);
  expect(tgtAfter?.metadata?.uid).toBe(tgtBefore?.metadata?.uid as string);
  expect(tgtAfter?.status?.containerStatuses?.[0]?.restartCount).toBe(tgtRestarts as number);
  expect(
    distortProcesses().find((p) => /nvmf_tgt/.test(p.cmd) && p.cgroup.includes(`/dlab-${node}/`))?.pid,
  ).toBe(tgtPid as number);
  const after = await waitFor("the writer's log", 60_000, () => loopRounds("loop-upgrade"));
  await waitFor("the writer keeps going after the upgrade", 180_000, async () =>
    (await loopRounds("loop-upgrade")) >= after + 3 ? true : undefined,
  );
  await deletePod("loop-upgrade");
  const report = await runWorkload("verify-after-upgrade", "node-b", [
    "verify",
    `--bytes=${16 * 1024 * 1024}`,
    "--seed=distort-lab",
  ]);
  expect(report.ok).toBe(true);
}, 900_000);

test("kill -9 of a whole node's kubelet and containerd: NotReady, back Ready, its Pod and volume intact", async () => {
  await startLoopWriter("loop-node", "node-c");
  await waitFor("a few rounds written", 60_000, async () =>
    (await loopRounds("loop-node")) >= 3 ? true : undefined,
  );
  const node = lab.nodes.find((n) => n.name === "node-c");
  if (!node) throw new Error("no node-c in the lab");
  await crashNode(lab.conn, node);
  await restoreNode(lab.conn, node);
  // The container kept running through the node's crash: its shim outlives kubelet and containerd.
  const after = await waitFor("the writer's log", 60_000, () => loopRounds("loop-node"));
  await waitFor("the writer still going", 120_000, async () =>
    (await loopRounds("loop-node")) >= after + 3 ? true : undefined,
  );
  await deletePod("loop-node");
  const report = await runWorkload("verify-after-node-kill", "node-b", [
    "verify",
    `--bytes=${16 * 1024 * 1024}`,
    "--seed=distort-lab",
  ]);
  expect(report.ok).toBe(true);
}, 600_000);

test("helm uninstall after the volumes are gone leaves nothing of DISTORT", async () => {
  await core.deleteNamespacedPersistentVolumeClaim({ name: "demo-data", namespace: "demo" });
  await waitFor("every DISTORT PV gone", 180_000, async () => {
    const pvs = await core.listPersistentVolume();
    return pvs.items.every((pv) => pv.spec?.csi?.driver !== "storage.distort.io");
  });
  // Each node is left clean before DISTORT goes: what kubelet unstaged, and what a kubelet killed
  // mid-detach forgot, which the node plugin's staging sweep unstages (csi.node.stagingSweepMs).
  const stagedOn = () =>
    lab.nodes.flatMap((n) =>
      readFileSync(`/proc/${n.holderPid}/mountinfo`, "utf8")
        .split("\n")
        .filter((l) => l.includes("storage.distort.io"))
        .map((l) => `${n.name}: ${l}`),
    );
  const leftAtFirst = stagedOn();
  if (leftAtFirst.length > 0)
    say(`mounted after every PV went (for the staging sweep): ${leftAtFirst.join("; ")}`);
  await waitFor("no DISTORT mount left on any node", 120_000, async () =>
    stagedOn().length === 0 ? true : undefined,
  ).catch((err: unknown) => {
    throw new Error(`${String(err)}; left: ${stagedOn().join("; ")}`);
  });
  for (const e of (await core.listNamespacedEvent({ namespace: lab.namespace })).items)
    if (e.reason === "ForgottenStagingUnstaged") say(`staging sweep: ${e.message}`);
  await lab.helm(["uninstall", lab.release, `--namespace=${lab.namespace}`, "--wait", "--timeout=3m"]);
  await waitFor("no DISTORT Pod left", 180_000, async () => {
    const pods = await core.listNamespacedPod({ namespace: lab.namespace });
    return pods.items.length === 0;
  });
  expect(distortProcesses().map((p) => p.cmd)).toEqual([]);
  const storage = lab.conn.api(k8s.StorageV1Api);
  expect((await storage.listCSIDriver()).items.map((d) => d.metadata?.name)).not.toContain(
    "storage.distort.io",
  );
  expect(
    (await storage.listStorageClass()).items
      .filter((s) => s.provisioner === "storage.distort.io")
      .map((s) => s.metadata?.name),
  ).toEqual([]);
  for (const n of lab.nodes) {
    const mounts = readFileSync(`/proc/${n.holderPid}/mountinfo`, "utf8")
      .split("\n")
      .filter((l) => l.includes("storage.distort.io"));
    expect(mounts).toEqual([]);
  }
}, 600_000);
