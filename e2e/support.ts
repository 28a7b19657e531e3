// What every end-to-end suite needs: the running lab (the real-cluster lab of the run, which
// e2e/cluster-preload.ts started: scripts/e2e-cluster.ts), its processes by name for fault
// injection, and the user-level steps (PVCs, workload Pods, waits) expressed through the real API.
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { workloadPod as demoWorkloadPod, type WorkloadReport, workloadReport } from "../lab/demo.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { kubeError } from "../lib/kube/resource.ts";
import { clusterBackend, sharedRealLab } from "./cluster-backend.ts";

export { type WorkloadReport, workloadReport };

/** The workload image of the lab the suites run on (set by e2eLab()). */
let workloadImage: string | undefined;

/**
 * A Pod running the lab workload on `node` against PVC `claim`, in the workload image of the lab
 * this run uses (the one e2eLab() returned).
 */
export function workloadPod(name: string, node: string, claim: string, args: string[]): k8s.V1Pod {
  if (!workloadImage)
    throw new Error("workloadPod before e2eLab(): the lab's workload image is not known yet");
  return demoWorkloadPod(name, node, claim, args, workloadImage);
}

/** A DPU node as the suites reach it. */
export interface LabDpuInfo {
  name: string;
  /** The NQN SNAP connects to targets as (the DPU's hostnqn). */
  hostNqn: string;
  /** The plugin's socket, where DPF's SNAP node driver calls it. */
  pluginSocket: string;
  /** SNAP's JSON-RPC socket (the lab's SNAP stand-in, an emulated SPDK application). */
  snapSocket: string;
  /** The address SNAP's host-facing NVMe-oF listeners take (the DPU's node IP on the cluster). */
  address: string;
}

/** A consumer node: its kubelet's root (as a host path), its CSI node plugin, kubelet, NVMe host. */
export interface LabConsumerInfo {
  name: string;
  kubeletRoot: string;
  /** Process names of its CSI node plugin and kubelet (pid(), kill()). */
  csi: string;
  kubelet: string;
  /** The control socket of the node's NVMe host driver (as `nvme connect` reaches the kernel). */
  hostSocket: string;
}

/** An SPDK-backend storage node: nvmf_tgt's RPC socket (a host path), its processes, its drives. */
export interface LabStorageInfo {
  name: string;
  spdkSocket: string;
  target: string;
  agent: string;
  serials: string[];
}

/** A kernel-backend storage node: nvmet's configfs directory (a host path), processes, drives. */
export interface LabKernelInfo {
  name: string;
  nvmetDir: string;
  target: string;
  agent: string;
  serials: string[];
}

/** What a suite knows of the running lab. */
export interface LabInfo {
  /** The lab's state directory. */
  dir: string;
  kubeconfig: string;
  /** The namespace DISTORT is installed in. */
  namespace: string;
  /** The chart release the lab installed and its values file (relative to helm/distort). */
  release: string;
  values: string;
  /** Process names of the managers and the CSI controller; the controller's socket (a host path). */
  managers: string[];
  csiController: string;
  csiControllerSocket: string;
  consumers: LabConsumerInfo[];
  storage: LabStorageInfo[];
  /** Kernel-backend storage nodes (nvmet on simulated configfs); [] where the lab has none. */
  kernelStorage: LabKernelInfo[];
  dpu?: LabDpuInfo;
}

export interface E2eLab extends LabInfo {
  conn: KubeConnection;
  core: k8s.CoreV1Api;
  storageApi: k8s.StorageV1Api;
  /** Current pid of a lab process (undefined while it is down). */
  pid(name: string): number | undefined;
  /** kill -9 (or `signal`) a lab process; the lab restarts it like a container. Resolves once it is gone. */
  kill(name: string, signal?: NodeJS.Signals): Promise<number>;
  /**
   * Names of every process the lab keeps running (what pid() knows): on the cluster, the Pods'
   * DISTORT containers and each node's kubelet and containerd.
   */
  processNames(): string[];
  /**
   * A consumer node's crash: kill -9 of its kubelet (and on the cluster its containerd, until the
   * Node is NotReady; the Pods' containers keep running). Resolves with the killed kubelet's pid;
   * restoreNode() brings the node back.
   */
  crashNode(node: string): Promise<number>;
  /** Brings a crashed node back: its daemons start again and it is Ready. */
  restoreNode(node: string): Promise<void>;
  /**
   * The node stops in place, as a paused VM: its Pods' processes frozen, its daemons stopped, its
   * sockets open. thawNode() lets it run on.
   */
  freezeNode(node: string): Promise<void>;
  /** Lets a frozen node run on. */
  thawNode(node: string): Promise<void>;
  /** Waits until `name` runs again with a pid other than `oldPid`. */
  waitRestarted(name: string, oldPid: number, timeoutMs?: number): Promise<number>;
  /**
   * A node's mount table (mountinfo text) with mount points as host paths, so that they compare
   * with `kubeletRoot` (the node's mount namespace seen from the host).
   */
  mountinfo(node: string): string;
  /** Mount points of a node's mount table (see mountinfo). */
  mountPoints(node: string): string[];
  /** A fresh namespace for one test. */
  newNamespace(prefix?: string): Promise<string>;
  stop(): Promise<void>;
}

/**
 * The lab for a suite: the run's real-cluster lab, which e2e/cluster-preload.ts started (run the
 * suites through scripts/e2e-cluster.ts); stop() leaves it to the preload.
 */
export async function e2eLab(): Promise<E2eLab> {
  const real = sharedRealLab();
  if (!real)
    throw new Error(
      "no real-cluster lab in this run: e2e suites run through `bun scripts/e2e-cluster.ts [files]`, whose preload starts one",
    );
  const backend = await clusterBackend(real);
  workloadImage = backend.workloadImage;
  return makeE2eLab(backend.info, backend);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z ");
  } catch {
    return false;
  }
}

/** What a lab backend provides to the suites' view of it. */
type LabBackend = Pick<
  E2eLab,
  "pid" | "mountinfo" | "processNames" | "crashNode" | "restoreNode" | "freezeNode" | "thawNode"
>;

/** The suites' lab over a backend's process ids, mount tables and node faults; stop() does nothing. */
function makeE2eLab(info: LabInfo, backend: LabBackend): E2eLab {
  const conn = connect(info.kubeconfig);
  const { pid, mountinfo } = backend;
  return {
    ...info,
    conn,
    core: conn.api(k8s.CoreV1Api),
    storageApi: conn.api(k8s.StorageV1Api),
    pid,
    processNames: backend.processNames,
    crashNode: backend.crashNode,
    restoreNode: backend.restoreNode,
    freezeNode: backend.freezeNode,
    thawNode: backend.thawNode,
    async kill(name, signal = "SIGKILL") {
      const p = pid(name);
      if (p === undefined) throw new Error(`lab process ${name} is not running`);
      process.kill(p, signal);
      while (alive(p)) await Bun.sleep(20);
      return p;
    },
    mountinfo,
    mountPoints: (node) =>
      mountinfo(node)
        .split("\n")
        .map((l) => l.split(" ")[4] ?? "")
        .filter((m) => m !== ""),
    async waitRestarted(name, oldPid, timeoutMs = 60_000) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const p = pid(name);
        if (p !== undefined && p !== oldPid) return p;
        if (Date.now() > until) throw new Error(`${name} did not restart within ${timeoutMs} ms`);
        await Bun.sleep(50);
      }
    },
    async newNamespace(prefix = "e2e") {
      const name = `${prefix}-${randomBytes(3).toString("hex")}`;
      await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name } } });
      return name;
    },
    async stop() {},
  };
}

/** Thrown inside an `until` callback to stop polling at once (the state is final, e.g. a Failed Pod). */
export class FinalError extends Error {}

/**
 * Polls `fn` until it returns a value other than undefined/false; fails with `what` after
 * timeoutMs. Errors thrown by `fn` are retried, except FinalError, which ends the wait at once.
 */
export async function until<T>(
  what: string,
  fn: () => Promise<T | undefined | false>,
  timeoutMs = 120_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      if (err instanceof FinalError) throw err;
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await Bun.sleep(100);
  }
}

export async function createPvc(
  lab: E2eLab,
  ns: string,
  name: string,
  o: {
    storageClass?: string;
    size?: string;
    dataSource?: k8s.V1TypedLocalObjectReference;
    accessModes?: string[];
  } = {},
): Promise<void> {
  await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        accessModes: o.accessModes ?? ["ReadWriteOnce"],
        storageClassName: o.storageClass ?? "distort-lab",
        resources: { requests: { storage: o.size ?? "1Gi" } },
        ...(o.dataSource ? { dataSource: o.dataSource } : {}),
      },
    },
  });
}

/** Runs a workload Pod to completion on `node` and returns its report; throws if it fails. */
export async function runWorkload(
  lab: E2eLab,
  ns: string,
  pod: string,
  node: string,
  claim: string,
  args: string[],
  timeoutMs = 180_000,
): Promise<WorkloadReport> {
  await lab.core.createNamespacedPod({ namespace: ns, body: workloadPod(pod, node, claim, args) });
  return waitWorkload(lab, ns, pod, timeoutMs);
}

export async function waitWorkload(
  lab: E2eLab,
  ns: string,
  pod: string,
  timeoutMs = 180_000,
): Promise<WorkloadReport> {
  return until(
    `Pod ${ns}/${pod} to finish`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name: pod, namespace: ns });
      if (p.status?.phase === "Failed")
        throw new FinalError(
          `Pod ${pod} failed: ${p.status.message ?? JSON.stringify(p.status.containerStatuses)}`,
        );
      return p.status?.phase === "Succeeded" ? workloadReport(p) : undefined;
    },
    timeoutMs,
  );
}

/** Deletes a Pod and waits until it is gone (its kubelet unpublished and unstaged the volume). */
export async function deletePod(lab: E2eLab, ns: string, pod: string, timeoutMs = 120_000): Promise<void> {
  try {
    await lab.core.deleteNamespacedPod({ name: pod, namespace: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  await until(
    `Pod ${ns}/${pod} gone`,
    async () => !(await lab.core.readNamespacedPod({ name: pod, namespace: ns }).catch(() => undefined)),
    timeoutMs,
  );
}

/**
 * For a failing test: the last `last` lines matching `pattern` of a node's component logs, on
 * stderr. A component is "nvme-host" (the node's NVMe host driver) or part of a Pod's name
 * ("csi-node", "agent"): the node's own logs (`nodes/<node>/logs/`) and its kubelet's Pod logs
 * (`nodes/<node>/var-log/pods/<ns>_<pod>_<uid>/...`).
 */
export function dumpNodeLogs(
  lab: Pick<LabInfo, "dir">,
  node: string,
  components: readonly string[],
  pattern: RegExp,
  last = 40,
): void {
  const files = (component: string): string[] => {
    const nodeDir = join(lab.dir, "nodes", node);
    const out = [join(nodeDir, "logs", `${component}.log`)].filter((f) => existsSync(f));
    const pods = join(nodeDir, "var-log", "pods");
    if (!existsSync(pods)) return out;
    for (const pod of readdirSync(pods).filter((d) => d.includes(component)))
      for (const container of readdirSync(join(pods, pod)))
        for (const f of readdirSync(join(pods, pod, container)).filter((x) => x.endsWith(".log")))
          out.push(join(pods, pod, container, f));
    return out;
  };
  for (const component of components)
    for (const f of files(component)) {
      const lines = readFileSync(f, "utf8")
        .split("\n")
        .filter((l) => pattern.test(l));
      process.stderr.write(`--- ${node} ${component}: ${f} ---\n${lines.slice(-last).join("\n")}\n`);
    }
}

/** What a suite made in its namespace, deleted at its end: Pods first, then claims, the namespace, a StorageClass. Errors (already gone) are ignored. */
export async function removeSuiteObjects(
  lab: E2eLab,
  ns: string,
  o: { pods?: readonly string[]; claims?: readonly string[]; storageClass?: string },
): Promise<void> {
  for (const p of o.pods ?? []) await deletePod(lab, ns, p, 180_000).catch(() => {});
  for (const c of o.claims ?? [])
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name: c, namespace: ns }).catch(() => {});
  await lab.core.deleteNamespace({ name: ns }).catch(() => {});
  if (o.storageClass) await lab.storageApi.deleteStorageClass({ name: o.storageClass }).catch(() => {});
}

/** The partition behind a bound PVC: [namespace, name] from the volume handle <ns>/<partition>/<uid>. */
export async function partitionOf(
  lab: E2eLab,
  ns: string,
  claim: string,
): Promise<{ namespace: string; name: string; pv: string }> {
  return until(`PVC ${ns}/${claim} bound`, async () => {
    const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: claim, namespace: ns });
    if (pvc.status?.phase !== "Bound" || !pvc.spec?.volumeName) return undefined;
    const pv = await lab.core.readPersistentVolume({ name: pvc.spec.volumeName });
    const [pns, pname] = (pv.spec?.csi?.volumeHandle ?? "").split("/");
    return pns && pname ? { namespace: pns, name: pname, pv: pvc.spec.volumeName } : undefined;
  });
}
