// The finalizer patch against the real kube-apiserver: a status write in between does not make it
// conflict, while a finalizer list or incarnation that changed since it was seen does.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { kinds, type NVMePartition } from "../../api/index.ts";
import { type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { forCreate, partition } from "../../manager/testdata/fixtures.ts";
import { PARTITION_FINALIZER } from "./decide.ts";
import { addFinalizerOps } from "./finalizer-patch.ts";

let tc: TestCluster;
let ns: string;
let parts: ResourceClient<NVMePartition>;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("finpatch");
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
}, 120_000);

afterAll(async () => {
  await tc?.stop();
});

async function created(name: string, finalizers?: string[]): Promise<NVMePartition> {
  const p = forCreate(partition(ns, name));
  if (finalizers) p.metadata.finalizers = finalizers;
  return parts.create(p);
}

async function writeStatus(p: NVMePartition): Promise<void> {
  const latest = (await parts.get(p.metadata.name, ns)) as NVMePartition;
  await parts.replaceStatus({ ...latest, status: { state: "Pending", conditions: [] } });
}

test("added over a stale copy when only the status changed", async () => {
  const seen = await created("no-fins");
  await writeStatus(seen);
  const out = await parts.jsonPatch(seen.metadata.name, ns, addFinalizerOps(seen, PARTITION_FINALIZER));
  expect(out.metadata.finalizers).toEqual([PARTITION_FINALIZER]);

  const other = await created("other-fins", ["example.com/hold"]);
  await writeStatus(other);
  const out2 = await parts.jsonPatch(other.metadata.name, ns, addFinalizerOps(other, PARTITION_FINALIZER));
  expect(out2.metadata.finalizers).toEqual(["example.com/hold", PARTITION_FINALIZER]);
});

test("refused (invalid) when the finalizers changed since they were seen", async () => {
  const seen = await created("raced");
  const latest = (await parts.get("raced", ns)) as NVMePartition;
  await parts.replace({ ...latest, metadata: { ...latest.metadata, finalizers: ["example.com/hold"] } });
  await expect(
    parts.jsonPatch("raced", ns, addFinalizerOps(seen, PARTITION_FINALIZER)),
  ).rejects.toMatchObject({
    kind: "invalid",
  });
  expect((await parts.get("raced", ns))?.metadata.finalizers).toEqual(["example.com/hold"]);
});

test("refused (invalid) on a same-named replacement", async () => {
  const seen = await created("replaced");
  await parts.delete("replaced", ns);
  await created("replaced");
  await expect(
    parts.jsonPatch("replaced", ns, addFinalizerOps(seen, PARTITION_FINALIZER)),
  ).rejects.toMatchObject({ kind: "invalid" });
  expect((await parts.get("replaced", ns))?.metadata.finalizers ?? []).toEqual([]);
});
