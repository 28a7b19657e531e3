// The claim reconciler against a real kube-apiserver: binding by serial and node with a
// generation-aware Bound condition, no stealing, release and held release on deletion, reclaiming
// after a forced deletion, and an old claim's late reconcile never releasing its replacement's device.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { Inventory } from "../inventory.ts";
import { GiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";
import { CLAIM_FINALIZER } from "../vocabulary.ts";
import { claimReconciler } from "./claim-controller.ts";

let tc: TestCluster;
const harnesses: Harness[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.stop()));
  await tc?.stop();
});

async function setup(prefix: string): Promise<Harness> {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  return h;
}

const reconcileCtx = { signal: new AbortController().signal, log: undefined as never, attempt: 1 };

test("binds by exact serial on the requested node; Bound follows the generation; no stealing", async () => {
  const h = await setup("bind");
  const serial = `S-${h.ns}`;
  await h.createDevice("a", { node: "node-a", serial });
  await h.createDevice("b", { node: "node-b", serial });
  await h.createDevice("c", { node: "node-b", serial: `${serial}X` }); // a prefix match is no match
  await h.start();

  // Two devices report the serial: without spec.nodeName the claim cannot choose.
  const c1 = await h.createClaim("c1", serial);
  const pending = await eventually(
    async () => {
      const c = await h.claims.get("c1", h.ns);
      return c?.status?.conditions.find((x) => x.type === "Bound")?.reason === "AmbiguousSerial" && c;
    },
    10_000,
    "AmbiguousSerial",
  );
  expect(pending.status?.phase).toBe("Pending");
  expect(pending.metadata.finalizers).toContain(CLAIM_FINALIZER);

  // Choosing the node bumps the generation; the Bound condition reports on that generation.
  const patched = await h.claims.mergePatch("c1", h.ns, { spec: { nodeName: "node-b" } });
  expect(patched.metadata.generation).toBe(2);
  const bound = await eventually(
    async () => {
      const c = await h.claims.get("c1", h.ns);
      return c?.status?.phase === "Bound" && c;
    },
    10_000,
    "Bound",
  );
  expect(bound.status).toMatchObject({ deviceName: h.dev("b"), nodeName: "node-b", observedGeneration: 2 });
  expect(bound.status?.conditions.find((x) => x.type === "Bound")).toMatchObject({
    status: "True",
    reason: "DeviceBound",
    observedGeneration: 2,
  });
  const dev = await h.devices.get(h.dev("b"));
  expect(dev?.status?.phase).toBe("Claimed");
  expect(dev?.status?.claimRef).toEqual({ namespace: h.ns, name: "c1", uid: c1.metadata.uid as string });
  expect((await h.devices.get(h.dev("a")))?.status?.claimRef).toBeUndefined();
  expect((await h.devices.get(h.dev("c")))?.status?.claimRef).toBeUndefined();

  // A second claim for the same drive stays Pending and says who holds it.
  await h.createClaim("c2", serial, "node-b");
  const c2 = await eventually(
    async () => {
      const c = await h.claims.get("c2", h.ns);
      return c?.status?.conditions.find((x) => x.type === "Bound")?.reason === "DeviceClaimedByOther" && c;
    },
    10_000,
    "c2 refused",
  );
  expect(c2.status?.phase).toBe("Pending");
  expect(c2.status?.conditions[0]?.message).toContain(`already claimed by ${h.ns}/c1`);
  expect((await h.devices.get(h.dev("b")))?.status?.claimRef?.uid).toBe(c1.metadata.uid);
  expect(
    await eventually(async () => (await h.events("c2")).find((e) => e.includes("DeviceClaimedByOther"))),
  ).toMatch(/^Warning DeviceClaimedByOther/);

  // Deleting c1 releases the device (UID matched) and lets c2 have it.
  await h.claims.delete("c1", h.ns);
  await eventually(async () => (await h.claims.get("c1", h.ns)) === undefined, 10_000, "c1 gone");
  const taken = await eventually(
    async () => {
      const d = await h.devices.get(h.dev("b"));
      return d?.status?.claimRef?.name === "c2" && d;
    },
    10_000,
    "c2 binds",
  );
  expect(taken.status?.phase).toBe("Claimed");
  expect(await h.events("c1")).toContain(`Normal Released: device ${h.dev("b")} (serial ${serial}) released`);
}, 30_000);

test("a claim deleted while its device holds partitions is held until they are gone", async () => {
  const h = await setup("hold");
  await h.createDevice("d", { node: "node-a", serial: `S-${h.ns}`, allocatable: 10 * GiB });
  await h.createNode("node-a");
  await h.start();
  await h.createClaim("c", `S-${h.ns}`);
  await eventually(async () => (await h.claims.get("c", h.ns))?.status?.phase === "Bound", 10_000, "bound");
  await h.createPartition("p1", { size: GiB });
  await eventually(async () => (await h.partitions.get("p1", h.ns))?.spec.nodeName, 10_000, "placed");

  await h.claims.delete("c", h.ns);
  const held = await eventually(
    async () => {
      const c = await h.claims.get("c", h.ns);
      return c?.status?.conditions.find((x) => x.type === "Released") && c;
    },
    10_000,
    "Released condition",
  );
  expect(held.metadata.deletionTimestamp).toBeDefined();
  expect(held.status?.conditions.find((x) => x.type === "Released")).toMatchObject({
    status: "False",
    reason: "PartitionsRemain",
    message: `device ${h.dev("d")} still holds 1 partition(s): ${h.ns}/p1; the device is released once they are deleted`,
  });
  expect(
    await eventually(async () => (await h.events("c")).find((e) => e.startsWith("Warning ReleaseBlocked"))),
  ).toBeTruthy();
  await Bun.sleep(300);
  expect((await h.devices.get(h.dev("d")))?.status?.phase).toBe("Claimed");

  await h.partitions.delete("p1", h.ns);
  await eventually(
    async () => (await h.claims.get("c", h.ns)) === undefined,
    10_000,
    "claim released and gone",
  );
  const d = await h.devices.get(h.dev("d"));
  expect(d?.status?.phase).toBe("Available");
  expect(d?.status?.claimRef).toBeUndefined();
  expect(d?.status?.reservations).toEqual([]);
}, 30_000);

test("after a forced deletion the device is reclaimed; the old claim's late reconcile releases nothing", async () => {
  const h = await setup("replace");
  const serial = `S-${h.ns}`;
  await h.createDevice("d", { node: "node-a", serial });
  await h.createDevice("e", { node: "node-a", serial: `${serial}-e` });
  let m = await h.start();
  const old = await h.createClaim("c", serial);
  const other = await h.createClaim("c2", `${serial}-e`);
  for (const [dev, c] of [
    ["d", old],
    ["e", other],
  ] as const) {
    await eventually(
      async () => (await h.devices.get(h.dev(dev)))?.status?.claimRef?.uid === c.metadata.uid,
      10_000,
      `${dev} bound`,
    );
    await eventually(
      async () => (await h.claims.get(c.metadata.name, h.ns))?.metadata.finalizers?.includes(CLAIM_FINALIZER),
      10_000,
      "finalizer",
    );
  }
  const oldSeen = await h.claims.get("c", h.ns);

  // An administrator strips the finalizer: the claim vanishes without releasing its device. The
  // manager notices the device names a claim that no longer exists and reclaims it.
  await h.claims.mergePatch("c2", h.ns, { metadata: { finalizers: null } });
  await h.claims.delete("c2", h.ns);
  const e = await eventually(
    async () => {
      const x = await h.devices.get(h.dev("e"));
      return x?.status?.phase === "Available" && x;
    },
    10_000,
    "vanished claim's device reclaimed",
  );
  expect(e.status?.claimRef).toBeUndefined();

  // Same while no manager runs, and a same-named replacement appears before one starts again:
  // the replacement reclaims the device after checking that the UID it names is gone.
  await m.stop();
  await h.claims.mergePatch("c", h.ns, { metadata: { finalizers: null } });
  await h.claims.delete("c", h.ns);
  await eventually(async () => (await h.claims.get("c", h.ns)) === undefined, 10_000, "old claim gone");
  expect((await h.devices.get(h.dev("d")))?.status?.claimRef?.uid).toBe(old.metadata.uid);
  const replacement = await h.createClaim("c", serial);
  m = await h.start();
  await eventually(
    async () => (await h.devices.get(h.dev("d")))?.status?.claimRef?.uid === replacement.metadata.uid,
    10_000,
    "replacement bound",
  );
  await eventually(
    async () => (await h.claims.get("c", h.ns))?.status?.phase === "Bound",
    10_000,
    "replacement Bound",
  );
  await m.stop();

  // A deposed or lagging manager still believes the OLD claim is being deleted and the device is
  // its own. Its reconcile must neither release the device nor touch the replacement's finalizer.
  const stale = new Inventory();
  const oldDeleting = { ...(oldSeen as NonNullable<typeof oldSeen>) };
  oldDeleting.metadata = { ...oldDeleting.metadata, deletionTimestamp: new Date().toISOString() };
  stale.setClaim(oldDeleting);
  const devNow = (await h.devices.get(h.dev("d"))) as NonNullable<Awaited<ReturnType<typeof h.devices.get>>>;
  stale.setDevice({
    ...devNow,
    status: {
      ...(devNow.status as NonNullable<typeof devNow.status>),
      claimRef: { namespace: h.ns, name: "c", uid: old.metadata.uid as string },
    },
  });
  const ctx = h.context(stale);
  await claimReconciler(ctx)(`${h.ns}/c`, { ...reconcileCtx, log: ctx.log });
  const after = await h.devices.get(h.dev("d"));
  expect(after?.status?.phase).toBe("Claimed");
  expect(after?.status?.claimRef?.uid).toBe(replacement.metadata.uid);
  expect((await h.claims.get("c", h.ns))?.metadata.finalizers).toContain(CLAIM_FINALIZER);
}, 30_000);
