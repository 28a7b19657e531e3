// What every end-to-end suite needs: the running lab (the real-cluster lab of the run, which
// e2e/cluster-preload.ts started; else the process lab scripts/e2e.ts started, named by
// DISTORT_E2E_LAB, or one of the file's own), its processes by name for fault injection, and the
// user-level steps (PVCs, workload Pods, waits) expressed through the real API.
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { workloadPod as demoWorkloadPod, type WorkloadReport, workloadReport } from "../lab/demo.ts";
import {
  LAB_RELEASE,
  LAB_VALUES,
  type Lab,
  type LabConsumerNode,
  type LabKernelNode,
  type LabStorageNode,
  startLab,
} from "../lab/lab.ts";
import { sweepLab } from "../lab/sweep.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { kubeError } from "../lib/kube/resource.ts";
import { clusterBackend, sharedRealLab } from "./cluster-backend.ts";

export { type WorkloadReport, workloadReport };

/** The workload image of the lab the suites run on; undefined: the kubelet stand-in's own workload. */
let workloadImage: string | undefined;

/**
 * A Pod running the lab workload on `node` against PVC `claim`, in the image of the lab this run
 * uses (the one e2eLab() returned): the real cluster's workload image, or the stand-in's.
 */
export function workloadPod(name: string, node: string, claim: string, args: string[]): k8s.V1Pod {
  return demoWorkloadPod(name, node, claim, args, workloadImage);
}

/** True when workload Pods run in a real image (a real kubelet): the workload needs its target named. */
export function realWorkloadImage(): boolean {
  return workloadImage !== undefined;
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

/** What scripts/e2e.ts publishes in <dir>/e2e.json for the suites. */
export type LabInfo = Pick<
  Lab,
  "dir" | "namespace" | "managers" | "csiController" | "csiControllerSocket" | "fabricDir"
> & {
  dpu?: LabDpuInfo;
  kubeconfig: string;
  /** The chart release the lab installed (or renders, for the process lab) and its values file (relative to helm/distort). */
  release: string;
  values: string;
  /** hostSocket: the control socket of the node's NVMe host driver (as `nvme connect` reaches the kernel). */
  consumers: Pick<LabConsumerNode, "name" | "kubeletRoot" | "csi" | "kubelet" | "hostSocket">[];
  storage: (Pick<LabStorageNode, "name" | "spdkSocket" | "target" | "agent"> & { serials: string[] })[];
  /** Kernel-backend storage nodes (nvmet on simulated configfs); [] where the lab has none. */
  kernelStorage: (Pick<LabKernelNode, "name" | "nvmetDir" | "target" | "agent"> & { serials: string[] })[];
};

/** What a suite needs to know of a running lab, as JSON a second process can read. */
export function labInfo(lab: Lab): LabInfo {
  return {
    dir: lab.dir,
    kubeconfig: lab.kubeconfigPath,
    release: LAB_RELEASE,
    values: LAB_VALUES,
    namespace: lab.namespace,
    consumers: lab.consumers.map((c) => ({
      name: c.name,
      kubeletRoot: c.kubeletRoot,
      csi: c.csi,
      kubelet: c.kubelet,
      hostSocket: c.hostSocket,
    })),
    storage: lab.storage.map((s) => ({
      name: s.name,
      spdkSocket: s.spdkSocket,
      target: s.target,
      agent: s.agent,
      serials: s.drives.map((d) => d.serial),
    })),
    kernelStorage: lab.kernelStorage.map((s) => ({
      name: s.name,
      nvmetDir: s.nvmetDir,
      target: s.target,
      agent: s.agent,
      serials: s.drives.map((d) => d.serial),
    })),
    // The simulated fabric takes any address.
    ...(lab.dpu ? { dpu: { ...lab.dpu, address: "192.0.2.1" } } : {}),
    managers: lab.managers,
    csiController: lab.csiController,
    csiControllerSocket: lab.csiControllerSocket,
    fabricDir: lab.fabricDir,
  };
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
  /** Brings a crashed node back: on the cluster its daemons start again and it is Ready; the process lab restarts its kubelet itself. */
  restoreNode(node: string): Promise<void>;
  /** Waits until `name` runs again with a pid other than `oldPid`. */
  waitRestarted(name: string, oldPid: number, timeoutMs?: number): Promise<number>;
  /**
   * A node's mount table (mountinfo text) with mount points as host paths, so that they compare
   * with `kubeletRoot`: the host's own for the process lab, the node's mount namespace on the cluster.
   */
  mountinfo(node: string): string;
  /** Mount points of a node's mount table (see mountinfo). */
  mountPoints(node: string): string[];
  /** A fresh namespace for one test. */
  newNamespace(prefix?: string): Promise<string>;
  stop(): Promise<void>;
}

function readPids(dir: string): Record<string, number> {
  try {
    return JSON.parse(readFileSync(join(dir, "pids.json"), "utf8")) as Record<string, number>;
  } catch {
    return {};
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z ");
  } catch {
    return false;
  }
}

/**
 * The lab for a suite: the run's real-cluster lab when e2e/cluster-preload.ts started one (its
 * stop() leaves it to the preload), the shared process lab named by DISTORT_E2E_LAB (a directory
 * with e2e.json), or else a process lab of its own in a temporary directory that stop() takes
 * down and sweeps.
 */
export async function e2eLab(): Promise<E2eLab> {
  const real = sharedRealLab();
  if (real) {
    const backend = await clusterBackend(real);
    workloadImage = backend.workloadImage;
    return makeE2eLab(backend.info, backend);
  }
  workloadImage = undefined;
  const shared = process.env.DISTORT_E2E_LAB;
  let own: Lab | undefined;
  let info: LabInfo;
  if (shared) info = JSON.parse(readFileSync(join(shared, "e2e.json"), "utf8")) as LabInfo;
  else {
    const dir = mkdtempSync(join(tmpdir(), "distort-e2e-"));
    own = await startLab({ dir, progress: (l) => process.stderr.write(`[lab] ${l}\n`) });
    info = labInfo(own);
  }
  const pid = (name: string) => {
    const p = readPids(info.dir)[name];
    return p !== undefined && alive(p) ? p : undefined;
  };
  const kubeletOf = (node: string) => {
    const c = info.consumers.find((x) => x.name === node);
    if (!c) throw new Error(`no consumer node ${node} in the process lab`);
    return c.kubelet;
  };
  const lab = makeE2eLab(info, {
    pid,
    mountinfo: () => readFileSync("/proc/self/mountinfo", "utf8"),
    processNames: () => Object.keys(readPids(info.dir)),
    // The kubelet stand-in is the node's only daemon; the lab restarts it like a crashed node's.
    async crashNode(node) {
      const p = pid(kubeletOf(node));
      if (p === undefined) throw new Error(`${kubeletOf(node)} is not running`);
      process.kill(p, "SIGKILL");
      while (alive(p)) await Bun.sleep(20);
      return p;
    },
    async restoreNode() {},
  });
  return {
    ...lab,
    async stop() {
      if (!own) return;
      await own.stop();
      await sweepLab(own.dir);
      rmSync(own.dir, { recursive: true, force: true });
    },
  };
}

/** What a lab backend provides to the suites' view of it. */
type LabBackend = Pick<E2eLab, "pid" | "mountinfo" | "processNames" | "crashNode" | "restoreNode">;

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

/** Deletes a Pod and waits until it is gone (the kubelet stand-in unpublished and unstaged). */
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
 * ("csi-node", "agent"): the process lab's `<dir>/logs/<component>_<node>.log`, or on the
 * cluster the node's own logs and its kubelet's Pod logs (`var-log/pods/<ns>_<pod>_<uid>/...`).
 */
export function dumpNodeLogs(
  lab: Pick<LabInfo, "dir">,
  node: string,
  components: readonly string[],
  pattern: RegExp,
  last = 40,
): void {
  const files = (component: string): string[] => {
    const processLab = join(lab.dir, "logs", `${component}_${node}.log`);
    const nodeDir = join(lab.dir, "nodes", node);
    const out = [processLab, join(nodeDir, "logs", `${component}.log`)].filter((f) => existsSync(f));
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
