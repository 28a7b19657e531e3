// The volume key Secret against a real kube-apiserver: created on the first host, owned by the
// partition, one pair per host (a controller key only when bidirectional), concurrent publishes
// for two hosts both land, an unchanged pair is kept, removal drops only that host's entries.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { exampleNVMePartition } from "../../api/examples.ts";
import { kinds, type NVMePartition } from "../../api/index.ts";
import { type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { parseDhchapSecret } from "../nvme/dhchap.ts";
import { hostEntryKeys, hostKeyPairFrom, hostPskFrom } from "../nvme/dhchap-keys.ts";
import { isInterchangePsk } from "../nvme/tls-psk.ts";
import { ResourceClient } from "./resource.ts";
import { kubeVolumeKeyStore, ROTATION_GENERATION_KEY, VOLUME_KEYS_SECRET_TYPE } from "./volume-keys.ts";

const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";

let tc: TestCluster;
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await tc?.stop();
});

async function partition(ns: string, name = "vol-keys"): Promise<NVMePartition> {
  const p = exampleNVMePartition();
  return new ResourceClient(tc.conn, kinds.NVMePartition).create({
    apiVersion: p.apiVersion,
    kind: p.kind,
    metadata: { name, namespace: ns },
    spec: { sizeBytes: 2 ** 30, backend: "spdk", volumeManager: "partition" },
  } as NVMePartition);
}

test("pairs per host in one owned Secret; concurrent writers both land; removal is per host", async () => {
  const ns = await tc.namespace("keys");
  const p = await partition(ns);
  const store = kubeVolumeKeyStore(tc.conn, { "storage.distort.io/provisioned-by": "csi" });
  const name = "dhchap-pvc-1";
  await Promise.all([
    store.ensureHost(p, name, H1, "bidirectional", "sha384"),
    store.ensureHost(p, name, H2, "bidirectional", "sha384"),
  ]);
  const raw = await tc.conn.api(k8s.CoreV1Api).readNamespacedSecret({ name, namespace: ns });
  expect(raw.type).toBe(VOLUME_KEYS_SECRET_TYPE);
  expect(raw.metadata?.ownerReferences).toEqual([
    { apiVersion: p.apiVersion, kind: "NVMePartition", name: "vol-keys", uid: p.metadata.uid as string },
  ]);
  const data = (await store.read(ns, name)) as Record<string, string>;
  const [a, b] = [hostKeyPairFrom(data, H1), hostKeyPairFrom(data, H2)];
  expect(a?.ctrlSecret).toBeString();
  expect(b?.ctrlSecret).toBeString();
  expect(new Set([a?.secret, a?.ctrlSecret, b?.secret, b?.ctrlSecret]).size).toBe(4);
  expect(parseDhchapSecret(a?.secret as string).hash).toBe(2);
  expect(data[hostEntryKeys(H1).hostNqn]).toBe(H1);

  // Publishing again keeps the pair (a connected host keeps working).
  await store.ensureHost(p, name, H1, "bidirectional", "sha384");
  expect(hostKeyPairFrom((await store.read(ns, name)) as Record<string, string>, H1)).toEqual(a);

  // A TLS PSK for H2 goes beside its pair and is kept when asked again.
  await store.ensurePsk(p, name, H2);
  const psk = hostPskFrom((await store.read(ns, name)) as Record<string, string>, H2);
  expect(isInterchangePsk(psk as string)).toBe(true);
  await store.ensurePsk(p, name, H2);
  expect(hostPskFrom((await store.read(ns, name)) as Record<string, string>, H2)).toBe(psk as string);

  await store.removeHost(ns, name, H1);
  const after = (await store.read(ns, name)) as Record<string, string>;
  expect(hostKeyPairFrom(after, H1)).toBeUndefined();
  expect(hostKeyPairFrom(after, H2)).toEqual(b);
  expect(Object.keys(after).sort()).toEqual(Object.values(hostEntryKeys(H2)).sort());
  // Retaining a host keeps exactly its pair.
  await store.ensureHost(p, name, H1, "bidirectional", "sha384");
  await store.retainHosts(ns, name, [H2]);
  expect(Object.keys((await store.read(ns, name)) as Record<string, string>).sort()).toEqual(
    Object.values(hostEntryKeys(H2)).sort(),
  );
  await store.retainHosts(ns, "dhchap-absent", [H2]);
  // Idempotent, and a missing Secret is fine.
  await store.removeHost(ns, name, H1);
  await store.removeHost(ns, "dhchap-absent", H1);
  expect(await store.read(ns, "dhchap-absent")).toBeUndefined();
}, 60_000);

test("unidirectional pairs have no controller key", async () => {
  const ns = await tc.namespace("keys");
  const p = await partition(ns);
  const store = kubeVolumeKeyStore(tc.conn);
  await store.ensureHost(p, "dhchap-pvc-2", H1, "unidirectional", "sha256");
  const pair = hostKeyPairFrom((await store.read(ns, "dhchap-pvc-2")) as Record<string, string>, H1);
  expect(pair?.secret).toStartWith("DHHC-1:01:");
  expect(pair?.ctrlSecret).toBeUndefined();
}, 60_000);

test("per host (nvmet): every volume's Secret holds the host's one pair, derived from one master key", async () => {
  const ns = await tc.namespace("keys");
  const [p1, p2] = [await partition(ns, "vol-a"), await partition(ns, "vol-b")];
  const store = kubeVolumeKeyStore(tc.conn);
  await Promise.all([
    store.ensureHost(p1, "dhchap-pvc-a", H1, "bidirectional", "sha256", { perHost: true }),
    store.ensureHost(p2, "dhchap-pvc-b", H1, "bidirectional", "sha512", { perHost: true }),
  ]);
  const a = hostKeyPairFrom((await store.read(ns, "dhchap-pvc-a")) as Record<string, string>, H1);
  const b = hostKeyPairFrom((await store.read(ns, "dhchap-pvc-b")) as Record<string, string>, H1);
  expect(a?.ctrlSecret).toBeString();
  expect(b).toEqual(a as { secret: string; ctrlSecret?: string });
  await store.ensureHost(p1, "dhchap-pvc-a", H2, "unidirectional", "sha256", { perHost: true });
  const other = hostKeyPairFrom((await store.read(ns, "dhchap-pvc-a")) as Record<string, string>, H2);
  expect(other?.secret).not.toBe(a?.secret as string);
  const master = await store.read(ns, "distort-dhchap-master");
  expect(Buffer.from(master?.master ?? "", "utf8").length).toBeGreaterThan(0);
}, 60_000);

test("rotate: every host gets a new pair once per generation; a publish's retainHosts keeps the generation", async () => {
  const ns = await tc.namespace("keys-rotate");
  const p = await partition(ns, "vol-rot");
  const store = kubeVolumeKeyStore(tc.conn);
  const name = "dhchap-pvc-rot";
  expect(await store.rotate(ns, name, "1", "bidirectional", "sha256")).toBeUndefined();
  await store.ensureHost(p, name, H1, "bidirectional", "sha256");
  await store.ensureHost(p, name, H2, "bidirectional", "sha256");
  const before = (await store.read(ns, name)) ?? {};
  expect((await store.rotate(ns, name, "1", "bidirectional", "sha256"))?.sort()).toEqual([H1, H2].sort());
  const after = (await store.read(ns, name)) ?? {};
  expect(after[ROTATION_GENERATION_KEY]).toBe("1");
  for (const h of [H1, H2]) {
    const [a, b] = [hostKeyPairFrom(before, h), hostKeyPairFrom(after, h)];
    expect(b?.secret).not.toBe(a?.secret);
    expect(b?.ctrlSecret).not.toBe(a?.ctrlSecret);
    expect(parseDhchapSecret(b?.secret as string).hash).toBe(1);
  }
  // The same generation again: nothing changes.
  expect(await store.rotate(ns, name, "1", "bidirectional", "sha256")).toEqual([]);
  expect(await store.read(ns, name)).toEqual(after);
  // Dropping a host keeps the record of the rotation, so it is not done twice.
  await store.retainHosts(ns, name, [H1]);
  const kept = (await store.read(ns, name)) ?? {};
  expect(kept[ROTATION_GENERATION_KEY]).toBe("1");
  expect(hostKeyPairFrom(kept, H2)).toBeUndefined();
  expect(hostKeyPairFrom(kept, H1)).toEqual(hostKeyPairFrom(after, H1));
});
