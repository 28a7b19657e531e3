// The e2e suites' view of the real-cluster lab: one lab shared by every suite of a `bun test` run
// (e2e/cluster-preload.ts starts and stops it), its LabInfo in host-visible paths, and the suites'
// process names mapped to the container processes of the Pods on the nodes.
import { mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { containerProcess } from "../lab/cluster/containers.ts";
import { dpuSockets } from "../lab/cluster/dpu-node.ts";
import { KERNEL_NODE_PATHS } from "../lab/cluster/kernel-node.ts";
import { crashNode, freezeNode, restoreNode, thawNode } from "../lab/cluster/node-faults.ts";
import { REAL_LAB_VALUES, type RealLab, startRealLab } from "../lab/cluster/real-lab.ts";
import { hostPathOf, NODE_PATHS } from "../lab/cluster/storage-prep.ts";
import type { LabInfo } from "./support.ts";

let shared: RealLab | undefined;
/** Set once the preload tried to start the lab: from then on the run has no other lab. */
let wanted = false;

/**
 * The real-cluster lab of this `bun test` run, when e2e/cluster-preload.ts started one. Throws
 * when the preload tried and failed (or the lab is stopped): suites must not fall back to a lab
 * of their own then.
 */
export function sharedRealLab(): RealLab | undefined {
  if (wanted && !shared)
    throw new Error("the run's real-cluster lab did not start (see the preload's error above)");
  return shared;
}

/** Starts the run's shared real-cluster lab in a temporary directory; resolves with it once installed. */
export async function startSharedRealLab(progress: (line: string) => void): Promise<RealLab> {
  if (shared) return shared;
  wanted = true;
  const dir = mkdtempSync(join(tmpdir(), "distort-cluster-"));
  try {
    shared = await startRealLab({ dir, progress });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  return shared;
}

/** Stops the shared lab (every node, the control plane) and removes its directory. Idempotent. */
export async function stopSharedRealLab(): Promise<void> {
  const lab = shared;
  shared = undefined;
  if (!lab) return;
  await lab.stop();
  rmSync(lab.dir, { recursive: true, force: true });
}

/** Consumer nodes in the order suites use them (first = the plain consumer, as the demo does). */
const CONSUMER_ORDER = ["node-c", "node-b", "node-a"];

/** What a role's container process looks like, by the prefix of the name pid() takes. */
const ROLE_COMMAND: Record<string, RegExp> = {
  // The SPDK nodes' agent, or the kernel node's (the agent with the lab's configfs and drive ports);
  // not the same binary in its target-watchdog mode, beside nvmf_tgt.
  agent: /distort-agent(-kernel-lab)?(\s|$)(?!.*--mode=target-watchdog)/,
  "target-watchdog": /distort-agent\s.*--mode=target-watchdog/,
  nvmf_tgt: /(^|\/)nvmf_tgt(\s|$)/,
  "csi-node": /distort-csi(-lab)?\s.*--mode=node/,
  // The DPF vendor plugin on a DPU node.
  dpu: /distort-dpu(\s|$)/,
};
const MANAGER = /distort-manager(\s|$)/;
const CSI_CONTROLLER = /distort-csi\s.*--mode=controller/;

/** The real-cluster lab as the suites use it: LabInfo, process ids by name, each node's mount table. */
export interface ClusterBackend {
  info: LabInfo;
  /** The workload image every workload Pod runs. */
  workloadImage: string;
  /** Current pid of a named process (a container's main process, or a node daemon). */
  pid(name: string): number | undefined;
  /** The node's mount table (mountinfo text), mount points as host paths (/proc/<holder>/root/...). */
  mountinfo(node: string): string;
  /** Every name pid() knows in this lab. */
  processNames(): string[];
  /** kill -9 of the node's kubelet and containerd, until the Node is NotReady; resolves with the kubelet's pid. */
  crashNode(node: string): Promise<number>;
  /** Starts a crashed node's daemons again, until the Node is Ready. */
  restoreNode(node: string): Promise<void>;
  /** Freezes the node in place (its Pods' cgroup frozen, its daemons SIGSTOPped). */
  freezeNode(node: string): Promise<void>;
  /** Thaws a frozen node. */
  thawNode(node: string): Promise<void>;
}

/**
 * Reads the cluster's current Pods and builds the suites' view. Names: `agent/<node>`,
 * `nvmf_tgt/<node>`, `nvmet/<node>` (a kernel node's simulated nvmet, a node-level process),
 * `csi-node/<node>` (`dpu/<node>` on the DPU node: its plugin), `kubelet/<node>`,
 * `containerd/<node>` (node daemons), each manager replica by its Pod name, `csi-controller`. Paths are host paths: a node's kubelet root is
 * /proc/<holder>/root/var/lib/kubelet (the node's mount namespace, where its volumes are mounted),
 * its target's RPC socket `<dir>/nodes/<node>/run/distort/spdk.sock`.
 */
export async function clusterBackend(lab: RealLab): Promise<ClusterBackend> {
  const core = lab.conn.api(k8s.CoreV1Api);
  const pods = (await core.listNamespacedPod({ namespace: lab.namespace })).items.filter(
    (p) => p.metadata?.deletionTimestamp === undefined,
  );
  const managerPods = pods
    .filter((p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "manager")
    .sort((a, b) => (a.metadata?.name ?? "").localeCompare(b.metadata?.name ?? ""));
  const controller = pods.find(
    (p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "csi-controller",
  );
  if (managerPods.length === 0 || !controller?.spec?.nodeName || !controller.metadata?.uid)
    throw new Error(
      `the cluster runs no manager or CSI controller Pod: ${pods.map((p) => p.metadata?.name)}`,
    );
  const node = (name: string) => {
    const n = lab.nodes.find((x) => x.name === name);
    if (!n) throw new Error(`no node ${name} in the lab`);
    return n;
  };
  // The controller's socket is in its Pod's emptyDir, too deep for a unix socket path: a short link.
  const socketDir = join(
    node(controller.spec.nodeName).paths.varLib,
    "kubelet/pods",
    controller.metadata.uid,
    "volumes/kubernetes.io~empty-dir/socket-dir",
  );
  const csiControllerSocket = join(lab.dir, "csi-controller.sock");
  rmSync(csiControllerSocket, { force: true });
  symlinkSync(join(socketDir, "csi.sock"), csiControllerSocket);

  const managers = new Map(
    managerPods.map((p) => [
      p.metadata?.name ?? "",
      { node: p.spec?.nodeName ?? "", podUid: p.metadata?.uid },
    ]),
  );
  const storage = lab.specs.filter((s) => s.storage);
  const dpuSpec = lab.specs.find((s) => s.dpu);
  const isDpu = (name: string) => lab.specs.some((s) => s.name === name && s.dpu);
  // The DPU's plugin and SNAP sockets, by short links (the node's paths are deep for a unix socket).
  const dpu = dpuSpec
    ? (() => {
        const n = node(dpuSpec.name);
        const sockets = dpuSockets(n);
        const link = (what: string, target: string) => {
          const p = join(lab.dir, `${what}-${n.name}.sock`);
          rmSync(p, { force: true });
          symlinkSync(target, p);
          return p;
        };
        return {
          name: n.name,
          hostNqn: readFileSync(
            join(hostPathOf(n.paths.root, NODE_PATHS.nvmeConfigDir), "hostnqn"),
            "utf8",
          ).trim(),
          pluginSocket: link("dpu", sockets.pluginSocket),
          snapSocket: link("snap", sockets.snapSocket),
          // SNAP's host-facing listeners go on the DPU's node IP, where this process reaches them.
          address: n.ip,
        };
      })()
    : undefined;
  const consumers = CONSUMER_ORDER.filter((n) => lab.nodes.some((x) => x.name === n));
  const info: LabInfo = {
    dir: lab.dir,
    kubeconfig: lab.kubeconfigPath,
    release: lab.release,
    values: REAL_LAB_VALUES,
    namespace: lab.namespace,
    consumers: consumers.map((name) => ({
      name,
      kubeletRoot: `${nodeRoot(node(name).holderPid)}/var/lib/kubelet`,
      csi: `csi-node/${name}`,
      kubelet: `kubelet/${name}`,
      hostSocket: join(node(name).paths.run, NODE_PATHS.nvmeHostSocket.slice("/run/".length)),
    })),
    storage: storage.map((s) => ({
      name: s.name,
      spdkSocket: join(node(s.name).paths.run, "distort/spdk.sock"),
      target: `nvmf_tgt/${s.name}`,
      agent: `agent/${s.name}`,
      serials: s.drives.map((d) => d.serial),
    })),
    kernelStorage: lab.specs
      .filter((s) => s.kernel)
      .map((s) => ({
        name: s.name,
        nvmetDir: join(
          hostPathOf(node(s.name).paths.root, KERNEL_NODE_PATHS.hostRoot),
          "sys/kernel/config/nvmet",
        ),
        target: `nvmet/${s.name}`,
        agent: `agent/${s.name}`,
        serials: s.drives.map((d) => d.serial),
      })),
    managers: [...managers.keys()],
    csiController: "csi-controller",
    csiControllerSocket,
    ...(dpu ? { dpu } : {}),
  };
  const workloadImage = lab.images.images.workload?.ref;
  if (!workloadImage) throw new Error("the lab built no workload image");
  return {
    info,
    workloadImage,
    pid(name) {
      const m = managers.get(name);
      if (m) return containerProcess(MANAGER, m);
      if (name === "csi-controller")
        return containerProcess(CSI_CONTROLLER, { node: controller.spec?.nodeName ?? "" });
      const [role = "", nodeName = ""] = name.split("/");
      if (role === "kubelet" || role === "containerd") return node(nodeName).pids()[role];
      if (role === "nvmet") return lab.nvmetPid(nodeName);
      const command = ROLE_COMMAND[role];
      if (!command) throw new Error(`no process named ${name} in the real-cluster lab`);
      return containerProcess(command, { node: nodeName });
    },
    processNames: () => [
      ...managers.keys(),
      "csi-controller",
      ...storage.flatMap((s) => [`agent/${s.name}`, `nvmf_tgt/${s.name}`]),
      ...lab.nodes.flatMap((n) => [
        isDpu(n.name) ? `dpu/${n.name}` : `csi-node/${n.name}`,
        `kubelet/${n.name}`,
        `containerd/${n.name}`,
      ]),
    ],
    crashNode: (name) => crashNode(lab.conn, node(name)),
    restoreNode: (name) => restoreNode(lab.conn, node(name)),
    freezeNode: (name) => freezeNode(node(name)),
    thawNode: (name) => thawNode(node(name)),
    mountinfo(name) {
      // The node's mount namespace as the host reaches it: /proc/<holder>/root/<path in the node>.
      const root = nodeRoot(node(name).holderPid);
      return readFileSync(`/proc/${node(name).holderPid}/mountinfo`, "utf8")
        .split("\n")
        .map((line) => {
          const f = line.split(" ");
          if (f[4] === undefined) return line;
          f[4] = root + f[4];
          return f.join(" ");
        })
        .join("\n");
    },
  };
}

/** Where the host sees a node's file tree, mounts included: the mount-namespace holder's root. */
function nodeRoot(holderPid: number): string {
  return `/proc/${holderPid}/root`;
}
