// Node-level faults on the real-cluster lab: a node's crash (kill -9 of its kubelet and containerd,
// as a power loss would leave its Pods' containers running under their shims) until the control
// plane sees it NotReady, and its return (the daemons started again) until it is Ready; and a
// node stopped in place (a paused VM: its Pods frozen, its daemons stopped) and continued.
import { readFile, writeFile } from "node:fs/promises";
import * as k8s from "@kubernetes/client-node";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import type { LabNode } from "./nodes.ts";

/** Whether the Node's Ready condition is True (false when it is False, Unknown or missing). */
export async function nodeReady(conn: KubeConnection, name: string): Promise<boolean> {
  const n = await conn.api(k8s.CoreV1Api).readNode({ name });
  return n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;
}

async function waitNode(
  conn: KubeConnection,
  name: string,
  ready: boolean,
  timeoutMs: number,
): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if ((await nodeReady(conn, name).catch(() => !ready)) === ready) return;
    if (Date.now() > until)
      throw new Error(`node ${name} not ${ready ? "Ready" : "NotReady"} within ${timeoutMs} ms`);
    await Bun.sleep(250);
  }
}

/**
 * kill -9 of the node's kubelet and containerd; resolves with the kubelet's pid once both are gone
 * and the control plane marked the Node NotReady (node-monitor grace period: 20 s in the lab).
 */
export async function crashNode(conn: KubeConnection, node: LabNode, timeoutMs = 120_000): Promise<number> {
  const kubelet = node.pids().kubelet;
  if (kubelet === undefined) throw new Error(`node ${node.name} has no kubelet running`);
  await node.kill();
  await waitNode(conn, node.name, false, timeoutMs);
  return kubelet;
}

/** Starts a crashed node's daemons again; resolves once the Node is Ready. */
export async function restoreNode(conn: KubeConnection, node: LabNode, timeoutMs = 120_000): Promise<void> {
  await node.start();
  await waitNode(conn, node.name, true, timeoutMs);
}

/** The node's cgroup v1 freezer state file (its Pods' containers sit below the node's cgroup root). */
function freezerState(node: LabNode): string {
  return `/sys/fs/cgroup/freezer${node.cgroupRoot}/freezer.state`;
}

/**
 * The node stops in place, as a paused VM does: every process of its Pods frozen through the
 * cgroup v1 freezer, and its kubelet, containerd and kube-proxy stopped (SIGSTOP). Sockets stay open and the
 * node's kernel goes on accepting TCP data into them; nothing runs until thawNode(). Resolves once
 * the freezer reports FROZEN.
 */
export async function freezeNode(node: LabNode, timeoutMs = 30_000): Promise<void> {
  const daemons = node.pids();
  for (const pid of [daemons.kubelet, daemons.containerd, daemons.kubeProxy])
    if (pid !== undefined) process.kill(pid, "SIGSTOP");
  await writeFile(freezerState(node), "FROZEN\n");
  const until = Date.now() + timeoutMs;
  while ((await readFile(freezerState(node), "utf8")).trim() !== "FROZEN") {
    if (Date.now() > until) throw new Error(`node ${node.name}'s cgroup not FROZEN within ${timeoutMs} ms`);
    await Bun.sleep(50);
  }
}

/** Undoes freezeNode(): the freezer thawed, kubelet, containerd and kube-proxy continued. Idempotent. */
export async function thawNode(node: LabNode): Promise<void> {
  await writeFile(freezerState(node), "THAWED\n");
  const daemons = node.pids();
  for (const pid of [daemons.kubelet, daemons.containerd, daemons.kubeProxy])
    if (pid !== undefined) process.kill(pid, "SIGCONT");
}
