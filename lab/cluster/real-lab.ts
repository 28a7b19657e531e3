// The real-cluster lab: a control plane, three real kubelet nodes (containerd, runc, CNI,
// kube-proxy) in their own network and mount namespaces, DISTORT's images built here and imported
// into every node, and DISTORT installed only by `helm install` of helm/distort with the lab
// values. Node-level stand-ins (the NVMe host driver of each node, the drives' files and sysfs)
// play the machine's hardware and kernel; every DISTORT process is a container under a kubelet.

import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { connect, type KubeConnection } from "../../lib/kube/connection.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import { socketAnswers } from "../../lib/unix-socket.ts";
import { claimAllDrives, waitCsiNodes } from "../harness/drive-claims.ts";
import { FABRIC_LABEL } from "../harness/stack.ts";
import { loopDevices } from "../sweep.ts";
import { type ControlPlane, startControlPlane } from "./control-plane.ts";
import { markDpuNode, startSnap } from "./dpu-node.ts";
import { ensureHelm } from "./helm-tool.ts";
import { type BuiltImages, buildImages, importAll } from "./images.ts";
import {
  detachKernelLoops,
  killRecordedKernelTarget,
  prepareKernelNode,
  startKernelTarget,
  stopKernelTarget,
} from "./kernel-node.ts";
import { BRIDGE_ADDRESS, ensureBridge, SERVICE_CIDR } from "./node-network.ts";
import { inNode, type LabNode, startNodes, teardownNodes } from "./nodes.ts";
import { pauseImageSpec, writeOciArchive } from "./oci-image.ts";
import { type LabDrive, NODE_PATHS, prepareLabNode } from "./storage-prep.ts";
import { ensureSidecars, ensureTools } from "./tools.ts";

export const REAL_LAB_NAMESPACE = "distort-system";
export const REAL_LAB_RELEASE = "distort";
/** The values file the lab installs the chart with (relative to helm/distort). */
export const REAL_LAB_VALUES = "examples/lab-cluster.yaml";
export const STORAGE_LABEL = "storage.distort.io/storage-node";
const ROOT = join(import.meta.dir, "..", "..");
export const CHART_DIR = join(ROOT, "helm", "distort");
const GiB = 1024 ** 3;
/** Images built but not imported into the nodes: nothing in the lab values runs them. */
const NOT_IMPORTED = new Set(["agent"]);
/** Images only a DPU node runs (the plugin), and those it does not (the CSI node's, the workload's). */
const DPU_ONLY = new Set(["dpu"]);

/**
 * One node of the lab: its name, whether it is a storage node (agent + emulated target), its
 * drives; `kernel`: a kernel-backend storage node instead (the kernel agent variant, nvmet on
 * simulated configfs, the drives loop devices: lab/cluster/kernel-node.ts), with `storage` false;
 * `dpu`: a BlueField DPU node instead (the chart's DPU plugin, the SNAP stand-in:
 * lab/cluster/dpu-node.ts), no consumer, no NVMe host driver, no drives.
 */
export interface RealLabNodeSpec {
  name: string;
  storage: boolean;
  kernel?: boolean;
  dpu?: boolean;
  drives: LabDrive[];
}

/** The storage label's value on a kernel-backend node (the lab values' kernel agent variant selects it). */
export const KERNEL_STORAGE_LABEL_VALUE = "kernel";

/**
 * Three SPDK storage nodes (node-a, node-b, node-c: a replicated volume's three copies on distinct
 * nodes), one kernel-backend storage node (node-k) and the DPU node node-d; every node but the DPU
 * is a consumer.
 */
export const REAL_LAB_NODES: RealLabNodeSpec[] = [
  {
    name: "node-a",
    storage: true,
    drives: [
      { serial: "LABA0001", pciAddress: "0000:5e:00.0", sizeBytes: 32 * GiB },
      { serial: "LABA0002", pciAddress: "0000:5f:00.0", sizeBytes: 32 * GiB },
    ],
  },
  {
    name: "node-b",
    storage: true,
    drives: [
      { serial: "LABB0001", pciAddress: "0000:5e:00.0", sizeBytes: 32 * GiB },
      { serial: "LABB0002", pciAddress: "0000:5f:00.0", sizeBytes: 32 * GiB },
    ],
  },
  {
    name: "node-c",
    storage: true,
    drives: [
      { serial: "LABC0001", pciAddress: "0000:5e:00.0", sizeBytes: 32 * GiB },
      { serial: "LABC0002", pciAddress: "0000:5f:00.0", sizeBytes: 32 * GiB },
    ],
  },
  {
    name: "node-k",
    storage: false,
    kernel: true,
    drives: [{ serial: "LABK0001", pciAddress: "0000:5e:00.0", sizeBytes: 16 * GiB }],
  },
  { name: "node-d", storage: false, dpu: true, drives: [] },
];

export interface RealLabOptions {
  dir: string;
  progress?: (line: string) => void;
  nodes?: RealLabNodeSpec[];
}

export interface RealLab {
  dir: string;
  kubeconfigPath: string;
  conn: KubeConnection;
  namespace: string;
  release: string;
  cp: ControlPlane;
  nodes: LabNode[];
  specs: RealLabNodeSpec[];
  images: BuiltImages;
  helmBin: string;
  /** Pid of a node's NVMe host driver (the kernel stand-in), while it runs. */
  nvmeHostPid(node: string): number | undefined;
  /** Pid of a kernel node's simulated nvmet (its kernel target), while it runs. */
  nvmetPid(node: string): number | undefined;
  /**
   * Builds every image again under `tag` and imports it into every node (what an operator's new
   * release is); resolves with the tag for `helm upgrade`.
   */
  rebuildImages(tag: string): Promise<string>;
  /** Runs helm with the lab's kubeconfig; resolves with stdout, throws with stderr. */
  helm(args: string[]): Promise<string>;
  /** The `helm install|upgrade` arguments the lab uses (chart, namespace, values file, tag). */
  chartArgs(): string[];
  stop(): Promise<void>;
}

/** Starts the whole real-cluster lab in `o.dir`; on failure, everything started so far is stopped. */
export async function startRealLab(o: RealLabOptions): Promise<RealLab> {
  const say = o.progress ?? (() => {});
  const dir = o.dir;
  const specs = o.nodes ?? REAL_LAB_NODES;
  mkdirSync(dir, { recursive: true });
  const t0 = performance.now();
  const ms = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

  const tools = await ensureTools();
  await ensureSidecars();
  const helmBin = await ensureHelm();
  say(`tools ready (${ms()})`);
  const images = await buildImages({ progress: (l) => say(`  ${l}`) });
  say(`images ready: ${Object.keys(images.images).length} tagged ${images.tag} (${ms()})`);

  let cp: ControlPlane | undefined;
  let nodes: LabNode[] = [];
  const hosts = new Map<string, Subprocess>();
  const nvmets = new Map<string, Subprocess>();
  const stop = async () => {
    await stopNvmeHosts(hosts);
    await Promise.all([...nvmets.values()].map(stopKernelTarget));
    await Promise.all(nodes.map((n) => n.stop()));
    await teardownNodes(dir);
    for (const s of specs.filter((x) => x.kernel)) await detachKernelLoops(join(dir, "nodes", s.name));
    await cp?.stop();
  };
  try {
    for (const s of specs) {
      await prepareLabNode(join(dir, "nodes", s.name), s.storage ? { drives: s.drives } : {});
      if (s.kernel) await prepareKernelNode(join(dir, "nodes", s.name), s.drives);
    }
    const pause = writeOciArchive(pauseImageSpec(`distort.lab/pause:${images.tag}`));
    // The API server listens on the lab bridge's address: the bridge comes first.
    ensureBridge(dir);
    cp = await startControlPlane({
      dir: join(dir, "cluster"),
      controllerManager: true,
      scheduler: true,
      tools,
      cluster: { address: BRIDGE_ADDRESS, serviceCidr: SERVICE_CIDR },
      progress: (l) => say(l),
    });
    nodes = await startNodes(
      cp,
      specs.map((s) => ({
        name: s.name,
        labels: {
          [FABRIC_LABEL]: "lab",
          ...(s.storage ? { [STORAGE_LABEL]: "true" } : {}),
          ...(s.kernel ? { [STORAGE_LABEL]: KERNEL_STORAGE_LABEL_VALUE } : {}),
        },
      })),
      { dir, sandboxImage: pause.ref, images: [pause.path], progress: (l) => say(l) },
    );
    say(`nodes Ready: ${nodes.map((n) => `${n.name} ${n.ip}`).join(", ")} (${ms()})`);
    const isDpu = (name: string) => specs.find((s) => s.name === name)?.dpu === true;
    const dpuNodes = nodes.filter((n) => isDpu(n.name));
    // Every image is built (so each Containerfile is proven here); the nodes get the ones the lab
    // values run: not the production agent (SPDK); the DPU plugin only on a DPU node.
    await Promise.all(nodes.map((n) => importAll(n.containerdSocket, imagesFor(images, isDpu(n.name)))));
    say(`images imported into ${nodes.length} nodes (${ms()})`);
    for (const n of nodes.filter((x) => !isDpu(x.name))) hosts.set(n.name, await startNvmeHost(n));
    say(`NVMe host drivers running on ${hosts.size} nodes (${ms()})`);
    for (const n of nodes.filter((x) => specs.find((s) => s.name === x.name)?.kernel))
      nvmets.set(n.name, await startKernelTarget(n));

    const conn = connect(cp.kubeconfigPath);
    const kubeconfigPath = cp.kubeconfigPath;
    const helm = async (args: string[]) => {
      const p = Bun.spawn([helmBin, ...args, `--kubeconfig=${kubeconfigPath}`], {
        stdout: "pipe",
        stderr: "pipe",
      });
      const [out, err, code] = [
        await new Response(p.stdout).text(),
        await new Response(p.stderr).text(),
        await p.exited,
      ];
      if (code !== 0) throw new Error(`helm ${args[0]} failed (${code}): ${err.trim()}`);
      return out;
    };
    const chartArgs = () => [
      REAL_LAB_RELEASE,
      CHART_DIR,
      `--namespace=${REAL_LAB_NAMESPACE}`,
      `--values=${join(CHART_DIR, REAL_LAB_VALUES)}`,
      // --set would turn an all-digit short commit into a number, which the schema refuses.
      `--set-string=images.tag=${images.tag}`,
    ];
    // Before anything is scheduled: only the DPU's own DaemonSets may land there.
    for (const n of dpuNodes) await markDpuNode(conn, n.name);
    await installAddons(conn, images);
    const agentLab = images.images["agent-lab"];
    if (dpuNodes.length > 0 && !agentLab)
      throw new Error("no agent-lab image was built (the SNAP stand-in runs it)");
    if (agentLab) await startSnap(conn, agentLab.ref, dpuNodes);
    if (dpuNodes.length > 0)
      say(`DPU ${dpuNodes.map((n) => n.name).join(", ")}: SNAP stand-in answering (${ms()})`);
    await helm(["install", ...chartArgs(), "--create-namespace", "--wait", "--timeout=6m"]);
    say(`helm install ${REAL_LAB_RELEASE} done (${ms()})`);
    await claimAllDrives(
      conn,
      REAL_LAB_NAMESPACE,
      specs
        .filter((s) => s.storage || s.kernel)
        .map((s) => ({ name: s.name, serials: s.drives.map((d) => d.serial) })),
      120_000,
    );
    await waitCsiNodes(
      conn,
      specs.map((s) => s.name),
      120_000,
    );
    say(`drives claimed, the CSI driver registered by every kubelet (${ms()})`);
    const lab: RealLab = {
      dir,
      kubeconfigPath,
      conn,
      namespace: REAL_LAB_NAMESPACE,
      release: REAL_LAB_RELEASE,
      cp,
      nodes,
      specs,
      images,
      helmBin,
      helm,
      chartArgs,
      nvmeHostPid: (name) => hosts.get(name)?.pid,
      nvmetPid: (name) => {
        const p = nvmets.get(name);
        return p && p.exitCode === null && p.signalCode === null ? p.pid : undefined;
      },
      async rebuildImages(tag) {
        const again = await buildImages({ tag, progress: (l) => say(`  ${l}`) });
        await Promise.all(nodes.map((n) => importAll(n.containerdSocket, imagesFor(again, isDpu(n.name)))));
        return again.tag;
      },
      stop,
    };
    return lab;
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The images a node gets: what the lab values run there (the DPU plugin's only on a DPU node). */
function imagesFor(built: BuiltImages, dpu: boolean) {
  return Object.values(built.images).filter(
    (i): i is NonNullable<typeof i> => !!i && !NOT_IMPORTED.has(i.name) && (dpu || !DPU_ONLY.has(i.name)),
  );
}

/** The NVMe host driver's state directory inside a node: per node, so loop-device sweeps never cross nodes. */
export function nvmeHostStateDir(node: string): string {
  return `${NODE_PATHS.nvmeHostDir}/state-${node}`;
}

/**
 * Starts a node's NVMe-oF host driver: the stand-in for the node kernel's nvme-tcp, a node-level
 * process in the node's network and mount namespaces (as the kernel is there before any Pod), with
 * its control socket where the CSI node plugin's hostPath finds it. Tied to this process by a
 * parent-death signal; its pid is recorded under the node for `lab down` after a crash.
 */
async function startNvmeHost(n: LabNode): Promise<Subprocess> {
  const log = join(n.paths.logs, "nvme-host.log");
  const argv = inNode(n, [
    process.execPath,
    join(ROOT, "lab/sim/fabric/host-daemon.ts"),
    "--fabric=tcp",
    `--state-dir=${nvmeHostStateDir(n.name)}`,
    `--socket=${NODE_PATHS.nvmeHostSocket}`,
  ]);
  const p = Bun.spawn(argv, { cwd: ROOT, stdout: Bun.file(log), stderr: Bun.file(log), stdin: "ignore" });
  writeFileSync(join(n.paths.root, "nvme-host.pid"), String(p.pid));
  const socket = join(n.paths.run, NODE_PATHS.nvmeHostSocket.slice("/run/".length));
  const deadline = Date.now() + 30_000;
  while (!(await socketAnswers(socket).catch(() => false))) {
    if (p.exitCode !== null) throw new Error(`nvme host of ${n.name} exited with ${p.exitCode}; see ${log}`);
    if (Date.now() > deadline) throw new Error(`nvme host of ${n.name} not ready after 30 s; see ${log}`);
    await Bun.sleep(100);
  }
  return p;
}

/** Stops the NVMe host drivers (TERM: they detach their loop devices and unmount), KILL after 15 s. */
async function stopNvmeHosts(hosts: Map<string, Subprocess>): Promise<void> {
  await Promise.all(
    [...hosts.values()].map(async (p) => {
      if (p.exitCode !== null || p.signalCode !== null) return;
      p.kill("SIGTERM");
      const done = await Promise.race([p.exited.then(() => true), Bun.sleep(15_000).then(() => false)]);
      if (!done) {
        p.kill("SIGKILL");
        await p.exited;
      }
    }),
  );
  hosts.clear();
}

/**
 * Removes whatever a real-cluster lab in `dir` left, whether or not the process that started it is
 * alive (`lab down` after a crash): the NVMe host drivers recorded under each node (their loop
 * devices are detached), then every node and the lab network (teardownNodes). Idempotent.
 */
export async function teardownLeftovers(dir: string): Promise<void> {
  const nodesDir = join(dir, "nodes");
  if (existsSync(nodesDir)) {
    for (const name of readdirSync(nodesDir)) {
      const pidFile = join(nodesDir, name, "nvme-host.pid");
      if (!existsSync(pidFile)) continue;
      const pid = Number(readFileSync(pidFile, "utf8"));
      if (Number.isInteger(pid) && pid > 0) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // Already gone.
        }
      }
      rmSync(pidFile, { force: true });
    }
    for (const name of readdirSync(nodesDir)) killRecordedKernelTarget(join(nodesDir, name));
  }
  // Loop devices on a host driver's FUSE files: their backing path is the in-node state directory.
  for (const l of loopDevices()) {
    if (l.backFile.startsWith(`${NODE_PATHS.nvmeHostDir}/state-`)) {
      Bun.spawnSync(["losetup", "-d", l.name]);
    }
  }
  await teardownNodes(dir);
  if (existsSync(nodesDir))
    for (const name of readdirSync(nodesDir)) await detachKernelLoops(join(nodesDir, name));
}

/**
 * Cluster add-ons a real cluster has before DISTORT: the VolumeSnapshot CRDs, the
 * SnapshotMetadataService CRD (the chart's csi.controller.snapshotMetadata object is one) and
 * snapshot-controller (a cluster add-on, not part of the chart), run as a Deployment from the
 * image built here.
 */
async function installAddons(conn: KubeConnection, images: BuiltImages): Promise<void> {
  const { installSnapshotCrds, installSnapshotMetadataCrd } = await import("./snapshot-crds.ts");
  await installSnapshotCrds(conn);
  await installSnapshotMetadataCrd(conn);
  const core = conn.api(k8s.CoreV1Api);
  const rbac = conn.api(k8s.RbacAuthorizationV1Api);
  const apps = conn.api(k8s.AppsV1Api);
  const ns = "kube-system";
  await ignoreExists(
    core.createNamespacedServiceAccount({
      namespace: ns,
      body: { metadata: { name: "snapshot-controller" } },
    }),
  );
  await ignoreExists(
    rbac.createClusterRoleBinding({
      body: {
        metadata: { name: "lab-snapshot-controller" },
        // The add-on's own RBAC lives in its repository; the lab grants it cluster-admin.
        roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "cluster-admin" },
        subjects: [{ kind: "ServiceAccount", name: "snapshot-controller", namespace: ns }],
      },
    }),
  );
  const image = images.images["snapshot-controller"];
  if (!image) throw new Error("no snapshot-controller image was built");
  await ignoreExists(
    apps.createNamespacedDeployment({
      namespace: ns,
      body: {
        metadata: { name: "snapshot-controller", labels: { app: "snapshot-controller" } },
        spec: {
          replicas: 1,
          selector: { matchLabels: { app: "snapshot-controller" } },
          template: {
            metadata: { labels: { app: "snapshot-controller" } },
            spec: {
              serviceAccountName: "snapshot-controller",
              containers: [
                {
                  name: "snapshot-controller",
                  image: image.ref,
                  imagePullPolicy: "Never",
                  args: ["--leader-election=false", "--feature-gates=CSIVolumeGroupSnapshot=true", "--v=2"],
                },
              ],
            },
          },
        },
      },
    }),
  );
}

async function ignoreExists(p: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
}
