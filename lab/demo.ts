// The lab's walk-through: a PVC and a Pod that writes a data pattern on one node, then a Pod on
// the other node that reads it back byte for byte, printing each step as the system takes it
// (scheduled, placed, exported, bound, attached, staged, published, written, moved, verified).
import { readFileSync } from "node:fs";
import * as k8s from "@kubernetes/client-node";
import { kinds } from "../api/index.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";

export interface DemoNode {
  name: string;
  /** The kubelet root as this process sees it (mount points are compared against it). */
  kubeletRoot: string;
  /** The node's mount table; default this process's (the bare lab shares the host's mounts). */
  mountinfo?: () => string;
}

export interface DemoOptions {
  conn: KubeConnection;
  nodes: DemoNode[];
  say: (line: string) => void;
  namespace?: string;
  storageClass?: string;
  bytes?: number;
  timeoutMs?: number;
  /** The workload image, as the lab imported it into every node's containerd. */
  image: string;
}

/** The JSON line a lab workload prints (its termination message, or its log's first line). */
export interface WorkloadReport {
  mode: string;
  bytes: number;
  sha256: string;
  ok: boolean;
  firstMismatchAt?: number;
}

const DRIVER = "storage.distort.io";

/** A Pod running the lab workload (image `image`) on `node` against PVC `claim`, mounted at /data. */
export function workloadPod(
  name: string,
  node: string,
  claim: string,
  args: string[],
  image: string,
): k8s.V1Pod {
  return {
    metadata: { name },
    spec: {
      restartPolicy: "Never",
      nodeSelector: { "kubernetes.io/hostname": node },
      containers: [
        {
          name: "workload",
          image,
          // Built on the lab's nodes, never pulled.
          imagePullPolicy: "Never",
          // The workload writes under the volume's mount (a holder only keeps it in use).
          args: args[0] === "hold" ? args : [...args, "--dir=/data"],
          volumeMounts: [{ name: "data", mountPath: "/data" }],
        },
      ],
      volumes: [{ name: "data", persistentVolumeClaim: { claimName: claim } }],
    },
  };
}

/** The workload's report from a finished Pod, or undefined while it runs. */
export function workloadReport(pod: k8s.V1Pod): WorkloadReport | undefined {
  const term = pod.status?.containerStatuses?.[0]?.state?.terminated;
  if (!term?.message) return undefined;
  try {
    return JSON.parse(term.message) as WorkloadReport;
  } catch {
    return undefined;
  }
}

function mounted(node: DemoNode, prefix: string, suffix: string): string | undefined {
  return (node.mountinfo ? node.mountinfo() : readFileSync("/proc/self/mountinfo", "utf8"))
    .split("\n")
    .map((l) => l.split(" ")[4] ?? "")
    .find((m) => m.startsWith(prefix) && m.endsWith(suffix));
}

/** Runs the walk-through; throws with what it was waiting for when a step does not happen in time. */
export async function runDemo(o: DemoOptions): Promise<{ written: WorkloadReport; read: WorkloadReport }> {
  const ns = o.namespace ?? "demo";
  const sc = o.storageClass ?? "distort-lab";
  const bytes = o.bytes ?? 64 * 1024 * 1024;
  const [first, second] = o.nodes;
  if (!first || !second) throw new Error("the walk-through needs two consumer nodes");
  const core = o.conn.api(k8s.CoreV1Api);
  const storage = o.conn.api(k8s.StorageV1Api);
  const partitions = new ResourceClient(o.conn, kinds.NVMePartition);
  const t0 = performance.now();
  const seen = new Set<string>();
  const say = (s: string) => o.say(`[${((performance.now() - t0) / 1000).toFixed(1).padStart(5)} s] ${s}`);
  const deadline = () => Date.now() + (o.timeoutMs ?? 120_000);

  try {
    await core.createNamespace({ body: { metadata: { name: ns } } });
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
  await core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name: "demo-data" },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName: sc,
        resources: { requests: { storage: "1Gi" } },
      },
    },
  });
  say(`created PVC ${ns}/demo-data (1 GiB, StorageClass ${sc})`);
  const args = ["write-verify", `--bytes=${bytes}`, "--seed=distort-lab"];
  await core.createNamespacedPod({
    namespace: ns,
    body: workloadPod("writer", first.name, "demo-data", args, o.image),
  });
  say(`created Pod ${ns}/writer (writes ${bytes / 1024 / 1024} MiB, pinned to ${first.name})`);

  const written = await follow("writer", first);
  say(`writer: wrote and verified ${written.bytes} bytes, sha256 ${written.sha256.slice(0, 16)}...`);

  await core.deleteNamespacedPod({ name: "writer", namespace: ns });
  say("deleted Pod writer");
  await waitFor("writer gone and the volume detached from the first node", async () => {
    const pod = await core.readNamespacedPod({ name: "writer", namespace: ns }).catch(() => undefined);
    if (pod) return false;
    const vas = await storage.listVolumeAttachment();
    return !vas.items.some((va) => va.spec.attacher === DRIVER && va.spec.nodeName === first.name);
  });
  say(`unpublished, unstaged and detached from ${first.name}`);
  await core.createNamespacedPod({
    namespace: ns,
    body: workloadPod(
      "reader",
      second.name,
      "demo-data",
      ["verify", `--bytes=${bytes}`, "--seed=distort-lab", "--then-hold"],
      o.image,
    ),
  });
  say(`created Pod ${ns}/reader on ${second.name} (reads the data back, then keeps the volume in use)`);
  const read = await follow("reader", second);
  if (!read.ok || read.sha256 !== written.sha256)
    throw new Error(`reader found different data: ${JSON.stringify(read)} vs ${JSON.stringify(written)}`);
  say(`reader: ${read.bytes} bytes identical byte for byte (sha256 ${read.sha256.slice(0, 16)}...)`);
  say(`reader keeps running on ${second.name} with the volume mounted`);
  return { written, read };

  async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false>): Promise<T> {
    const until = deadline();
    for (;;) {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await Bun.sleep(100);
    }
  }

  /** Prints the steps of one Pod's volume as they happen; returns its workload report. */
  async function follow(podName: string, node: DemoNode): Promise<WorkloadReport> {
    // Volume steps print once for the walk-through; Pod steps once per Pod.
    const step = (key: string, line: string) => {
      const k = ["selected", "placed", "exported", "bound"].includes(key) ? key : `${podName}/${key}`;
      if (seen.has(k)) return;
      seen.add(k);
      say(line);
    };
    const until = deadline();
    for (;;) {
      const pod = await core.readNamespacedPod({ name: podName, namespace: ns });
      const pvc = await core.readNamespacedPersistentVolumeClaim({ name: "demo-data", namespace: ns });
      const selected = pvc.metadata?.annotations?.["volume.kubernetes.io/selected-node"];
      if (selected && pvc.status?.phase !== "Bound")
        step("selected", `kube-scheduler chose ${selected} for the PVC (WaitForFirstConsumer)`);
      if (pod.spec?.nodeName) step("scheduled", `scheduled ${podName} on ${pod.spec.nodeName}`);
      const pvName = pvc.spec?.volumeName;
      let handle: string | undefined;
      if (pvName) {
        const pv = await core.readPersistentVolume({ name: pvName }).catch(() => undefined);
        handle = pv?.spec?.csi?.volumeHandle;
      }
      // The volume handle is <namespace>/<partition>/<uid>; before binding, find the partition by claim name.
      const [pns, pname] = handle ? handle.split("/") : [];
      const part =
        pns && pname
          ? await partitions.get(pname, pns)
          : (await partitions.list()).items.find(
              (p) =>
                p.metadata.annotations?.["storage.distort.io/pvc-name"] === "demo-data" &&
                p.metadata.annotations["storage.distort.io/pvc-namespace"] === ns,
            );
      if (part?.spec.deviceSerial)
        step(
          "placed",
          `placed: NVMePartition ${part.metadata.name} on ${part.spec.nodeName} drive ${part.spec.deviceSerial}`,
        );
      if (part?.status?.state === "Exported")
        step(
          "exported",
          `exported: ${part.status.nqn} at ${part.status.portalIP}:${part.status.portalPort} (${part.status.transport})`,
        );
      if (pvc.status?.phase === "Bound") step("bound", `bound: PVC demo-data -> PV ${pvName}`);
      if (pod.spec?.nodeName && handle) {
        const vas = await storage.listVolumeAttachment();
        const va = vas.items.find(
          (x) => x.spec.nodeName === node.name && x.spec.source.persistentVolumeName === pvName,
        );
        if (va?.status?.attached)
          step("attached", `attached: VolumeAttachment ${va.metadata?.name} to ${node.name}`);
        const staged = mounted(
          node,
          `${node.kubeletRoot}/plugins/kubernetes.io/csi/${DRIVER}/`,
          "/globalmount",
        );
        if (staged) step("staged", `staged on ${node.name}: ${staged.slice(node.kubeletRoot.length + 1)}`);
        const uid = pod.metadata?.uid ?? "";
        const published = mounted(
          node,
          `${node.kubeletRoot}/pods/${uid}/volumes/kubernetes.io~csi/`,
          "/mount",
        );
        if (published)
          step("published", `published on ${node.name}: ${published.slice(node.kubeletRoot.length + 1)}`);
      }
      if (pod.status?.phase === "Running") step("running", `${podName} running its workload`);
      const report = workloadReport(pod);
      if (pod.status?.phase === "Succeeded" && report) return report;
      // A workload with --then-hold keeps running: its result line is the first line of its log.
      if (pod.status?.phase === "Running") {
        const log = await core.readNamespacedPodLog({ name: podName, namespace: ns }).catch(() => "");
        const first = String(log).split("\n")[0] ?? "";
        if (first.startsWith("{")) return JSON.parse(first) as WorkloadReport;
      }
      if (pod.status?.phase === "Failed")
        throw new Error(
          `${podName} failed: ${pod.status.message ?? JSON.stringify(pod.status.containerStatuses)}`,
        );
      if (Date.now() > until)
        throw new Error(
          `timed out following ${podName}: phase ${pod.status?.phase}, ${pod.status?.message ?? ""}`,
        );
      await Bun.sleep(100);
    }
  }
}
