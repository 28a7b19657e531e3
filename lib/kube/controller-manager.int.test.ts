// CacheSet and ControllerManager against a real kube-apiserver: one cache per kind whoever asks,
// the process transform on every stored object, no reconcile before every cache synced, both
// controllers fed from the one shared cache, readiness, and stop.

import { afterAll, beforeAll, expect, test } from "bun:test";
import { exampleNVMePartition } from "../../api/examples.ts";
import { kinds, type NVMePartition } from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { realClock } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { CacheSet } from "./cache-set.ts";
import { ControllerManager } from "./controller-manager.ts";
import { WorkQueue } from "./queue.ts";
import { objectKey, ResourceClient } from "./resource.ts";

let tc: TestCluster;
let parts: ResourceClient<NVMePartition>;
beforeAll(async () => {
  tc = await testCluster();
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

function partition(ns: string, name: string): NVMePartition {
  const p = exampleNVMePartition();
  return {
    apiVersion: p.apiVersion,
    kind: p.kind,
    metadata: { name, namespace: ns, annotations: { "example.com/bulky": "x".repeat(512) } },
    spec: { sizeBytes: 2 ** 30, backend: "spdk", volumeManager: "partition" },
  } as NVMePartition;
}

test("one cache per kind: the same instance for the same scope, an error for another scope", async () => {
  const ns = await tc.namespace("cacheset");
  const caches = new CacheSet(tc.conn, { logger: silentLogger });
  const a = caches.cache(kinds.NVMePartition, { namespace: ns });
  const b = caches.cache(kinds.NVMePartition, { namespace: ns });
  expect(b).toBe(a);
  const other = (() => {
    try {
      caches.cache(kinds.NVMePartition, { namespace: ns, fieldSelector: "spec.nodeName=n1" });
    } catch (err) {
      return err;
    }
  })();
  expect(other).toBeInstanceOf(StorageError);
  expect((other as StorageError).kind).toBe("invalid");
  const atts = caches.cache(kinds.NVMeVolumeAttachment, { namespace: ns });
  expect(caches.all()).toEqual([a, atts] as never);
  expect(caches.synced).toBe(false);
  await caches.start();
  try {
    expect(caches.synced).toBe(true);
    // A kind first asked for after start would never have been synced before its readers ran.
    expect(() => caches.cache(kinds.NVMeSnapshot)).toThrow(StorageError);
    // Asking again for a kind already there is fine at any time.
    expect(caches.cache(kinds.NVMePartition, { namespace: ns })).toBe(a);
  } finally {
    await caches.stop();
  }
});

test("the transform shapes every object stored and every object handlers see", async () => {
  const ns = await tc.namespace("transform");
  await parts.create(partition(ns, "listed"));
  const caches = new CacheSet(tc.conn, {
    logger: silentLogger,
    transform: (kind, obj) => {
      if (kind.kind === "NVMePartition") delete obj.metadata.annotations;
      return obj;
    },
  });
  const cache = caches.cache(kinds.NVMePartition, { namespace: ns });
  const handed: NVMePartition[] = [];
  cache.on({ add: (o) => handed.push(o), update: (_o, n) => handed.push(n), delete: (o) => handed.push(o) });
  await caches.start();
  try {
    await parts.create(partition(ns, "watched"));
    await parts.mergePatch("watched", ns, { metadata: { labels: { a: "b" } } });
    await eventually(() => cache.get(`${ns}/watched`)?.metadata.labels?.a === "b", 10_000, "update");
    await parts.delete("listed", ns);
    await eventually(() => !cache.get(`${ns}/listed`), 10_000, "delete");
    expect(handed.length).toBeGreaterThanOrEqual(4); // add listed, add watched, update, delete
    for (const o of [...cache.list(), ...handed]) {
      expect(o.metadata.annotations).toBeUndefined();
      expect(o.metadata.uid).toBeTruthy();
      expect(o.spec.sizeBytes).toBe(2 ** 30);
    }
    // The server still has them: the transform only shapes this process's copy.
    expect((await parts.get("watched", ns))?.metadata.annotations?.["example.com/bulky"]).toHaveLength(512);
  } finally {
    await caches.stop();
  }
});

test("controllers share the caches, reconcile only once all synced, and stop with the manager", async () => {
  const ns = await tc.namespace("manager");
  for (let i = 0; i < 20; i++) await parts.create(partition(ns, `p${i}`));
  const caches = new CacheSet(tc.conn, { logger: silentLogger });
  const mgr = new ControllerManager({ caches, logger: silentLogger, clock: realClock });
  const seen = new Map<string, Set<string>>();
  const events: string[] = [];
  const queues: WorkQueue[] = [];
  let reconciledBeforeSync = 0;
  for (const name of ["first", "second"]) {
    const cache = caches.cache(kinds.NVMePartition, { namespace: ns });
    // A second kind that has to sync too before anything is reconciled.
    caches.cache(kinds.NVMeVolumeAttachment, { namespace: ns });
    const queue = new WorkQueue({ name, clock: realClock });
    queues.push(queue);
    const enqueue = (o: NVMePartition) => queue.add(objectKey(o.metadata));
    cache.on({ add: enqueue, update: (_o, n) => enqueue(n), delete: enqueue });
    const keys = new Set<string>();
    seen.set(name, keys);
    mgr.add({
      name,
      queue,
      workers: 2,
      reconcile: async (key) => {
        if (!caches.synced) reconciledBeforeSync++;
        if (cache.get(key)) keys.add(key);
      },
      onSynced: () => events.push(`synced ${name}`),
      onStop: () => events.push(`stop ${name}`),
    });
  }
  expect(() =>
    mgr.add({ name: "first", queue: new WorkQueue({ name: "x" }), workers: 1, reconcile: async () => {} }),
  ).toThrow(StorageError);
  expect(caches.all()).toHaveLength(2);
  expect(mgr.ready).toBe(false);
  await mgr.start();
  expect(mgr.ready).toBe(true);
  expect(events).toEqual(["synced first", "synced second"]);
  expect(() =>
    mgr.add({ name: "late", queue: new WorkQueue({ name: "late" }), workers: 1, reconcile: async () => {} }),
  ).toThrow(StorageError);
  await eventually(() => seen.get("first")?.size === 20 && seen.get("second")?.size === 20, 20_000, "all");
  await parts.create(partition(ns, "late-one"));
  await eventually(
    () => seen.get("first")?.has(`${ns}/late-one`) && seen.get("second")?.has(`${ns}/late-one`),
    10_000,
    "a watched object reaches both controllers",
  );
  expect(reconciledBeforeSync).toBe(0);
  // One list and one watch open per kind, however many controllers read it.
  for (const c of caches.all()) expect(c.stats.lists).toBe(1);

  await mgr.stop();
  await mgr.stop(); // idempotent
  expect(mgr.ready).toBe(false);
  expect(events.slice(2)).toEqual(["stop first", "stop second"]);
  expect(queues.every((q) => q.shuttingDown)).toBe(true);
  // Stopped caches keep their contents for readers.
  expect(caches.cache(kinds.NVMePartition, { namespace: ns }).keys()).toHaveLength(21);
});

test("an abort while the caches sync rejects start and leaves nothing running", async () => {
  const ns = await tc.namespace("abort");
  const caches = new CacheSet(tc.conn, { logger: silentLogger });
  caches.cache(kinds.NVMePartition, { namespace: ns });
  const mgr = new ControllerManager({ caches, logger: silentLogger, clock: realClock });
  const queue = new WorkQueue({ name: "q" });
  mgr.add({ name: "q", queue, workers: 1, reconcile: async () => {} });
  const ctl = new AbortController();
  ctl.abort(new StorageError("unavailable", "leadership lost"));
  const err = await mgr.start(ctl.signal).catch((e) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).message).toContain("leadership lost");
  expect(mgr.ready).toBe(false);
  expect(queue.shuttingDown).toBe(true);
  await expect(mgr.start()).rejects.toThrow(StorageError);
});
