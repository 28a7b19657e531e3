// The agent end to end against the real kube-apiserver and the nvmf_tgt emulator on its socket:
// the reporter publishes the drive, a claimed drive yields an Exported partition that really
// exists in the target, attachments drive the host ACL, and deletion leaves nothing behind.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import {
  kinds,
  type NVMeDevice,
  type NVMeDeviceClaim,
  type NVMePartition,
  type NVMeVolumeAttachment,
} from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { attachmentNameFor } from "../lib/volume-identity.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";
import { externalIdFor, lvstoreNameFor, nqnFor, snapshotExternalIdFor } from "./partitions/identity.ts";

const GiB = 1024 ** 3;
const HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0d4c1d0e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const HOST_B = "nqn.2014-08.org.nvmexpress:uuid:7e6d5c4b-3a29-4817-9605-f4e3d2c1b0a9";

let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;
let device: NVMeDevice;
let claim: NVMeDeviceClaim;
let parts: ResourceClient<NVMePartition>;
let vas: ResourceClient<NVMeVolumeAttachment>;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("agent");
  node = await startSimStorageNode({
    nodeName: "node-a",
    drives: [{ serial: "SIMA0001", pciAddress: "0000:3b:00.0", sizeBytes: 8 * GiB }],
  });
  const cfg = parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns));
  agent = await runAgent(cfg, createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }));
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMA0001"),
    15_000,
    "NVMeDevice reported",
  );
  claim = await claimDevice(tc.conn, device, ns);
}, 300_000);

afterAll(async () => {
  await agent?.stop();
  await node?.close();
  await tc?.stop();
});

test("the reporter publishes the drive with reserved, 4 MiB-rounded capacity and a heartbeat", async () => {
  expect(device.spec.nodeName).toBe("node-a");
  expect(device.spec.pciAddress).toBe("0000:3b:00.0");
  expect(device.spec.allocatableBytes % (4 * 1024 * 1024)).toBe(0);
  expect(device.spec.allocatableBytes).toBeLessThanOrEqual(0.99 * 8 * GiB);
  const nodes = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  const sn = await eventually(
    async () => {
      const n = await nodes.get("node-a", ns);
      return n?.status?.rdmaIP ? n : undefined;
    },
    10_000,
    "RDMAStorageNode with an endpoint",
  );
  expect(sn.status?.rdmaIP).toBe("127.0.0.1");
  expect(sn.status?.lastHeartbeatTime).toBeTruthy();
  // Read from the target (the emulator answers as v25.05.1 does).
  expect(sn.status?.spdkVersion).toBe("v25.05.1");
  expect(sn.status?.conditions?.find((c) => c.type === "SpdkInventoryReady")?.status).toBe("True");
});

test("a placed partition becomes Exported and really exists in the target; attachments drive the ACL; deletion leaves nothing", async () => {
  const created = await createPlaced(
    tc.conn,
    placedPartition("p1", ns, device, claim, 100 * 1024 * 1024 + 1),
    device,
  );
  const uid = created.metadata.uid as string;
  const id = externalIdFor(uid);
  const nqn = nqnFor(id);
  const vaName = attachmentNameFor("p1", uid);
  const exported = await eventually(
    async () => {
      const p = await parts.get("p1", ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    20_000,
    "Exported",
  );
  expect(exported.status).toMatchObject({
    nqn,
    externalId: id,
    portalIP: "127.0.0.1",
    portalPort: 4420,
    transport: "tcp",
  });
  expect(exported.status?.allocatedBytes).toBe(104 * 1024 * 1024);
  expect(exported.metadata.finalizers).toContain("storage.distort.io/partition-cleanup");

  let s = node.emulator.state();
  const lvols = s.lvols.filter((l) => l.name === id);
  expect(lvols).toHaveLength(1);
  const sub = s.subsystems.find((x) => x.nqn === nqn);
  expect(sub?.allowAnyHost).toBe(false);
  expect(sub?.hosts).toEqual([]);
  expect(sub?.namespaces.map((n) => `${n.nsid}:${n.bdevName}`)).toEqual([`1:${lvols[0]?.uuid}`]);
  expect(sub?.listeners.map((l) => [l.trtype, l.traddr, l.trsvcid])).toEqual([["TCP", "127.0.0.1", "4420"]]);
  const dev = await new ResourceClient(tc.conn, kinds.NVMeDevice).get(device.metadata.name);
  expect(dev?.status?.activeBackend).toBe("spdk");

  // Attachment: the ACL holds exactly its host, AccessReady follows; a takeover revokes first.
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "p1",
      partitionUID: uid,
      nodeId: "worker-1",
      hostNQN: HOST_A,
      attachmentId: "att-1",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
    10_000,
    "AccessReady",
  );
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)?.hosts).toEqual([HOST_A]);
  const va = (await vas.get(vaName, ns)) as NVMeVolumeAttachment;
  await vas.replace({
    ...va,
    spec: { ...va.spec, nodeId: "worker-2", hostNQN: HOST_B, attachmentId: "att-2" },
  });
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-2",
    10_000,
    "takeover ready",
  );
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)?.hosts).toEqual([HOST_B]);

  // Deletion waits for the attachment; its removal revokes the host, then cleanup completes.
  await parts.delete("p1", ns);
  await Bun.sleep(1500);
  expect((await parts.get("p1", ns))?.status?.conditions?.find((c) => c.type === "Ready")?.reason).toBe(
    "AttachmentsExist",
  );
  expect(node.emulator.state().lvols.filter((l) => l.name === id)).toHaveLength(1);
  await vas.delete(vaName, ns);
  await eventually(async () => !(await vas.get(vaName, ns)), 10_000, "attachment gone");
  await eventually(async () => !(await parts.get("p1", ns)), 20_000, "partition gone");
  s = node.emulator.state();
  expect(s.lvols.filter((l) => l.name === id)).toEqual([]);
  expect(s.subsystems.filter((x) => x.nqn === nqn)).toEqual([]);
}, 90_000);

test("a placement the manager did not make (no ledger entry, or no claim) is refused and leaves the target untouched", async () => {
  const before = node.emulator.state();
  // Created with placement already set, as a tenant could with the admission policy off: the
  // claim is right, but the drive's ledger never got an entry for it.
  const unreserved = await parts.create(placedPartition("p-unreserved", ns, device, claim, 64 * 1024 * 1024));
  const noClaim = placedPartition("p-no-claim", ns, device, claim, 64 * 1024 * 1024);
  delete noClaim.spec.claimRef;
  await parts.create(noClaim);
  for (const [name, reason] of [
    ["p-unreserved", "NotReserved"],
    ["p-no-claim", "NotPlacedByManager"],
  ] as const) {
    const failed = await eventually(
      async () => {
        const x = await parts.get(name, ns);
        return x?.status?.state === "Failed" ? x : undefined;
      },
      15_000,
      `${name} Failed`,
    );
    expect(failed.status?.conditions?.find((c) => c.type === "Ready")?.reason).toBe(reason);
    // Refused before anything of ours: no finalizer, no identity, no export.
    expect(failed.metadata.finalizers ?? []).not.toContain("storage.distort.io/partition-cleanup");
    expect(failed.status?.externalId).toBeUndefined();
  }
  const after = node.emulator.state();
  const id = externalIdFor(unreserved.metadata.uid as string);
  expect(after.lvols.filter((l) => l.name === id)).toEqual([]);
  expect(after.lvols.length).toBe(before.lvols.length);
  expect(after.subsystems.length).toBe(before.subsystems.length);
  for (const name of ["p-unreserved", "p-no-claim"]) {
    await parts.delete(name, ns);
    await eventually(async () => !(await parts.get(name, ns)), 15_000, `${name} deletable`);
  }
}, 60_000);

test("a kernel partition on a drive locked to SPDK is refused with a condition naming the reason", async () => {
  const p = placedPartition("p-kernel", ns, device, claim, 64 * 1024 * 1024);
  p.spec.backend = "kernel";
  p.spec.targetOptions = { transport: "tcp" };
  await createPlaced(tc.conn, p, device);
  const failed = await eventually(
    async () => {
      const x = await parts.get("p-kernel", ns);
      return x?.status?.state === "Failed" ? x : undefined;
    },
    15_000,
    "Failed",
  );
  const ready = failed.status?.conditions?.find((c) => c.type === "Ready");
  expect(ready?.reason).toBe("BackendConflict");
  expect(ready?.message).toContain("mix kernel and SPDK");
  await parts.delete("p-kernel", ns);
  await eventually(async () => !(await parts.get("p-kernel", ns)), 15_000, "refused partition deletable");
}, 60_000);

test("after a target crash that drops every export, the agent re-exports the partition", async () => {
  await createPlaced(tc.conn, placedPartition("p2", ns, device, claim, 64 * 1024 * 1024), device);
  const p = await eventually(
    async () => {
      const x = await parts.get("p2", ns);
      return x?.status?.state === "Exported" ? x : undefined;
    },
    20_000,
    "Exported",
  );
  const nqn = p.status?.nqn as string;
  await node.emulator.crash();
  await node.emulator.restart();
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)).toBeUndefined();
  await eventually(
    () =>
      node.emulator
        .state()
        .subsystems.find((x) => x.nqn === nqn && x.namespaces.length === 1 && x.listeners.length === 1),
    15_000,
    "re-export",
  );
  expect(node.emulator.state().lvols.filter((l) => l.name === p.status?.externalId)).toHaveLength(1);
  await parts.delete("p2", ns);
  await eventually(async () => !(await parts.get("p2", ns)), 20_000, "partition gone");
}, 90_000);

/** A DH-HMAC-CHAP secret in its exchange form: 32 random bytes plus their CRC-32, base64. */
function dhchapSecret(): string {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const crc = Buffer.alloc(4);
  crc.writeUInt32LE(Bun.hash.crc32(key) >>> 0);
  return `DHHC-1:00:${Buffer.concat([Buffer.from(key), crc]).toString("base64")}:`;
}

test("DH-HMAC-CHAP: the host is admitted only with the Secret's key, installed through the keyring", async () => {
  const secret = dhchapSecret();
  await tc.conn.api(k8s.CoreV1Api).createNamespacedSecret({
    namespace: ns,
    body: { metadata: { name: "chap" }, stringData: { key: secret } },
  });
  const p = placedPartition("p-chap", ns, device, claim, 64 * 1024 * 1024);
  p.spec.targetOptions = { transport: "tcp", dhchapSecretRef: { name: "chap", key: "key" } };
  const created = await createPlaced(tc.conn, p, device);
  const uid = created.metadata.uid as string;
  const vaName = attachmentNameFor("p-chap", uid);
  const exported = await eventually(
    async () => {
      const x = await parts.get("p-chap", ns);
      return x?.status?.state === "Exported" ? x : undefined;
    },
    20_000,
    "Exported",
  );
  const nqn = exported.status?.nqn as string;
  await vas.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: vaName, namespace: ns },
    spec: {
      partitionName: "p-chap",
      partitionUID: uid,
      nodeId: "worker-1",
      hostNQN: HOST_A,
      attachmentId: "att-1",
    },
  } as NVMeVolumeAttachment);
  await eventually(
    async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
    10_000,
    "AccessReady",
  );

  const client = new SpdkClient({ socketPath: node.spdkSocket, logger: silentLogger });
  try {
    const m = new SpdkMethods(client);
    const [sub] = await m.nvmfGetSubsystems(nqn);
    const host = sub?.hosts.find((h) => h.nqn === HOST_A);
    expect(host?.dhchap_key).toMatch(/^dhchap-[0-9a-f]{24}$/);
    const key = (await m.keyringGetKeys()).find((k) => k.name === host?.dhchap_key);
    expect(key?.path).toBe(join(node.dir, "keys", host?.dhchap_key as string));
    expect(readFileSync(key?.path as string, "utf8")).toBe(secret);
    expect(statSync(key?.path as string).mode & 0o777).toBe(0o600);

    // Revocation takes the key with it: nothing secret stays behind on the node.
    await vas.delete(vaName, ns);
    await eventually(async () => !(await vas.get(vaName, ns)), 10_000, "attachment gone");
    expect((await m.keyringGetKeys()).filter((k) => k.name.startsWith("dhchap-"))).toEqual([]);
    expect(() => statSync(key?.path as string)).toThrow();
  } finally {
    await client.close();
  }
  await parts.delete("p-chap", ns);
  await eventually(async () => !(await parts.get("p-chap", ns)), 20_000, "partition gone");
}, 60_000);

test("snapshot -> restore and partition -> clone carry the source's bytes; deletion removes every lvol", async () => {
  const MiB = 1024 * 1024;
  const snaps = new ResourceClient(tc.conn, kinds.NVMeSnapshot);
  const exportedOf = (name: string) =>
    eventually(
      async () => {
        const p = await parts.get(name, ns);
        return p?.status?.state === "Exported" ? p : undefined;
      },
      20_000,
      `${name} Exported`,
    );
  const src = await createPlaced(tc.conn, placedPartition("snap-src", ns, device, claim, 8 * MiB), device);
  const srcId = externalIdFor(src.metadata.uid as string);
  await exportedOf("snap-src");
  const lvs = lvstoreNameFor(device.spec.serial);
  const pattern = Buffer.alloc(8 * MiB);
  for (let i = 0; i < pattern.length; i += 4096) pattern.write(`block ${i / 4096} of the source`, i);
  await node.emulator.bdev(`${lvs}/${srcId}`).write(0, pattern);

  const snap = await snaps.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeSnapshot",
    metadata: { name: "snap-1", namespace: ns },
    spec: { sourcePartitionName: "snap-src", sourcePartitionUID: src.metadata.uid as string },
  });
  const ready = await eventually(
    async () => {
      const s = await snaps.get("snap-1", ns);
      return s?.status?.readyToUse ? s : undefined;
    },
    20_000,
    "snapshot ready",
  );
  const snapId = snapshotExternalIdFor(snap.metadata.uid as string);
  expect(ready.status).toMatchObject({
    externalId: snapId,
    sizeBytes: 8 * MiB,
    deviceSerial: device.spec.serial,
  });
  expect(ready.metadata.finalizers).toContain("storage.distort.io/snapshot-cleanup");
  // Later writes to the source do not reach the snapshot (or what is restored from it).
  await node.emulator.bdev(`${lvs}/${srcId}`).write(0, Buffer.from("changed after the snapshot"));

  const restore = placedPartition("snap-restore", ns, device, claim, 8 * MiB);
  restore.spec.contentSource = { kind: "Snapshot", name: "snap-1", uid: snap.metadata.uid as string };
  const r = await createPlaced(tc.conn, restore, device);
  const clone = placedPartition("snap-clone", ns, device, claim, 8 * MiB);
  clone.spec.contentSource = { kind: "Partition", name: "snap-src", uid: src.metadata.uid as string };
  const c = await createPlaced(tc.conn, clone, device);
  await exportedOf("snap-restore");
  await exportedOf("snap-clone");
  const rId = externalIdFor(r.metadata.uid as string);
  const cId = externalIdFor(c.metadata.uid as string);
  expect(await node.emulator.bdev(`${lvs}/${rId}`).read(0, 8 * MiB)).toEqual(pattern);
  expect(await node.emulator.bdev(`${lvs}/${cId}`).read(0, 8 * MiB)).toEqual(
    await node.emulator.bdev(`${lvs}/${srcId}`).read(0, 8 * MiB),
  );

  for (const name of ["snap-restore", "snap-clone"]) await parts.delete(name, ns);
  await snaps.delete("snap-1", ns);
  await parts.delete("snap-src", ns);
  await eventually(async () => !(await snaps.get("snap-1", ns)), 20_000, "snapshot gone");
  for (const name of ["snap-restore", "snap-clone", "snap-src"])
    await eventually(async () => !(await parts.get(name, ns)), 20_000, `${name} gone`);
  const left = node.emulator.state().lvols.map((l) => l.name);
  for (const id of [srcId, snapId, rId, cId, `${cId}-src`]) expect(left).not.toContain(id);
}, 120_000);

test("tenancy: only the partition's own record in the release namespace reaches the ACL or holds deletion; a tenant namespace's look-alikes are ignored", async () => {
  const tenant = await tc.namespace("tenant");
  const exported = (name: string, namespace = ns) =>
    eventually(
      async () => {
        const p = await parts.get(name, namespace);
        return p?.status?.state === "Exported" ? p : undefined;
      },
      20_000,
      `${name} Exported`,
    );
  const victim = await createPlaced(
    tc.conn,
    placedPartition("p-victim", ns, device, claim, 8 * 1024 * 1024),
    device,
  );
  const uid = victim.metadata.uid as string;
  const nqn = nqnFor(externalIdFor(uid));
  await exported("p-victim");
  const record = attachmentNameFor("p-victim", uid);
  const attachment = (name: string, namespace: string, hostNQN: string, attachmentId: string) =>
    vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name, namespace },
      spec: { partitionName: "p-victim", partitionUID: uid, nodeId: "worker-2", hostNQN, attachmentId },
    } as NVMeVolumeAttachment);
  // A tenant copies the record's exact name and spec into its own namespace; a second look-alike
  // sits beside the partition under another name.
  await attachment(record, tenant, HOST_B, "att-t");
  await attachment("look-alike", ns, HOST_B, "att-l");
  await attachment(record, ns, HOST_A, "att-1");
  await eventually(
    async () => (await vas.get(record, ns))?.status?.observedAttachmentId === "att-1",
    10_000,
    "the record's AccessReady",
  );
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)?.hosts).toEqual([HOST_A]);
  // The agent never took ownership of the look-alikes (no finalizer, no status).
  for (const [name, namespace] of [
    [record, tenant],
    ["look-alike", ns],
  ] as const) {
    const o = await vas.get(name, namespace);
    expect(o?.metadata.finalizers ?? []).toEqual([]);
    expect(o?.status).toBeUndefined();
  }

  // A clone whose source name does not hold the UID it quotes is refused, not made from that UID.
  const steal = placedPartition("p-steal", ns, device, claim, 8 * 1024 * 1024);
  steal.spec.contentSource = { kind: "Partition", name: "not-the-victim", uid };
  // Placed the manager's way (a ledger entry), so only the content source can be what refuses it.
  await createPlaced(tc.conn, steal, device);
  const refused = await eventually(
    async () => {
      const x = await parts.get("p-steal", ns);
      return x?.status?.state === "Failed" ? x : undefined;
    },
    15_000,
    "clone refused",
  );
  expect(refused.status?.conditions?.find((c) => c.type === "Ready")?.reason).toBe("ContentSourceNotFound");
  expect(node.emulator.state().lvols.map((l) => l.name)).not.toContain(
    externalIdFor(refused.metadata.uid as string),
  );

  // A partition placed in the tenant's namespace is not served: a marker created after it in the
  // release namespace is exported while the tenant's never gets a finalizer or a status.
  await createPlaced(tc.conn, placedPartition("p-tenant", tenant, device, claim, 8 * 1024 * 1024), device);
  await createPlaced(tc.conn, placedPartition("p-marker", ns, device, claim, 8 * 1024 * 1024), device);
  await exported("p-marker");
  const t = await parts.get("p-tenant", tenant);
  expect(t?.metadata.finalizers ?? []).toEqual([]);
  expect(t?.status).toBeUndefined();

  // Releasing the record revokes the host and lets deletion finish, the look-alikes notwithstanding.
  await vas.delete(record, ns);
  await eventually(async () => !(await vas.get(record, ns)), 10_000, "record gone");
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)?.hosts).toEqual([]);
  for (const name of ["p-victim", "p-steal", "p-marker"]) await parts.delete(name, ns);
  for (const name of ["p-victim", "p-steal", "p-marker"])
    await eventually(async () => !(await parts.get(name, ns)), 20_000, `${name} gone`);
  expect(node.emulator.state().subsystems.find((x) => x.nqn === nqn)).toBeUndefined();
  await parts.delete("p-tenant", tenant);
  await vas.delete(record, tenant);
  await vas.delete("look-alike", ns);
}, 120_000);
