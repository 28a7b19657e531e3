// The lab: all of DISTORT on one machine, every component its own process with its own chart
// ServiceAccount token. Real control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, snapshot-controller), the chart's RBAC, CSIDriver and classes, the real CSI
// sidecars with the chart's arguments, the manager, storage nodes (emulated nvmf_tgt + agent; and
// kernel-backend nodes: simulated nvmet + agent on simulated configfs, loop-device drives) and
// consumer nodes (csi node + kubelet stand-in). Used by `bun run lab` and the e2e suites.

import { randomUUID } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { Discovery, ensure, type KubeDoc, render } from "../helm/chart-support.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { kubeError } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { socketAnswers } from "../lib/unix-socket.ts";
import { type ControlPlane, freePort, startControlPlane } from "./cluster/control-plane.ts";
import { installCrds } from "./cluster/crds.ts";
import { ensureHelm } from "./cluster/helm-tool.ts";
import { installSnapshotCrds } from "./cluster/snapshot-crds.ts";
import { ensureSidecars, ensureTools, type SidecarPaths } from "./cluster/tools.ts";
import { claimAllDrives, waitCsiNodes } from "./harness/drive-claims.ts";
import { attachLoopDrives, type LoopDrives } from "./harness/loop-drives.ts";
import {
  applyChartRbac,
  type ChartComponent,
  type ComponentIdentity,
  writeComponentKubeconfigs,
} from "./harness/rbac.ts";
import { FABRIC_LABEL } from "./harness/stack.ts";
import { buildDriveSysfs, type SimNodeDrive } from "./harness/storage-node.ts";
import { ProcessTable } from "./procs.ts";
import { simConfigfs } from "./sim/configfs/sim-configfs.ts";

export const LAB_NAMESPACE = "distort-system";
export const LAB_RELEASE = "distort";
/** The chart values the lab installs with (relative to the chart directory). */
export const LAB_VALUES = "examples/lab.yaml";
const GiB = 1024 ** 3;
/** Tokens for a lab that may run all day. */
const LAB_TOKEN_SECONDS = 24 * 3600;
const BUN = process.execPath;
const ROOT = join(import.meta.dir, "..");

/** A simulated drive of a lab storage node. */
export type LabDrive = Omit<SimNodeDrive, "model">;

export interface LabOptions {
  /** State directory: logs, sockets, drive files, node roots. Must be absolute. */
  dir: string;
  progress?: (line: string) => void;
  storageNodes?: { name: string; drives: LabDrive[] }[];
  /** Kernel-backend storage nodes (default DEFAULT_KERNEL_NODES; [] for none). */
  kernelNodes?: { name: string; drives: LabDrive[] }[];
  consumerNodes?: string[];
  managerReplicas?: number;
  /** Also run a BlueField DPU node: the SNAP emulator and the dpu plugin (default true). */
  dpu?: boolean;
  /** Log level of DISTORT's own processes (their logs go to <dir>/logs). */
  logLevel?: "debug" | "info" | "warn" | "error";
}

export interface LabStorageNode {
  name: string;
  dir: string;
  spdkSocket: string;
  drives: LabDrive[];
  /** Process names: the emulated nvmf_tgt and the agent. */
  target: string;
  agent: string;
  /** The node's portal addresses, the primary first: every export listens on each (multipath). */
  portals: string[];
}

/**
 * A kernel-backend storage node: the agent (DISTORT_BACKENDS=kernel, lab/kernel-agent.ts) writes
 * the simulated configfs under `hostRoot`, the simulated nvmet process serves the fabric from it,
 * and the drives are loop devices the agent knows as /dev/nvme<i>n1.
 */
export interface LabKernelNode {
  name: string;
  dir: string;
  /** The node's host root: sys/kernel/config/nvmet, sys/kernel/debug/nvmet, sys/class/nvme. */
  hostRoot: string;
  /** Absolute path of the node's nvmet configfs directory. */
  nvmetDir: string;
  drives: LabDrive[];
  /** nvme name -> loop device name of each drive. */
  loops: Readonly<Record<string, string>>;
  /** Process names: the simulated nvmet (the node's kernel target) and the agent. */
  target: string;
  agent: string;
}

export interface LabConsumerNode {
  name: string;
  /** The node's host root: etc/nvme/hostnqn, var/lib/kubelet. */
  root: string;
  kubeletRoot: string;
  csiSocket: string;
  /** Process names: csi node plugin and kubelet stand-in. */
  csi: string;
  kubelet: string;
  /** Process name of the node's NVMe-oF host daemon, and its control socket. */
  host: string;
  hostSocket: string;
}

export interface LabDpuNode {
  name: string;
  hostNqn: string;
  /** The plugin's socket, where DPF's SNAP node driver would call it. */
  pluginSocket: string;
  snapSocket: string;
  /** Process names: SNAP (an emulated SPDK app) and the plugin. */
  snap: string;
  plugin: string;
}

export interface Lab {
  dir: string;
  kubeconfigPath: string;
  /** The admin connection. */
  conn: KubeConnection;
  namespace: string;
  cp: ControlPlane;
  procs: ProcessTable;
  identities: Map<ChartComponent, ComponentIdentity>;
  storage: LabStorageNode[];
  kernelStorage: LabKernelNode[];
  consumers: LabConsumerNode[];
  /** The DPU node: SNAP emulator and the DPF vendor plugin, when started. */
  dpu?: LabDpuNode;
  /** Process names of the manager replicas and the CSI controller. */
  managers: string[];
  csiController: string;
  csiControllerSocket: string;
  fabricDir: string;
  /** Stops every process (the control plane last). The state directory stays for `sweepLab`. */
  stop(): Promise<void>;
}

export const DEFAULT_STORAGE_NODES = [
  {
    name: "storage-a",
    drives: [
      { serial: "LABA0001", pciAddress: "0000:5e:00.0", sizeBytes: 32 * GiB },
      { serial: "LABA0002", pciAddress: "0000:5f:00.0", sizeBytes: 32 * GiB },
    ],
  },
  {
    name: "storage-b",
    drives: [
      { serial: "LABB0001", pciAddress: "0000:5e:00.0", sizeBytes: 32 * GiB },
      { serial: "LABB0002", pciAddress: "0000:5f:00.0", sizeBytes: 32 * GiB },
    ],
  },
];
export const DEFAULT_CONSUMER_NODES = ["worker-a", "worker-b"];
/** One kernel-backend node with one drive: the backend's StorageClass (distort-lab-kernel) lands there. */
export const DEFAULT_KERNEL_NODES = [
  { name: "storage-k", drives: [{ serial: "LABK0001", pciAddress: "0000:5e:00.0", sizeBytes: 16 * GiB }] },
];

async function httpOk(url: string): Promise<boolean> {
  const r = await fetch(url, { signal: AbortSignal.timeout(1000) });
  return r.status === 200;
}

async function ensureObject(p: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
}

/** Starts the whole lab in `o.dir`. On failure everything started so far is stopped. */
export async function startLab(o: LabOptions): Promise<Lab> {
  const say = o.progress ?? (() => {});
  const dir = o.dir;
  const level = o.logLevel ?? "info";
  const namespace = LAB_NAMESPACE;
  mkdirSync(dir, { recursive: true });
  const t0 = performance.now();
  const ms = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

  say("tools: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl");
  const tools = await ensureTools();
  say("tools: CSI sidecars and snapshot-controller");
  const sidecars = await ensureSidecars();
  say("tools: helm");
  const helm = await ensureHelm();
  say(`tools ready (${ms()})`);

  const procs = new ProcessTable(dir, (l) => say(l));
  let cp: ControlPlane | undefined;
  const loopDrives: LoopDrives[] = [];
  let kernelStarting: Promise<LabKernelNode[]> | undefined;
  const stop = async () => {
    await procs.stopAll();
    for (const l of loopDrives) await l.detach();
    await cp?.stop();
  };
  try {
    cp = await startControlPlane({
      dir: join(dir, "cluster"),
      controllerManager: true,
      scheduler: true,
      tools,
      progress: (l) => say(l),
    });
    const kubeconfigPath = cp.kubeconfigPath;
    const conn = connect(kubeconfigPath);
    await installCrds(conn);
    await installSnapshotCrds(conn);
    say(`CRDs established (${ms()})`);

    const core = conn.api(k8s.CoreV1Api);
    await ensureObject(core.createNamespace({ body: { metadata: { name: namespace } } }));
    const rbac = await applyChartRbac(conn, {
      namespace,
      release: LAB_RELEASE,
      helm,
      // The snapshot sidecars' rules are rendered only with snapshots on, as LAB_VALUES has them.
      set: ["dpu.enabled=true", "snapshots.enabled=true"],
    });
    const idDir = join(dir, "identities");
    mkdirSync(idDir, { recursive: true, mode: 0o700 });
    const identities = await writeComponentKubeconfigs(conn, rbac, idDir, undefined, LAB_TOKEN_SECONDS);
    const kubeconfigOf = (c: ChartComponent) => {
      const id = identities.get(c);
      if (!id) throw new Error(`the chart has no ServiceAccount for ${c}`);
      return id.kubeconfigPath;
    };
    /** The csi binary's command line common to both modes (entry: the binary or the lab's node wrapper). */
    const csiCommand = (entry: string, mode: string, socket: string, kubeconfig: string, port: number) => [
      BUN,
      join(ROOT, entry),
      `--mode=${mode}`,
      `--endpoint=unix://${socket}`,
      `--kubeconfig=${kubeconfig}`,
      `--namespace=${namespace}`,
      `--health-port=${port}`,
      `--log-level=${level}`,
    ];
    const chart = await render(helm, { name: "lab", files: [LAB_VALUES], set: [] }, LAB_RELEASE, namespace);
    const discovery = new Discovery(conn);
    // The placement admission policy too: in the lab, as in a cluster, only the manager's
    // ServiceAccount may place a partition.
    const installed = [
      "CSIDriver",
      "StorageClass",
      "VolumeSnapshotClass",
      "PriorityClass",
      "ValidatingAdmissionPolicy",
      "ValidatingAdmissionPolicyBinding",
    ];
    for (const obj of chart.objects.filter((x) => installed.includes(x.kind))) {
      const { path } = await discovery.collectionPath(obj);
      await ensure(conn, path, obj);
    }
    say(
      `chart RBAC, CSIDriver, StorageClasses, VolumeSnapshotClass and admission policy installed (${ms()})`,
    );

    await procs.start({
      name: "snapshot-controller",
      argv: [
        sidecars.snapshotController,
        `--kubeconfig=${kubeconfigPath}`,
        "--leader-election=false",
        // Group snapshots: GA and on by default in v8.7, set explicitly (the group CRDs are installed).
        "--feature-gates=CSIVolumeGroupSnapshot=true",
        "--v=2",
      ],
    });

    // Storage nodes: an emulated nvmf_tgt each (a separate process, adopted by the agent, so either
    // can die alone), then the agent with the agent ServiceAccount's token.
    const fabricDir = join(dir, "fabric");
    mkdirSync(fabricDir, { recursive: true });
    // Kernel-backend nodes start beside the SPDK ones (their processes only meet at the claims).
    const spdkCount = (o.storageNodes ?? DEFAULT_STORAGE_NODES).length;
    kernelStarting = Promise.all(
      (o.kernelNodes ?? DEFAULT_KERNEL_NODES).map(async (n, j): Promise<LabKernelNode> => {
        const portal = `127.0.0.${spdkCount + j + 1}`;
        await ensureObject(
          core.createNode({
            body: {
              metadata: { name: n.name, labels: { "kubernetes.io/hostname": n.name, [FABRIC_LABEL]: "lab" } },
              spec: { unschedulable: true },
            },
          }),
        );
        return startKernelNode(procs, {
          dir,
          fabricDir,
          portal,
          name: n.name,
          drives: n.drives,
          loopDrives,
          agentEnv: (port) => ({
            NODE_NAME: n.name,
            KUBECONFIG: kubeconfigOf("agent"),
            DISTORT_NAMESPACE: namespace,
            DISTORT_BACKENDS: "kernel",
            DISTORT_KEY_DIR: join(dir, "storage", n.name, "keys"),
            DISTORT_PORTAL_ADDRESS: portal,
            DISTORT_PORTAL_PORT: "4420",
            DISTORT_HEALTH_PORT: String(port),
            DISTORT_REPORT_PERIOD_MS: "2000",
            DISTORT_VERIFY_PERIOD_MS: "5000",
            DISTORT_LOG_LEVEL: level,
          }),
        });
      }),
    );
    // Awaited below (or by the failure path); this only keeps an early rejection from going unseen.
    kernelStarting.catch(() => {});
    const storage: LabStorageNode[] = [];
    for (const [i, n] of (o.storageNodes ?? DEFAULT_STORAGE_NODES).entries()) {
      // Two portal addresses per node (two paths to every volume, as with two NICs), none shared:
      // on a shared fabric an address has exactly one listener.
      const portals = [`127.0.0.${i + 1}`, `127.0.1.${i + 1}`];
      await ensureObject(
        core.createNode({
          body: {
            metadata: { name: n.name, labels: { "kubernetes.io/hostname": n.name, [FABRIC_LABEL]: "lab" } },
            // Storage nodes run no consumer Pods in the lab.
            spec: { unschedulable: true },
          },
        }),
      );
      const nd = join(dir, "storage", n.name);
      const hostRoot = join(nd, "host");
      const drives = n.drives.map((d) => ({ ...d, model: "DISTORT LAB NVMe" }));
      await buildDriveSysfs(hostRoot, drives);
      const drivesFile = join(nd, "drives.json");
      writeFileSync(drivesFile, JSON.stringify(drives));
      const spdkSocket = join(nd, "spdk.sock");
      const target = `nvmf_tgt/${n.name}`;
      await procs.start({
        name: target,
        // The node has its portal addresses only: a listener anywhere else fails as on a real node.
        argv: emulatorCommand(spdkSocket, join(nd, "drives"), fabricDir, [
          `--sim-drives=${drivesFile}`,
          `--sim-host-addresses=${portals.join(",")}`,
        ]),
        ready: () => spdkAnswers(spdkSocket),
      });
      const agent = `agent/${n.name}`;
      const agentPort = await freePort();
      await procs.start({
        name: agent,
        argv: [BUN, join(ROOT, "agent/main.ts")],
        env: {
          NODE_NAME: n.name,
          KUBECONFIG: kubeconfigOf("agent"),
          DISTORT_NAMESPACE: namespace,
          DISTORT_BACKENDS: "spdk",
          DISTORT_SPDK_SOCKET: spdkSocket,
          DISTORT_SPDK_CORE_MASK: "0x1",
          DISTORT_HOST_ROOT: hostRoot,
          DISTORT_KEY_DIR: join(nd, "keys"),
          DISTORT_PORTAL_ADDRESS: portals.join(","),
          DISTORT_PORTAL_PORT: "4420",
          DISTORT_HEALTH_PORT: String(agentPort),
          DISTORT_REPORT_PERIOD_MS: "2000",
          DISTORT_VERIFY_PERIOD_MS: "5000",
          DISTORT_LOG_LEVEL: level,
        },
        ready: () => httpOk(`http://127.0.0.1:${agentPort}/healthz`),
      });
      storage.push({ name: n.name, dir: nd, spdkSocket, drives: n.drives, target, agent, portals });
    }
    const kernelStorage = await kernelStarting;
    say(`storage nodes up: ${[...storage, ...kernelStorage].map((s) => s.name).join(", ")} (${ms()})`);

    const managers: string[] = [];
    for (let i = 0; i < (o.managerReplicas ?? 2); i++) {
      const name = `manager-${i}`;
      const port = await freePort();
      await procs.start({
        name,
        argv: [BUN, join(ROOT, "manager/main.ts")],
        env: {
          KUBECONFIG: kubeconfigOf("manager"),
          DISTORT_NAMESPACE: namespace,
          POD_NAME: name,
          DISTORT_LEADER_ELECT: "true",
          DISTORT_LEASE_DURATION_MS: "4000",
          DISTORT_RENEW_DEADLINE_MS: "3000",
          DISTORT_RETRY_PERIOD_MS: "500",
          DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "200",
          DISTORT_PLACEMENT_BACKOFF_MAX_MS: "2000",
          DISTORT_HEARTBEAT_STALENESS_MS: "20000",
          DISTORT_HEALTH_PORT: String(port),
          DISTORT_LOG_LEVEL: level,
        },
        ready: () => httpOk(`http://127.0.0.1:${port}/healthz`),
      });
      managers.push(name);
    }
    await claimAllDrives(
      conn,
      namespace,
      [...storage, ...kernelStorage].map((s) => ({ name: s.name, serials: s.drives.map((d) => d.serial) })),
      60_000,
    );
    say(
      `manager running (${managers.length} replicas), ${[...storage, ...kernelStorage].flatMap((s) => s.drives).length} drives claimed (${ms()})`,
    );

    // CSI controller: the distort binary and the chart's sidecars with the chart's arguments.
    const ctlDir = join(dir, "csi-controller");
    mkdirSync(ctlDir, { recursive: true });
    const csiControllerSocket = join(ctlDir, "csi.sock");
    const csiController = "csi-controller";
    const ctlPort = await freePort();
    await procs.start({
      name: csiController,
      argv: [
        ...csiCommand(
          "csi/main.ts",
          "controller",
          csiControllerSocket,
          kubeconfigOf("csi-controller"),
          ctlPort,
        ),
        // Short, so suites see an abandoned claim's partition collected within seconds.
        "--orphan-grace-ms=5000",
        "--orphan-sweep-ms=2000",
      ],
      ready: () => httpOk(`http://127.0.0.1:${ctlPort}/readyz`),
    });
    for (const [name, argv, env] of sidecarCommands(
      chart.objects,
      sidecars,
      csiControllerSocket,
      kubeconfigOf("csi-controller"),
      namespace,
    ))
      await procs.start({ name, argv, env });
    say(`CSI controller and sidecars running (${ms()})`);

    // Consumer nodes: the Node object first (as kubelet registers before plugins), then the CSI
    // node plugin, then the kubelet stand-in that talks to it.
    const consumers: LabConsumerNode[] = [];
    for (const name of o.consumerNodes ?? DEFAULT_CONSUMER_NODES) {
      const root = join(dir, "nodes", name);
      mkdirSync(join(root, "etc", "nvme"), { recursive: true });
      writeFileSync(
        join(root, "etc", "nvme", "hostnqn"),
        `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}\n`,
      );
      await ensureObject(
        core.createNode({
          body: {
            metadata: {
              name,
              labels: { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", [FABRIC_LABEL]: "lab" },
              annotations: { "volumes.kubernetes.io/controller-managed-attach-detach": "true" },
            },
          },
        }),
      );
      const csiSocket = join(root, "var/lib/kubelet/plugins", "storage.distort.io", "csi.sock");
      const kubeletRoot = join(root, "var/lib/kubelet");
      // The node's NVMe-oF host ("the kernel"): its own process, so the CSI node can die alone.
      // A private mount namespace keeps its FUSE mount out of every other process's mount table.
      const host = `nvme-host/${name}`;
      const hostSocket = join(root, "run", "nvme-host.sock");
      mkdirSync(join(root, "run"), { recursive: true });
      await procs.start({
        name: host,
        argv: [
          "unshare",
          "--mount",
          "--propagation",
          "private",
          BUN,
          join(ROOT, "lab/sim/fabric/host-daemon.ts"),
          `--fabric-dir=${fabricDir}`,
          `--state-dir=${join(root, "var/lib/nvme-host")}`,
          `--socket=${hostSocket}`,
          `--log-level=${level}`,
        ],
        ready: () => socketAnswers(hostSocket),
      });
      const csi = `csi-node/${name}`;
      const port = await freePort();
      await procs.start({
        name: csi,
        argv: [
          ...csiCommand("lab/csi-node.ts", "node", csiSocket, kubeconfigOf("csi-node"), port),
          `--node-id=${name}`,
          `--state-dir=${join(root, "var/lib/distort/csi")}`,
          `--host-root=${root}`,
          `--topology-keys=${FABRIC_LABEL}`,
          // The lab host shows namespaces as loop devices: losetup instead of nvme-cli.
          "--node-tools=losetup,blkid,mkfs.ext4,mkfs.xfs,mount,umount",
          `--sim-host-socket=${hostSocket}`,
        ],
        ready: () => httpOk(`http://127.0.0.1:${port}/readyz`),
      });
      const kubelet = `kubelet/${name}`;
      await procs.start({
        name: kubelet,
        argv: [
          BUN,
          join(ROOT, "lab/kubelet.ts"),
          `--kubeconfig=${kubeconfigPath}`,
          `--node-name=${name}`,
          `--csi-endpoint=unix://${csiSocket}`,
          `--root-dir=${kubeletRoot}`,
          `--label=${FABRIC_LABEL}=lab`,
          `--log-level=${level}`,
        ],
      });
      consumers.push({ name, root, kubeletRoot, csiSocket, csi, kubelet, host, hostSocket });
    }
    await waitCsiNodes(
      conn,
      consumers.map((c) => c.name),
      60_000,
    );
    say(`consumer nodes registered: ${consumers.map((c) => c.name).join(", ")} (${ms()})`);

    let dpu: LabDpuNode | undefined;
    if (o.dpu !== false) {
      const name = "dpu-a";
      const root = join(dir, "dpu", name);
      mkdirSync(root, { recursive: true });
      const hostNqn = `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}`;
      writeFileSync(join(root, "hostnqn"), `${hostNqn}\n`);
      await ensureObject(
        core.createNode({
          body: {
            metadata: { name, labels: { "kubernetes.io/hostname": name, [FABRIC_LABEL]: "lab" } },
            spec: { unschedulable: true },
          },
        }),
      );
      const snapSocket = join(root, "snap.sock");
      const snap = `snap/${name}`;
      await procs.start({
        name: snap,
        argv: emulatorCommand(snapSocket, join(root, "snap-data"), fabricDir, [`--sim-host-nqn=${hostNqn}`]),
        ready: () => spdkAnswers(snapSocket),
      });
      const pluginSocket = join(root, "plugins", "distort", "dpu.sock");
      // The plugin's NodeGetInfo socket, which the DPU node's kubelet stand-in registers into CSINode.
      const dpuCsiSocket = join(root, "var/lib/kubelet/plugins", "storage.distort.io-dpu", "csi.sock");
      const plugin = `dpu/${name}`;
      const port = await freePort();
      await procs.start({
        name: plugin,
        argv: [BUN, join(ROOT, "dpu/main.ts")],
        env: {
          KUBECONFIG: kubeconfigOf("dpu"),
          NODE_NAME: name,
          POD_NAMESPACE: namespace,
          DISTORT_DPU_SOCKET: pluginSocket,
          DISTORT_DPU_CSI_SOCKET: dpuCsiSocket,
          DISTORT_DPU_SNAP_SOCKET: snapSocket,
          DISTORT_DPU_HOST_NQN_FILE: join(root, "hostnqn"),
          DISTORT_DPU_STATE_DIR: join(root, "state"),
          DISTORT_DPU_KEY_DIR: join(root, "keys"),
          DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
          DISTORT_HEALTH_HOST: "127.0.0.1",
          DISTORT_HEALTH_PORT: String(port),
          DISTORT_LOG_LEVEL: level,
        },
        ready: () => httpOk(`http://127.0.0.1:${port}/readyz`),
      });
      // kubelet records the DPU's node ID (its host NQN) in CSINode, as on a real DPU node.
      await procs.start({
        name: `kubelet/${name}`,
        argv: [
          BUN,
          join(ROOT, "lab/kubelet.ts"),
          `--kubeconfig=${kubeconfigPath}`,
          `--node-name=${name}`,
          `--csi-endpoint=unix://${dpuCsiSocket}`,
          `--root-dir=${join(root, "var/lib/kubelet")}`,
          `--label=${FABRIC_LABEL}=lab`,
          `--log-level=${level}`,
        ],
      });
      await waitCsiNodes(conn, [name], 60_000);
      dpu = { name, hostNqn, pluginSocket, snapSocket, snap, plugin };
      say(`DPU node ${name}: SNAP emulator and the dpu plugin running (${ms()})`);
    }

    return {
      dir,
      kubeconfigPath,
      conn,
      namespace,
      cp,
      procs,
      identities,
      storage,
      kernelStorage,
      consumers,
      ...(dpu ? { dpu } : {}),
      managers,
      csiController,
      csiControllerSocket,
      fabricDir,
      stop,
    };
  } catch (err) {
    // A kernel node still starting would start processes after stopAll: let it settle first.
    await kernelStarting?.catch(() => {});
    await stop();
    throw err;
  }
}

/**
 * Starts one kernel-backend node: its sysfs (the drives as PCIe NVMe controllers), the drives as
 * loop devices, configfs with nvmet loaded, the simulated nvmet process on the lab's fabric, then
 * the agent writing that configfs.
 */
async function startKernelNode(
  procs: ProcessTable,
  o: {
    dir: string;
    fabricDir: string;
    portal: string;
    name: string;
    drives: LabDrive[];
    loopDrives: LoopDrives[];
    agentEnv: (healthPort: number) => Record<string, string>;
  },
): Promise<LabKernelNode> {
  const nd = join(o.dir, "storage", o.name);
  const hostRoot = join(nd, "host");
  mkdirSync(hostRoot, { recursive: true });
  await buildDriveSysfs(
    hostRoot,
    o.drives.map((d) => ({ ...d, model: "DISTORT LAB NVMe" })),
  );
  const loops = await attachLoopDrives(nd, o.drives);
  o.loopDrives.push(loops);
  const deviceMap = join(nd, "device-map.json");
  writeFileSync(deviceMap, JSON.stringify(loops.names));
  // The node boots with nvmet loaded: the root groups exist before either process starts.
  await simConfigfs(hostRoot).loadNvmet();
  const noticeSocket = join(nd, "nvmet.sock");
  const target = `nvmet/${o.name}`;
  await procs.start({
    name: target,
    argv: [
      BUN,
      join(ROOT, "lab/sim/nvmet/main.ts"),
      `--root=${hostRoot}`,
      `--fabric-dir=${o.fabricDir}`,
      `--notice-socket=${noticeSocket}`,
      `--device-map=${deviceMap}`,
      // Every agent write sends a notice; the rescan is only the backstop for one that timed out.
      "--watch-ms=5000",
    ],
    ready: () => socketAnswers(noticeSocket),
  });
  const agent = `agent/${o.name}`;
  const agentPort = await freePort();
  await procs.start({
    name: agent,
    argv: [
      BUN,
      join(ROOT, "lab/kernel-agent.ts"),
      `--sim-notice-socket=${noticeSocket}`,
      `--sim-device-map=${deviceMap}`,
    ],
    env: { ...o.agentEnv(agentPort), DISTORT_HOST_ROOT: hostRoot },
    ready: () => httpOk(`http://127.0.0.1:${agentPort}/healthz`),
  });
  return {
    name: o.name,
    dir: nd,
    hostRoot,
    nvmetDir: join(hostRoot, "sys/kernel/config/nvmet"),
    drives: o.drives,
    loops: loops.names,
    target,
    agent,
  };
}

/** The emulated SPDK application (nvmf_tgt, or SNAP on a DPU) on one core, joined to the lab's fabric. */
function emulatorCommand(socket: string, dataDir: string, fabricDir: string, extra: string[]): string[] {
  return [
    BUN,
    join(ROOT, "lab/sim/spdk/nvmf-tgt.ts"),
    "-m",
    "0x1",
    "-r",
    socket,
    `--sim-data-dir=${dataDir}`,
    `--sim-fabric-dir=${fabricDir}`,
    ...extra,
  ];
}

/** True when an SPDK RPC socket answers spdk_get_version. */
async function spdkAnswers(socketPath: string): Promise<boolean> {
  const c = new SpdkClient({ socketPath, logger: createLogger({ level: "error" }), callTimeoutMs: 1000 });
  try {
    await c.call("spdk_get_version");
    return true;
  } finally {
    await c.close();
  }
}

/**
 * The chart's CSI controller sidecars as lab commands: each container's own arguments from the
 * rendered Deployment, with the socket path pointed at the lab's and the component's kubeconfig,
 * and the environment its fieldRefs would give. The lab runs no controller Pod, so the
 * provisioner's CSIStorageCapacity objects get no owner (--capacity-ownerref-level=-1, POD_NAME
 * unset; the chart's Deployment owns them on a cluster) and NAMESPACE is `namespace`.
 */
export function sidecarCommands(
  objects: KubeDoc[],
  bins: SidecarPaths,
  socketPath: string,
  kubeconfig: string,
  namespace: string,
): [string, string[], Record<string, string>][] {
  const dep = objects.find(
    (x) => x.kind === "Deployment" && x.metadata.labels?.["app.kubernetes.io/component"] === "csi-controller",
  ) as
    | (KubeDoc & {
        spec: {
          template: {
            spec: {
              containers: {
                name: string;
                args?: string[];
                env?: { name: string; valueFrom?: { fieldRef?: { fieldPath: string } } }[];
              }[];
            };
          };
        };
      })
    | undefined;
  if (!dep) throw new Error("the chart renders no csi-controller Deployment");
  const binOf: Record<string, string> = {
    "csi-provisioner": bins.provisioner,
    "csi-attacher": bins.attacher,
    "csi-resizer": bins.resizer,
    "csi-snapshotter": bins.snapshotter,
  };
  const out: [string, string[], Record<string, string>][] = [];
  for (const c of dep.spec.template.spec.containers) {
    const bin = binOf[c.name];
    if (!bin) continue;
    const args = (c.args ?? []).map((a) =>
      a.startsWith("--capacity-ownerref-level=")
        ? "--capacity-ownerref-level=-1"
        : a.replace("/csi/csi.sock", socketPath),
    );
    const env: Record<string, string> = {};
    for (const e of c.env ?? [])
      if (e.valueFrom?.fieldRef?.fieldPath === "metadata.namespace") env[e.name] = namespace;
    out.push([c.name, [bin, ...args, `--kubeconfig=${kubeconfig}`], env]);
  }
  if (out.length < 3)
    throw new Error(
      `expected the provisioner, attacher and resizer in the chart, found ${out.map((x) => x[0])}`,
    );
  return out;
}
