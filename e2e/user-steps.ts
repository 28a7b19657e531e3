// User-level steps shared by the provisioning, cleanup and bad-input suites, beyond e2e/support.ts:
// claims of either volume mode, workload Pods on a raw device or on several claims, the report of a
// workload that holds, the Events `kubectl describe` shows, taking a test's namespace down, and
// the replicated suites' StorageClass.
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { kubeError } from "../lib/kube/resource.ts";
import { deletePod, type E2eLab, FinalError, until, type WorkloadReport, workloadPod } from "./support.ts";

export const DRIVER = "storage.distort.io";
export const SELECTED_NODE = "volume.kubernetes.io/selected-node";

/** A PVC of `volumeMode` (Filesystem unless said), in the lab's default class unless said. */
export async function createClaim(
  lab: E2eLab,
  ns: string,
  name: string,
  o: { storageClass?: string; size?: string; volumeMode?: "Filesystem" | "Block" } = {},
): Promise<k8s.V1PersistentVolumeClaim> {
  return lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName: o.storageClass ?? "distort-lab",
        volumeMode: o.volumeMode ?? "Filesystem",
        resources: { requests: { storage: o.size ?? "1Gi" } },
      },
    },
  });
}

/** A workload Pod whose container gets the claim as a raw block device instead of a mount. */
export function blockWorkloadPod(name: string, node: string, claim: string, args: string[]): k8s.V1Pod {
  const pod = workloadPod(name, node, claim, args);
  for (const c of pod.spec?.containers ?? []) {
    delete c.volumeMounts;
    c.volumeDevices = [{ name: "data", devicePath: "/dev/xvda" }];
    // The workload names its target: the device the kubelet put at devicePath.
    c.args = c.args?.map((a) => (a === "--dir=/data" ? "--device=/dev/xvda" : a));
  }
  return pod;
}

/** A workload Pod mounting every claim in `claims`; the workload runs on the first one. */
export function multiClaimWorkloadPod(
  name: string,
  node: string,
  claims: string[],
  args: string[],
): k8s.V1Pod {
  const pod = workloadPod(name, node, claims[0] ?? "", args);
  const spec = pod.spec as k8s.V1PodSpec;
  spec.volumes = claims.map((claimName, i) => ({ name: `data-${i}`, persistentVolumeClaim: { claimName } }));
  for (const c of spec.containers) {
    c.volumeMounts = claims.map((_, i) => ({ name: `data-${i}`, mountPath: `/data-${i}` }));
    c.args = c.args?.map((a) => (a === "--dir=/data" ? "--dir=/data-0" : a));
  }
  return pod;
}

/**
 * The result line of a workload started with --then-hold: it stays Running after writing, with the
 * line first in its log. Fails at once if the Pod fails.
 */
export async function waitHeld(
  lab: E2eLab,
  ns: string,
  pod: string,
  timeoutMs = 180_000,
): Promise<WorkloadReport> {
  const r = await until<{ report: WorkloadReport } | { ended: string }>(
    `Pod ${ns}/${pod} to report its result and hold`,
    async () => {
      const p = await lab.core.readNamespacedPod({ name: pod, namespace: ns });
      const phase = p.status?.phase;
      if (phase === "Failed" || phase === "Succeeded")
        return {
          ended: `Pod ${pod} ended ${phase} instead of holding: ${p.status?.message ?? JSON.stringify(p.status?.containerStatuses)}`,
        };
      if (phase !== "Running") return undefined;
      const line = String(await lab.core.readNamespacedPodLog({ name: pod, namespace: ns }))
        .split("\n")
        .find((l) => l.startsWith("{"));
      return line ? { report: JSON.parse(line) as WorkloadReport } : undefined;
    },
    timeoutMs,
  );
  if ("ended" in r) throw new Error(r.ended);
  return r.report;
}

/** Events about one object, as `kubectl describe` lists them (core/v1, by involvedObject). */
export async function eventsAbout(
  lab: E2eLab,
  ns: string,
  kind: string,
  name: string,
  uid?: string,
): Promise<k8s.CoreV1Event[]> {
  const list = await lab.core.listNamespacedEvent({
    namespace: ns,
    fieldSelector: `involvedObject.kind=${kind},involvedObject.name=${name}`,
  });
  return list.items.filter((e) => uid === undefined || e.involvedObject.uid === uid);
}

/** Waits for an Event of `reason` about the object whose message satisfies `matches`; returns it. */
export async function waitEvent(
  lab: E2eLab,
  ns: string,
  o: { kind: string; name: string; uid?: string; reason: string; matches?: (message: string) => boolean },
  timeoutMs = 180_000,
): Promise<k8s.CoreV1Event> {
  return until(
    `a ${o.reason} Event about ${o.kind} ${ns}/${o.name}`,
    async () =>
      (await eventsAbout(lab, ns, o.kind, o.name, o.uid)).find(
        (e) => e.reason === o.reason && (o.matches?.(e.message ?? "") ?? true),
      ),
    timeoutMs,
  );
}

/** Deletes a PVC (already gone is fine) and waits until the API server no longer has it. */
export async function deleteClaim(lab: E2eLab, ns: string, name: string, timeoutMs = 180_000): Promise<void> {
  try {
    await lab.core.deleteNamespacedPersistentVolumeClaim({ name, namespace: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  await until(
    `PVC ${ns}/${name} gone`,
    async () =>
      !(await lab.core.readNamespacedPersistentVolumeClaim({ name, namespace: ns }).catch(() => undefined)),
    timeoutMs,
  );
}

/**
 * Removes what a test made in its namespace, whatever state it is in: Pods first (so claims are
 * no longer in use), then claims, then waits for their PVs to go, then the namespace itself.
 */
export async function teardownNamespace(lab: E2eLab, ns: string): Promise<void> {
  const pods = await lab.core.listNamespacedPod({ namespace: ns });
  await Promise.all(pods.items.map((p) => deletePod(lab, ns, p.metadata?.name ?? "", 180_000)));
  const pvcs = await lab.core.listNamespacedPersistentVolumeClaim({ namespace: ns });
  await Promise.all(pvcs.items.map((c) => deleteClaim(lab, ns, c.metadata?.name ?? "")));
  await until(
    `the PVs of namespace ${ns} gone`,
    async () =>
      !(await lab.core.listPersistentVolume()).items.some((pv) => pv.spec?.claimRef?.namespace === ns),
    240_000,
  );
  try {
    await lab.core.deleteNamespace({ name: ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
}

/**
 * A StorageClass like the lab's default with `replicas` copies per volume (TCP, Immediate), a
 * failover bound of `failoverAfterSeconds`, and paths held (never failed) while a volume moves:
 * a lost path waits up to 10 minutes for the failover or handover. Returns its name.
 */
export async function replicatedStorageClass(
  lab: E2eLab,
  o: { prefix: string; replicas: number; failoverAfterSeconds: number },
): Promise<string> {
  const sc = `${o.prefix}-${randomBytes(3).toString("hex")}`;
  const base = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name: sc },
      provisioner: base.provisioner,
      parameters: {
        ...base.parameters,
        replicas: String(o.replicas),
        transport: "tcp",
        failoverAfterSeconds: String(o.failoverAfterSeconds),
        ctrlLossTmo: "600",
        reconnectDelay: "1",
      },
      reclaimPolicy: "Delete",
      volumeBindingMode: "Immediate",
    },
  });
  return sc;
}

/** The chart's VolumeSnapshotClass in the lab. */
export const SNAPSHOT_CLASS = "distort-snapshots";

/** Creates VolumeSnapshot `name` of `claim` in `ns` and waits until it is ready to use. */
export async function createVolumeSnapshot(
  lab: E2eLab,
  ns: string,
  name: string,
  claim: string,
): Promise<void> {
  const custom = lab.conn.api(k8s.CustomObjectsApi);
  const ref = { group: "snapshot.storage.k8s.io", version: "v1", namespace: ns, plural: "volumesnapshots" };
  await custom.createNamespacedCustomObject({
    ...ref,
    body: {
      apiVersion: `${ref.group}/${ref.version}`,
      kind: "VolumeSnapshot",
      metadata: { name },
      spec: { volumeSnapshotClassName: SNAPSHOT_CLASS, source: { persistentVolumeClaimName: claim } },
    },
  });
  await until(
    `VolumeSnapshot ${ns}/${name} ready to use`,
    async () => {
      const s = (await custom.getNamespacedCustomObject({ ...ref, name })) as {
        status?: { readyToUse?: boolean; error?: { message?: string } };
      };
      if (s.status?.error?.message)
        throw new FinalError(`snapshot ${name} failed: ${s.status.error.message}`);
      return s.status?.readyToUse === true;
    },
    180_000,
  );
}
