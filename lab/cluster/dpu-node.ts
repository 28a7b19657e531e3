// The real-cluster lab's BlueField DPU node: a kubelet node like the others, marked as a DPU
// (label and NoSchedule taint node-role.kubernetes.io/dpu, which the chart's DPU profile selects
// and tolerates), where the chart's dpu DaemonSet runs the DPF vendor plugin. DOCA SNAP, which DPF
// runs there and which is not DISTORT's, has a stand-in: the nvmf_tgt emulator of the agent-lab
// image in a kube-system DaemonSet on the DPU node (hostNetwork, so it connects to the storage
// nodes' portals from the DPU's own addresses), its JSON-RPC socket in DPF's default provider
// directory, its host NQN the DPU's.
import * as k8s from "@kubernetes/client-node";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import { createLogger } from "../../lib/log.ts";
import { SpdkClient } from "../../lib/spdk/client.ts";
import type { LabNode } from "./nodes.ts";
import { hostPathOf, NODE_PATHS } from "./storage-prep.ts";

/** The label and taint key of DPU nodes (examples/lab-cluster.yaml's dpu.nodeSelector and tolerations). */
export const DPU_ROLE_LABEL = "node-role.kubernetes.io/dpu";

/** Paths inside the DPU node, as the chart's defaults name them (dpu.pluginsDir, pluginName, snapSocketDir). */
export const DPU_NODE_PATHS = {
  /** The plugin's socket, where DPF's SNAP node driver calls it. */
  pluginSocket: "/var/lib/nvidia/storage/snap/plugins/distort/dpu.sock",
  /** NVIDIA SNAP's provider directory, holding SNAP's JSON-RPC socket. */
  snapSocketDir: "/var/lib/nvidia/storage/snap/providers/nvidia",
  snapSocket: "/var/lib/nvidia/storage/snap/providers/nvidia/snap.sock",
} as const;

/** The SNAP stand-in's namespace, DaemonSet name, and the name its process runs under. */
export const SNAP_NAMESPACE = "kube-system";
export const SNAP_NAME = "snap-emulator";
/**
 * argv[0] of the stand-in's process: it is the nvmf_tgt emulator, but it plays SNAP, not one of
 * DISTORT's processes, so it must not be counted as the chart's nvmf_tgt (lab/cluster/containers.ts).
 */
export const SNAP_PROCESS_NAME = "snap-emulator";

/** Host paths of a DPU node's plugin and SNAP sockets (under the node's own /var/lib). */
export function dpuSockets(node: Pick<LabNode, "paths">): { pluginSocket: string; snapSocket: string } {
  return {
    pluginSocket: hostPathOf(node.paths.root, DPU_NODE_PATHS.pluginSocket),
    snapSocket: hostPathOf(node.paths.root, DPU_NODE_PATHS.snapSocket),
  };
}

/**
 * Marks node `name` as a DPU: the role label (kubelet may not set a node-role label on itself, so
 * the admin does, as a cluster's installer would) and the NoSchedule taint that keeps everything
 * but the DPU's own DaemonSets off it. Idempotent.
 */
export async function markDpuNode(conn: KubeConnection, name: string): Promise<void> {
  const core = conn.api(k8s.CoreV1Api);
  const node = await core.readNode({ name });
  const taints = (node.spec?.taints ?? []).filter((t) => t.key !== DPU_ROLE_LABEL);
  taints.push({ key: DPU_ROLE_LABEL, effect: "NoSchedule" });
  const res = await conn.request(`/api/v1/nodes/${name}`, {
    method: "PATCH",
    contentType: "application/merge-patch+json",
    body: JSON.stringify({ metadata: { labels: { [DPU_ROLE_LABEL]: "" } }, spec: { taints } }),
  });
  if (!res.ok) throw new Error(`marking ${name} as a DPU: ${res.status} ${await res.text()}`);
}

/** The SNAP stand-in's DaemonSet on every DPU node, running `image` (the agent-lab image). */
export function snapDaemonSet(image: string): k8s.V1DaemonSet {
  const labels = { app: SNAP_NAME };
  const emulator = [
    "/usr/local/bin/nvmf_tgt",
    "-m 0x1",
    `-r ${DPU_NODE_PATHS.snapSocket}`,
    "--sim-data-dir=/snap-data",
    "--sim-fabric=tcp",
    "--sim-host-addresses=auto",
    '--sim-host-nqn="$(cat /etc/nvme/hostnqn)"',
  ].join(" ");
  return {
    metadata: { name: SNAP_NAME, namespace: SNAP_NAMESPACE, labels },
    spec: {
      selector: { matchLabels: labels },
      template: {
        metadata: { labels },
        spec: {
          hostNetwork: true,
          automountServiceAccountToken: false,
          nodeSelector: { [DPU_ROLE_LABEL]: "" },
          tolerations: [{ key: DPU_ROLE_LABEL, operator: "Exists", effect: "NoSchedule" }],
          containers: [
            {
              name: "snap",
              image,
              imagePullPolicy: "Never",
              command: ["/bin/bash", "-c", `exec -a ${SNAP_PROCESS_NAME} ${emulator}`],
              volumeMounts: [
                { name: "provider", mountPath: DPU_NODE_PATHS.snapSocketDir },
                { name: "etc-nvme", mountPath: "/etc/nvme", readOnly: true },
                { name: "data", mountPath: "/snap-data" },
              ],
            },
          ],
          volumes: [
            { name: "provider", hostPath: { path: DPU_NODE_PATHS.snapSocketDir, type: "DirectoryOrCreate" } },
            { name: "etc-nvme", hostPath: { path: NODE_PATHS.nvmeConfigDir, type: "Directory" } },
            { name: "data", emptyDir: {} },
          ],
        },
      },
    },
  };
}

/**
 * Starts the SNAP stand-in on the DPU nodes and waits until each one's socket answers
 * spdk_get_version (the DPU plugin's readiness needs SNAP before `helm install --wait` ends).
 */
export async function startSnap(
  conn: KubeConnection,
  image: string,
  dpuNodes: Pick<LabNode, "name" | "paths">[],
  timeoutMs = 120_000,
): Promise<void> {
  if (dpuNodes.length === 0) return;
  try {
    await conn
      .api(k8s.AppsV1Api)
      .createNamespacedDaemonSet({ namespace: SNAP_NAMESPACE, body: snapDaemonSet(image) });
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
  const deadline = Date.now() + timeoutMs;
  for (const n of dpuNodes) {
    const { snapSocket } = dpuSockets(n);
    while (!(await spdkAnswers(snapSocket))) {
      if (Date.now() > deadline) throw new Error(`SNAP stand-in on ${n.name} not answering on ${snapSocket}`);
      await Bun.sleep(250);
    }
  }
}

async function spdkAnswers(socketPath: string): Promise<boolean> {
  const c = new SpdkClient({ socketPath, logger: createLogger({ level: "error" }), callTimeoutMs: 1000 });
  try {
    await c.call("spdk_get_version");
    return true;
  } catch {
    return false;
  } finally {
    await c.close();
  }
}
