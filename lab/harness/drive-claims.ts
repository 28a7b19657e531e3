// What an administrator does once a lab's agents run, in the harness labs and the real cluster:
// claim every drive the agents report, label the storage nodes' fabric, and wait for every node's
// CSINode to list the driver.
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type NVMeDeviceClaim } from "../../api/index.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { kubeError, ResourceClient } from "../../lib/kube/resource.ts";
import { FABRIC_LABEL } from "./stack.ts";

/** A storage node and the serials of the drives it should report. */
export interface ClaimedNode {
  name: string;
  serials: string[];
}

async function ignoreExists(p: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
}

/**
 * Waits until every drive of `nodes` is reported, labels each RDMAStorageNode with the lab
 * fabric, creates an NVMeDeviceClaim per drive and waits until all are Claimed; throws with what
 * was missing once `timeoutMs` has passed.
 */
export async function claimAllDrives(
  conn: KubeConnection,
  namespace: string,
  nodes: ClaimedNode[],
  timeoutMs: number,
): Promise<void> {
  const devices = new ResourceClient(conn, kinds.NVMeDevice);
  const claims = new ResourceClient(conn, kinds.NVMeDeviceClaim);
  const storageNodes = new ResourceClient(conn, kinds.RDMAStorageNode);
  const want = nodes.flatMap((n) => n.serials);
  const deadline = Date.now() + timeoutMs;
  let found: NVMeDevice[] = [];
  for (;;) {
    found = (await devices.list()).items.filter((d) => want.includes(d.spec.serial));
    if (found.length >= want.length) break;
    if (Date.now() > deadline) throw new Error(`only ${found.length} of ${want.length} drives were reported`);
    await Bun.sleep(100);
  }
  for (const n of nodes) {
    while (!(await storageNodes.get(n.name, namespace))) {
      if (Date.now() > deadline) throw new Error(`storage node ${n.name} never reported`);
      await Bun.sleep(100);
    }
    await storageNodes.mergePatch(n.name, namespace, { metadata: { labels: { [FABRIC_LABEL]: "lab" } } });
  }
  for (const d of found)
    await ignoreExists(
      claims.create({
        apiVersion: "storage.distort.io/v1alpha1",
        kind: "NVMeDeviceClaim",
        metadata: { name: `drive-${d.spec.serial.toLowerCase()}`, namespace },
        spec: { serial: d.spec.serial, nodeName: d.spec.nodeName },
      } as NVMeDeviceClaim),
    );
  for (;;) {
    const claimed = (await devices.list()).items.filter(
      (d) => want.includes(d.spec.serial) && d.status?.phase === "Claimed",
    );
    if (claimed.length >= want.length) return;
    if (Date.now() > deadline)
      throw new Error(`only ${claimed.length} of ${want.length} drives were claimed`);
    await Bun.sleep(100);
  }
}

/** Waits until each node's CSINode lists the driver (its kubelet, or the stand-in, registered it). */
export async function waitCsiNodes(conn: KubeConnection, names: string[], timeoutMs: number): Promise<void> {
  const storageApi = conn.api(k8s.StorageV1Api);
  const deadline = Date.now() + timeoutMs;
  for (const name of names) {
    for (;;) {
      const n = await storageApi.readCSINode({ name }).catch(() => undefined);
      if (n?.spec.drivers?.some((d) => d.name === "storage.distort.io")) break;
      if (Date.now() > deadline) throw new Error(`node ${name} never registered the CSI driver`);
      await Bun.sleep(100);
    }
  }
}
