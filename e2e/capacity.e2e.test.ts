// Capacity-aware scheduling on the lab: the consumer nodes are split into two topology segments,
// each with one SPDK storage node; segment b is filled until no drive there holds the claim. The
// provisioner publishes CSIStorageCapacity per segment from GetCapacity, and a WaitForFirstConsumer
// Pod that prefers segment b's node runs in segment a (kube-scheduler steers it there from the
// capacity objects; where it does not, the provisioner refuses segment b and the Pod is scheduled
// again). A claim that names segment b's node is refused there and scheduled again, into segment a.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice, type NVMePartition, type RDMAStorageNode } from "../api/index.ts";
import { Annotations } from "../csi/controller/fingerprint.ts";
import { FABRIC_LABEL } from "../lab/harness/stack.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { type E2eLab, e2eLab, partitionOf, until, waitWorkload, workloadPod } from "./support.ts";
import { DRIVER, eventsAbout, SELECTED_NODE, teardownNamespace } from "./user-steps.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
/** What is left free on each drive of segment b: less than the claim, so no drive there fits it. */
const LEFT_IN_B = 2 * GiB;
const CLAIM_BYTES = 3 * GiB;

let lab: E2eLab;
let storageNodes: ResourceClient<RDMAStorageNode>;
const tag = Math.random().toString(36).slice(2, 7);
const segA = `cap-a-${tag}`;
const segB = `cap-b-${tag}`;
let nodeA: string;
let nodeB: string;
let storeA: string;
let storeB: string;
const classes: string[] = [];
let ns = "";

async function mergePatch(path: string, body: object): Promise<void> {
  const res = await lab.conn.request(path, {
    method: "PATCH",
    contentType: "application/merge-patch+json",
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`PATCH ${path}: ${res.status} ${await res.text()}`);
}

/** Puts a consumer Node and a storage node in segment `fabric` (the lab's own value is "lab"). */
async function label(consumer: string, storage: string, fabric: string): Promise<void> {
  await mergePatch(`/api/v1/nodes/${consumer}`, { metadata: { labels: { [FABRIC_LABEL]: fabric } } });
  await storageNodes.mergePatch(storage, lab.namespace, { metadata: { labels: { [FABRIC_LABEL]: fabric } } });
}

beforeAll(async () => {
  lab = await e2eLab();
  storageNodes = new ResourceClient(lab.conn, kinds.RDMAStorageNode);
  [nodeA, nodeB] = lab.consumers.map((c) => c.name) as [string, string];
  [storeA, storeB] = lab.storage.map((s) => s.name) as [string, string];
  await label(nodeA, storeA, segA);
  await label(nodeB, storeB, segB);
}, 120_000);

afterAll(async () => {
  if (ns) await teardownNamespace(lab, ns);
  for (const name of classes) await lab.storageApi.deleteStorageClass({ name }).catch(() => {});
  await label(nodeA, storeA, "lab");
  await label(nodeB, storeB, "lab");
  await lab.stop();
}, 600_000);

/** A class with the lab default's parameters (spdk lvols over TCP), under a name of its own. */
async function storageClass(
  name: string,
  binding: "Immediate" | "WaitForFirstConsumer",
  allowedTopologies?: k8s.V1TopologySelectorTerm[],
): Promise<void> {
  const base = await lab.storageApi.readStorageClass({ name: "distort-lab" });
  await lab.storageApi.createStorageClass({
    body: {
      metadata: { name },
      provisioner: DRIVER,
      parameters: base.parameters ?? {},
      reclaimPolicy: "Delete",
      volumeBindingMode: binding,
      ...(allowedTopologies ? { allowedTopologies } : {}),
    },
  });
  classes.push(name);
}

async function claim(name: string, storageClassName: string, bytes: number): Promise<void> {
  await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName,
        volumeMode: "Block",
        resources: { requests: { storage: `${bytes / MiB}Mi` } },
      },
    },
  });
}

/** The provisioner's objects for `sc`, by segment: capacity and maximumVolumeSize in bytes. */
async function published(sc: string): Promise<Record<string, { capacity: number; maximum: number }>> {
  const list = await lab.storageApi.listNamespacedCSIStorageCapacity({ namespace: lab.namespace });
  const bytes = (q: unknown) => (q === undefined ? -1 : quantityBytes(String(q)));
  const out: Record<string, { capacity: number; maximum: number }> = {};
  for (const c of list.items) {
    const seg = c.nodeTopology?.matchLabels?.[FABRIC_LABEL];
    if (c.storageClassName === sc && seg)
      out[seg] = { capacity: bytes(c.capacity), maximum: bytes(c.maximumVolumeSize) };
  }
  return out;
}

function quantityBytes(q: string): number {
  const m = /^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q);
  if (!m) throw new Error(`unexpected quantity ${q}`);
  const unit = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(m[1]) * (m[2] ? unit[m[2] as keyof typeof unit] : 1);
}

/** The class under test (WaitForFirstConsumer), made by the first test once segment b is full. */
let sc = "";

/**
 * A Pod writing raw blocks to `claimName` that may run on either segment's consumer node and
 * prefers segment b's: without capacity the scheduler would pick that one.
 */
function segmentPod(name: string, claimName: string): k8s.V1Pod {
  const pod = workloadPod(name, nodeA, claimName, ["write-verify", "--bytes=1Mi", `--seed=${name}`]);
  const spec = pod.spec as k8s.V1PodSpec;
  delete spec.nodeSelector;
  // Only the two segments' consumer nodes: a lab has other consumers, in segments of their own
  // with room (the real cluster's third consumer and kernel node share the lab's own segment),
  // which the scheduler may pick just as rightly as segment a.
  spec.affinity = {
    nodeAffinity: {
      requiredDuringSchedulingIgnoredDuringExecution: {
        nodeSelectorTerms: [
          { matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: [nodeA, nodeB] }] },
        ],
      },
      preferredDuringSchedulingIgnoredDuringExecution: [
        {
          weight: 100,
          preference: {
            matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: [nodeB] }],
          },
        },
      ],
    },
  };
  for (const c of spec.containers) {
    delete c.volumeMounts;
    c.volumeDevices = [{ name: "data", devicePath: "/dev/xvda" }];
    c.args = c.args?.map((a) => (a === "--dir=/data" ? "--device=/dev/xvda" : a));
  }
  return pod;
}

/** What the scheduler and the provisioner did with Pod `pod` and its claim, for a failure message. */
async function explain(pod: string, claimName: string): Promise<string> {
  const p = await lab.core.readNamespacedPod({ name: pod, namespace: ns }).catch(() => undefined);
  const claimNow = await lab.core
    .readNamespacedPersistentVolumeClaim({ name: claimName, namespace: ns })
    .catch(() => undefined);
  // Every capacity object of the class (duplicates and objects of other segments included).
  const all = (await lab.storageApi.listCSIStorageCapacityForAllNamespaces()).items
    .filter((c) => c.storageClassName === sc)
    .map((c) => ({
      name: `${c.metadata?.namespace}/${c.metadata?.name}`,
      topology: c.nodeTopology?.matchLabels,
      capacity: c.capacity,
      maximum: c.maximumVolumeSize,
      rv: c.metadata?.resourceVersion,
    }));
  const labels = Object.fromEntries(
    await Promise.all(
      [nodeA, nodeB].map(async (n) => [
        n,
        (await lab.core.readNode({ name: n })).metadata?.labels?.[FABRIC_LABEL],
      ]),
    ),
  );
  const said = async (kind: string, name: string) =>
    JSON.stringify((await eventsAbout(lab, ns, kind, name)).map((e) => `${e.reason}: ${e.message}`));
  return `Pod on ${p?.spec?.nodeName ?? "(none)"} phase ${p?.status?.phase} ${JSON.stringify(p?.status?.conditions ?? [])}; claim selected-node ${claimNow?.metadata?.annotations?.[SELECTED_NODE]} volume ${claimNow?.spec?.volumeName}; node segments ${JSON.stringify(labels)}; capacity objects ${JSON.stringify(all)}; Pod events ${await said("Pod", pod)}; claim events ${await said("PersistentVolumeClaim", claimName)}`;
}

async function runOrExplain(pod: string, claimName: string) {
  return waitWorkload(lab, ns, pod).catch(async (err: unknown) => {
    throw new Error(`${String(err)}; ${await explain(pod, claimName)}`);
  });
}

test("a WaitForFirstConsumer Pod whose claim fits only segment a runs there, with its volume", async () => {
  ns = await lab.newNamespace("capacity");
  const devices = new ResourceClient<NVMeDevice>(lab.conn, kinds.NVMeDevice);
  const partitions = new ResourceClient<NVMePartition>(lab.conn, kinds.NVMePartition);

  // Earlier suites' volumes finish going in the background after their PVs are gone (the agent
  // deletes the lvol, then the partition and its ledger entry go): one that went after the fill
  // would give segment b room again. Wait for the two storage nodes to have none going.
  await until(
    `no volume still going away on ${storeA} or ${storeB}`,
    async () => {
      const going = [];
      for (const p of (await partitions.list({ namespace: lab.namespace })).items) {
        if (p.spec.nodeName !== storeA && p.spec.nodeName !== storeB) continue;
        // A replica copy has no PV of its own: it goes with its volume, deletionTimestamp first.
        if (p.spec.replicaOf) {
          if (p.metadata.deletionTimestamp)
            going.push(`copy ${p.metadata.name} on ${p.spec.nodeName} (deleting)`);
          continue;
        }
        const pv = await lab.core.readPersistentVolume({ name: p.metadata.name }).catch(() => undefined);
        if (p.metadata.deletionTimestamp || pv === undefined || pv.status?.phase === "Released")
          going.push(
            `${p.metadata.name} on ${p.spec.nodeName} (${p.metadata.deletionTimestamp ? "deleting" : pv ? "PV released" : "no PV"})`,
          );
      }
      if (going.length === 0) return true;
      throw new Error(`still going: ${going.join(", ")}`);
    },
    240_000,
  );

  // Fill segment b's drives (an Immediate class held to segment b) down to LEFT_IN_B each, one
  // drive at a time: each filler lands on the most free drive, the one it was sized for.
  const filler = `cap-fill-${tag}`;
  await storageClass(filler, "Immediate", [
    { matchLabelExpressions: [{ key: FABRIC_LABEL, values: [segB] }] },
  ]);
  const bDrives = (await devices.list()).items.filter(
    (d) => d.spec.nodeName === storeB && d.status?.phase === "Claimed",
  );
  expect(bDrives.length).toBeGreaterThan(0);
  for (const i of bDrives.keys()) {
    const free = await until(`the free bytes of ${storeB}'s drives`, async () => {
      const mine = (await devices.list()).items.filter((x) =>
        bDrives.some((d) => d.metadata.name === x.metadata.name),
      );
      return mine.every((x) => x.status?.freeBytes !== undefined)
        ? Math.max(...mine.map((x) => x.status?.freeBytes ?? 0))
        : undefined;
    });
    const size = Math.floor((free - LEFT_IN_B) / (4 * MiB)) * 4 * MiB;
    if (size <= 0) continue;
    await claim(`fill-${i}`, filler, size);
    const ref = await partitionOf(lab, ns, `fill-${i}`);
    const placed = await until(`filler ${i} placed`, async () => {
      const p = await partitions.get(ref.name, ref.namespace);
      return p?.spec.nodeName ? p : undefined;
    });
    expect(placed.spec.nodeName).toBe(storeB);
    // The ledger entry must show in the drive's free bytes before the next filler is sized.
    await until(`filler ${i} counted on drive ${placed.spec.deviceSerial}`, async () => {
      const d = (await devices.list()).items.find((x) => x.spec.serial === placed.spec.deviceSerial);
      return (d?.status?.freeBytes ?? Number.POSITIVE_INFINITY) <= free - size;
    });
  }
  await until(`every drive of ${storeB} at most ${LEFT_IN_B} bytes free`, async () =>
    (await devices.list()).items
      .filter((d) => d.spec.nodeName === storeB && d.status?.phase === "Claimed")
      .every((d) => (d.status?.freeBytes ?? Number.POSITIVE_INFINITY) <= LEFT_IN_B),
  );

  // The class under test, made after the fill so its first objects already carry it.
  sc = `cap-wffc-${tag}`;
  await storageClass(sc, "WaitForFirstConsumer");
  const caps = await until(
    "CSIStorageCapacity for both segments, segment b without room for the claim",
    async () => {
      const p = await published(sc);
      const a = p[segA];
      const b = p[segB];
      if (a && b && b.maximum < CLAIM_BYTES && a.maximum >= CLAIM_BYTES) return p;
      // Said on a timeout: what the provisioner published and what the drives hold.
      const free = (await devices.list()).items
        .filter((d) => d.spec.nodeName === storeA || d.spec.nodeName === storeB)
        .map((d) => `${d.spec.nodeName}/${d.spec.serial} ${d.status?.phase} free ${d.status?.freeBytes}`);
      throw new Error(`published ${JSON.stringify(p)}; drives: ${free.join(", ")}`);
    },
    180_000,
  );
  // Each object gives what one volume can get: segment b's room is one drive's, not the sum.
  expect(caps[segB]?.capacity).toBe(caps[segB]?.maximum);
  expect(caps[segB]?.maximum).toBeLessThanOrEqual(LEFT_IN_B);
  expect(caps[segA]?.maximum).toBeGreaterThanOrEqual(CLAIM_BYTES);

  // The scheduler sees these objects through its own informer: give it a moment, and check they
  // still say the same (a CI run once saw the Pod go to segment b's node at the first attempt,
  // which only a scheduler holding an older object with room in b can do).
  await Bun.sleep(2000);
  const again = await published(sc);
  expect(again[segB]?.maximum).toBe(caps[segB]?.maximum);
  expect(again[segA]?.maximum).toBe(caps[segA]?.maximum);
  await claim("data", sc, CLAIM_BYTES);
  const created = await lab.core.createNamespacedPod({ namespace: ns, body: segmentPod("writer", "data") });
  const report = await runOrExplain("writer", "data");
  expect(report.ok).toBe(true);

  const ran = await lab.core.readNamespacedPod({ name: "writer", namespace: ns });
  expect(ran.spec?.nodeName).toBe(nodeA);
  const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "data", namespace: ns });
  expect(pvc.metadata?.annotations?.[SELECTED_NODE]).toBe(nodeA);
  const ref = await partitionOf(lab, ns, "data");
  expect((await partitions.get(ref.name, ref.namespace))?.spec.nodeName).toBe(storeA);

  // Where the scheduler went first: one Scheduled Event, no FailedScheduling, and the claim never
  // refused by the provisioner, when capacity steered it.
  const podEvents = await eventsAbout(lab, ns, "Pod", "writer", created.metadata?.uid);
  const reasons = podEvents.map((e) => e.reason);
  const claimEvents = (await eventsAbout(lab, ns, "PersistentVolumeClaim", "data")).map(
    (e) => `${e.reason}: ${e.message}`,
  );
  const firstTry = {
    scheduled: reasons.filter((r) => r === "Scheduled").length,
    failedScheduling: reasons.includes("FailedScheduling"),
    provisioningFailed: claimEvents.filter((e) => e.startsWith("ProvisioningFailed")),
  };
  // kube-scheduler at times passes segment b's node although every capacity object it can have
  // seen says there is no room (seen in CI, and on a fresh lab: three PreBind failures there, then
  // segment a); the cause is not known yet. The provisioner then refuses segment b and the Pod
  // still ends in segment a, as checked above. What the scheduler did is said, with what it saw.
  const first =
    firstTry.scheduled === 1 && !firstTry.failedScheduling && firstTry.provisioningFailed.length === 0;
  if (!first)
    console.log(
      `  capacity: not at the first attempt: ${JSON.stringify(firstTry)}; ${await explain("writer", "data")}`,
    );
  // Every refusal on the way was one for lack of room in the selected segment.
  for (const e of firstTry.provisioningFailed) expect(e).toContain("ResourceExhausted");
}, 600_000);

// A scheduler working from an older capacity object (or an operator's own choice) can select a
// node whose segment has no room. The provisioner is held to that segment (--strict-topology):
// CreateVolume fails RESOURCE_EXHAUSTED there, the claim goes back to the scheduler, and the
// Pod runs in segment a. Placed in any other segment instead, the volume could be one its Pod
// may never reach.
test("a claim whose selected node's segment has no room is sent back to the scheduler, not placed in another segment", async () => {
  expect(sc).not.toBe("");
  const partitions = new ResourceClient<NVMePartition>(lab.conn, kinds.NVMePartition);
  const created = await lab.core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name: "stale", annotations: { [SELECTED_NODE]: nodeB } },
      spec: {
        accessModes: ["ReadWriteOnce"],
        storageClassName: sc,
        volumeMode: "Block",
        resources: { requests: { storage: `${CLAIM_BYTES / MiB}Mi` } },
      },
    },
  });
  // The provisioner refuses it in segment b and drops the selection (its reschedule).
  const refused = await until(
    "the provisioner to refuse the claim in segment b and hand it back",
    async () => {
      const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: "stale", namespace: ns });
      if (pvc.metadata?.annotations?.[SELECTED_NODE] !== undefined) return undefined;
      const failed = (await eventsAbout(lab, ns, "PersistentVolumeClaim", "stale", created.metadata?.uid))
        .filter((e) => e.reason === "ProvisioningFailed")
        .map((e) => e.message ?? "");
      return failed.length > 0 ? { pvc, failed } : undefined;
    },
    180_000,
  ).catch(async (err: unknown) => {
    throw new Error(`${String(err)}; ${await explain("stale-writer", "stale")}`);
  });
  expect(refused.failed.some((m) => m.includes("ResourceExhausted"))).toBe(true);
  // Nothing was placed anywhere meanwhile: no volume, and no partition of this claim on a node.
  expect(refused.pvc.status?.phase).toBe("Pending");
  expect(refused.pvc.spec?.volumeName ?? "").toBe("");
  const mine = (await partitions.list({ namespace: lab.namespace })).items.filter(
    (p) =>
      p.metadata.annotations?.[Annotations.pvcName] === "stale" &&
      p.metadata.annotations?.[Annotations.pvcNamespace] === ns,
  );
  expect(mine.filter((p) => p.spec.nodeName).map((p) => p.spec.nodeName)).toEqual([]);

  // A Pod for it now: scheduled again, it runs in segment a with the volume there.
  await lab.core.createNamespacedPod({ namespace: ns, body: segmentPod("stale-writer", "stale") });
  const report = await runOrExplain("stale-writer", "stale");
  expect(report.ok).toBe(true);
  const ran = await lab.core.readNamespacedPod({ name: "stale-writer", namespace: ns });
  expect(ran.spec?.nodeName).toBe(nodeA);
  const ref = await partitionOf(lab, ns, "stale");
  expect((await partitions.get(ref.name, ref.namespace))?.spec.nodeName).toBe(storeA);
}, 600_000);
