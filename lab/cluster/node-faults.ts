// Node-level faults on the real-cluster lab: a node's crash (kill -9 of its kubelet and containerd,
// as a power loss would leave its Pods' containers running under their shims) until the control
// plane sees it NotReady, and its return (the daemons started again) until it is Ready.
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
