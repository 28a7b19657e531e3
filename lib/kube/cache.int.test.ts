// Watch cache, typed client, status writes, events and the controller runner against a real
// kube-apiserver: the cache follows create/update/delete, survives a forced watch expiry (410),
// and updates arriving while a key is being reconciled coalesce into one more reconcile.

import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { exampleNVMePartition } from "../../api/examples.ts";
import { kinds, type NVMePartition } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { realClock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { Registry } from "../metrics.ts";
import { WatchCache } from "./cache.ts";
import { EventRecorder } from "./events.ts";
import { WorkQueue } from "./queue.ts";
import { objectKey, ResourceClient } from "./resource.ts";
import { runController } from "./runner.ts";
import { updateStatus } from "./status.ts";

let tc: TestCluster;
let parts: ResourceClient<NVMePartition>;
beforeAll(async () => {
  tc = await testCluster();
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

function partition(ns: string, name: string, sizeBytes = 2 ** 30): NVMePartition {
  const p = exampleNVMePartition();
  return {
    apiVersion: p.apiVersion,
    kind: p.kind,
    metadata: { name, namespace: ns },
    spec: { sizeBytes, backend: "spdk", volumeManager: "partition" },
  } as NVMePartition;
}

test("typed client: create, get, conflict on a stale write, already-exists, exact-uid delete", async () => {
  const ns = await tc.namespace("client");
  const created = await parts.create(partition(ns, "p1"));
  expect(created.metadata.uid).toBeTruthy();
  expect("managedFields" in created.metadata).toBe(false);
  const got = await parts.get("p1", ns);
  expect(got?.spec.sizeBytes).toBe(2 ** 30);
  expect(await parts.get("missing", ns)).toBeUndefined();

  const err = await parts.create(partition(ns, "p1")).catch((e) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("already-exists");

  await parts.mergePatch("p1", ns, { metadata: { labels: { a: "b" } } });
  const stale = await parts
    .replace({ ...created, metadata: { ...created.metadata, labels: { c: "d" } } })
    .catch((e) => e);
  expect((stale as StorageError).kind).toBe("conflict");

  const wrongUid = await parts
    .delete("p1", ns, { uid: "00000000-0000-4000-8000-000000000000" })
    .catch((e) => e);
  expect((wrongUid as StorageError).kind).toBe("conflict");
  expect(await parts.delete("p1", ns, { uid: created.metadata.uid })).toBe(true);
  expect(await parts.delete("p1", ns)).toBe(false);
});

test("status writes go through /status, retry conflicts, skip no-ops; events are recorded", async () => {
  const ns = await tc.namespace("status");
  const p = await parts.create(partition(ns, "p2"));
  // Two writers race: both finish, and the second sees the first's result instead of clobbering it.
  const bump = (latest: NVMePartition): NVMePartition["status"] => ({
    ...(latest.status ?? {}),
    state: "Pending" as const,
    conditions: latest.status?.conditions ?? [],
    allocatedBytes: (latest.status?.allocatedBytes ?? 0) + 1,
  });
  await Promise.all([updateStatus(parts, "p2", ns, bump), updateStatus(parts, "p2", ns, bump)]);
  const after = await parts.get("p2", ns);
  expect(after?.status?.allocatedBytes).toBe(2);
  expect(after?.metadata.generation).toBe(p.metadata.generation); // spec untouched
  const rv = after?.metadata.resourceVersion;
  await updateStatus(parts, "p2", ns, (l) => l.status);
  expect((await parts.get("p2", ns))?.metadata.resourceVersion).toBe(rv);

  const rec = new EventRecorder(tc.conn, {
    controller: "storage.distort.io/test",
    instance: "t1",
    logger: silentLogger,
  });
  await rec.record(after as NVMePartition, "Warning", "PlacementFailed", "Place", "no device fits");
  await rec.record(after as NVMePartition, "Warning", "PlacementFailed", "Place", "no device fits");
  const events = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
  expect(events.items.length).toBe(1);
  expect(events.items[0]?.regarding?.uid).toBe(after?.metadata.uid);
  expect(events.items[0]?.series?.count).toBe(2);
});

test("watch cache follows create/update/delete and survives a forced watch expiry", async () => {
  const ns = await tc.namespace("cache");
  await parts.create(partition(ns, "before"));
  const cache = new WatchCache(parts, { namespace: ns, logger: silentLogger });
  const seen: string[] = [];
  cache.on({
    add: (o) => seen.push(`add ${o.metadata.name}`),
    update: (_o, n) => seen.push(`update ${n.metadata.name}`),
    delete: (o) => seen.push(`delete ${o.metadata.name}`),
  });
  // onChange sees every change with the object as it now is: an update's new state.
  const changed: string[] = [];
  cache.onChange((o) => changed.push(`${o.metadata.name} ${o.spec.sizeBytes / 2 ** 30}Gi`));
  await cache.start();
  try {
    expect(cache.keys()).toEqual([`${ns}/before`]);
    await parts.create(partition(ns, "x"));
    await eventually(() => cache.get(`${ns}/x`), 5000, "add");
    await parts.mergePatch("x", ns, { spec: { sizeBytes: 2 * 2 ** 30 } });
    await eventually(() => cache.get(`${ns}/x`)?.spec.sizeBytes === 2 * 2 ** 30, 5000, "update");
    await parts.delete("x", ns);
    await eventually(() => !cache.get(`${ns}/x`), 5000, "delete");
    expect(seen).toEqual(["add before", "add x", "update x", "delete x"]);
    expect(changed).toEqual(["before 1Gi", "x 1Gi", "x 2Gi", "x 2Gi"]);
    expect(cache.list().every((o) => !("managedFields" in o.metadata))).toBe(true);

    // Resume from a resourceVersion long compacted out of the apiserver's window: 410 Gone.
    // Changes made meanwhile must still arrive, through the relist.
    const lists = cache.stats.lists;
    cache.restartWatch("1");
    await parts.delete("before", ns);
    await parts.create(partition(ns, "during"));
    // The 410 is counted before the relist it triggers completes: wait for both.
    await eventually(() => cache.stats.expired >= 1 && cache.stats.lists > lists, 5000, "410 and relist");
    expect(cache.stats.lists).toBeGreaterThan(lists);
    await eventually(() => cache.get(`${ns}/during`) && !cache.get(`${ns}/before`), 5000, "relist");
    await parts.create(partition(ns, "after"));
    await eventually(() => cache.get(`${ns}/after`), 5000, "watch resumed");
    expect(seen.filter((s) => s === "delete before")).toHaveLength(1);
    expect(cache.stats.rejected).toBe(0);
  } finally {
    await cache.stop();
  }
});

test("updates arriving while a reconcile runs coalesce into exactly one more reconcile", async () => {
  // Structural, not a rate: the reconciler is held on a latch, so every update below arrives
  // while the key is being processed; the queue must fold them into one follow-up reconcile that
  // sees the final state. (How many reconciles a burst costs at a given speed is in bench/.)
  const ns = await tc.namespace("burst");
  await parts.create(partition(ns, "hot"));
  const cache = new WatchCache(parts, { namespace: ns, logger: silentLogger });
  const queue = new WorkQueue({ name: "burst" });
  const enqueue = (o: NVMePartition) => queue.add(objectKey(o.metadata));
  cache.on({ add: enqueue, update: (_o, n) => enqueue(n), delete: enqueue });
  const registry = new Registry();
  const seen: string[] = [];
  let release!: () => void;
  const latch = new Promise<void>((r) => {
    release = r;
  });
  let finished = 0;
  const ctl = runController({
    name: "burst",
    queue,
    workers: 2,
    logger: silentLogger,
    registry,
    clock: realClock,
    async reconcile(key) {
      seen.push(cache.get(key)?.metadata.annotations?.n ?? "none");
      if (seen.length === 1) await latch;
      finished++;
    },
  });
  await cache.start();
  try {
    await eventually(() => seen.length === 1, 30_000, "first reconcile running");
    const updates = 100;
    let last = "";
    for (let i = 0; i < updates; i++) {
      const stored = await parts.mergePatch("hot", ns, { metadata: { annotations: { n: String(i) } } });
      last = stored.metadata.resourceVersion ?? "";
    }
    // Every update is in the cache (so every handler call has run) while the first reconcile holds.
    await eventually(
      () => cache.get(`${ns}/hot`)?.metadata.resourceVersion === last,
      30_000,
      "cache caught up",
    );
    expect(seen).toEqual(["none"]);
    release();
    await eventually(() => finished === 2, 30_000, "follow-up reconcile");
    expect(seen).toEqual(["none", String(updates - 1)]);
    expect(queue.length).toBe(0);
    expect(registry.render()).toContain('distort_reconcile_total{controller="burst",result="success"} 2');
  } finally {
    release();
    await ctl.stop();
    await cache.stop();
  }
});
