// The controller's orphan sweep against a real kube-apiserver: partitions whose claim vanished
// before a PV existed are deleted with an Event; claimed, PV-bound and claimless ones are kept.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomUUID } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { API_VERSION, kinds, type NVMePartition } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { realClock } from "../lib/clock.ts";
import { connect } from "../lib/kube/connection.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { classifyRequest } from "../lib/kube/request-metrics.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { Annotations, PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./controller/fingerprint.ts";
import { CsiController } from "./controller.ts";

let tc: TestCluster;
let core: k8s.CoreV1Api;
let parts: ResourceClient<NVMePartition>;
const pvsMade: string[] = [];

beforeAll(async () => {
  tc = await testCluster();
  core = tc.conn.api(k8s.CoreV1Api);
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
});
afterAll(async () => {
  for (const name of pvsMade) await core.deletePersistentVolume({ name }).catch(() => {});
  await tc?.stop();
});

/** A partition as CreateVolume makes it for the provisioner's claim `claimNs/claim`, PV `pv`. */
function partition(ns: string, pv: string, claim?: { ns: string; name: string }): NVMePartition {
  return {
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: {
      name: pv,
      namespace: ns,
      labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
      annotations: {
        [Annotations.requestName]: pv,
        ...(claim
          ? {
              [Annotations.pvcName]: claim.name,
              [Annotations.pvcNamespace]: claim.ns,
              [Annotations.pvName]: pv,
            }
          : {}),
      },
    },
    spec: { sizeBytes: 4 * 1024 * 1024, backend: "spdk", volumeManager: "spdk-lvol" },
  };
}

async function createPv(name: string, volumeHandle: string): Promise<void> {
  await core.createPersistentVolume({
    body: {
      metadata: { name },
      spec: {
        capacity: { storage: "4Mi" },
        accessModes: ["ReadWriteOnce"],
        persistentVolumeReclaimPolicy: "Delete",
        csi: { driver: "storage.distort.io", volumeHandle },
      },
    },
  });
  pvsMade.push(name);
}

test("the sweep deletes only partitions whose claim is gone and that no PV refers to", async () => {
  const ns = await tc.namespace("orphan");
  const app = await tc.namespace("app");
  const controller = new CsiController({
    conn: tc.conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: 4 * 1024 * 1024,
    events: new EventRecorder(tc.conn, {
      controller: "storage.distort.io/csi",
      instance: "test",
      logger: silentLogger,
    }),
  });
  await controller.start();
  try {
    // A live claim: its partition is named after it (as CreateVolume for the provisioner does).
    const live = await core.createNamespacedPersistentVolumeClaim({
      namespace: app,
      body: {
        metadata: { name: "live" },
        spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "4Mi" } } },
      },
    });
    const liveUid = live.metadata?.uid as string;
    // The same claim name recreated: the old incarnation's partition encodes another UID.
    const staleOfLive = `pvc-${randomUUID()}`;
    const gone = `pvc-${randomUUID()}`;
    const byPvName = `pvc-${randomUUID()}`;
    const byHandle = `pvc-${randomUUID()}`;
    const claimless = `pvc-${randomUUID()}`;
    // Claim gone and no PV, but not made by the CSI controller (no provisioned-by label): kept.
    const foreign = `pvc-${randomUUID()}`;
    const foreignPartition = partition(ns, foreign, { ns: app, name: "deleted-foreign" });
    delete foreignPartition.metadata.labels;
    const made = new Map<string, NVMePartition>();
    for (const p of [
      partition(ns, `pvc-${liveUid}`, { ns: app, name: "live" }),
      partition(ns, staleOfLive, { ns: app, name: "live" }),
      partition(ns, gone, { ns: app, name: "deleted" }),
      partition(ns, byPvName, { ns: app, name: "deleted-bound" }),
      partition(ns, byHandle, { ns: app, name: "deleted-bound-2" }),
      partition(ns, claimless),
      foreignPartition,
    ])
      made.set(p.metadata.name, await parts.create(p));
    await createPv(byPvName, `${ns}/${byPvName}/${made.get(byPvName)?.metadata.uid}`);
    // A PV under another name whose handle names the partition keeps it just as well.
    await createPv(`other-${randomUUID()}`, `${ns}/${byHandle}/${made.get(byHandle)?.metadata.uid}`);
    await eventually(() => controller.partitions.list().length === made.size, 10_000, "the cache");

    // A grace period longer than the partitions' age touches nothing.
    expect(await controller.collectOrphans(3_600_000)).toEqual([]);

    const deleted = await controller.collectOrphans(0);
    expect(deleted.sort()).toEqual([gone, staleOfLive].sort());
    for (const name of [gone, staleOfLive]) expect(await parts.get(name, ns)).toBeUndefined();
    for (const name of [`pvc-${liveUid}`, byPvName, byHandle, claimless, foreign])
      expect((await parts.get(name, ns))?.metadata.uid).toBe(made.get(name)?.metadata.uid);

    const events = tc.conn.api(k8s.EventsV1Api);
    const collected = await eventually(async () => {
      const list = await events.listNamespacedEvent({ namespace: ns });
      const mine = list.items.filter((e) => e.reason === "OrphanCollected");
      return mine.length === 2 ? mine : undefined;
    });
    const about = (name: string) => collected.find((e) => e.regarding?.name === name);
    expect(about(gone)?.note).toContain(`PersistentVolumeClaim ${app}/deleted`);
    expect(about(gone)?.note).toContain("no longer exists");
    expect(about(staleOfLive)?.note).toContain(`now is uid ${liveUid}`);
    expect(about(gone)?.regarding?.uid).toBe(made.get(gone)?.metadata.uid as string);

    // Idempotent: a second sweep finds nothing more to do.
    await eventually(() => controller.partitions.list().length === made.size - 2, 10_000, "the cache");
    expect(await controller.collectOrphans(0)).toEqual([]);
  } finally {
    await controller.stop();
  }
}, 60_000);

test("started with orphan collection, the controller sweeps on start and then periodically", async () => {
  const ns = await tc.namespace("orphan");
  const controller = new CsiController({
    conn: tc.conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: 4 * 1024 * 1024,
    orphans: { graceMs: 0, intervalMs: 200 },
  });
  const first = await parts.create(partition(ns, `pvc-${randomUUID()}`, { ns: "nowhere", name: "gone" }));
  await controller.start();
  try {
    await eventually(async () => !(await parts.get(first.metadata.name, ns)), 10_000, "the first sweep");
    const later = await parts.create(partition(ns, `pvc-${randomUUID()}`, { ns: "nowhere", name: "gone-2" }));
    await eventually(async () => !(await parts.get(later.metadata.name, ns)), 10_000, "a later sweep");
  } finally {
    await controller.stop();
  }
}, 60_000);

test("a sweep reads live volumes from what it has: no GET for a partition a PV refers to, two for an orphan", async () => {
  const ns = await tc.namespace("orphan");
  const gets: string[] = [];
  const conn = connect(tc.kubeconfigPath, {
    onRequest: (method, url) => {
      const k = classifyRequest(method, url);
      if (k.verb === "GET") gets.push(k.resource);
    },
  });
  const controller = new CsiController({
    conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: 4 * 1024 * 1024,
  });
  await controller.start();
  try {
    const live: string[] = [];
    for (let i = 0; i < 5; i++) {
      const name = `pvc-${randomUUID()}`;
      const made = await parts.create(partition(ns, name, { ns: "app", name: `claim-${i}` }));
      await createPv(name, `${ns}/${name}/${made.metadata.uid}`);
      live.push(name);
    }
    const orphan = `pvc-${randomUUID()}`;
    await parts.create(partition(ns, orphan, { ns: "app", name: "deleted" }));
    await eventually(() => controller.partitions.list().length === 6, 10_000, "the cache");

    gets.length = 0;
    expect(await controller.collectOrphans(0)).toEqual([orphan]);
    // The orphan is re-read and its claim looked up; the five live volumes cost nothing.
    expect(gets.sort()).toEqual(["nvmepartitions", "persistentvolumeclaims"]);
    for (const name of live) expect(await parts.get(name, ns)).toBeDefined();

    await eventually(() => controller.partitions.list().length === 5, 10_000, "the cache");
    gets.length = 0;
    expect(await controller.collectOrphans(0)).toEqual([]);
    expect(gets).toEqual([]);
  } finally {
    await controller.stop();
  }
}, 60_000);
