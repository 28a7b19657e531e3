// Volume group snapshots end to end: the CSI GroupController on a real gRPC socket, the real agent
// against the nvmf_tgt emulator, a real kube-apiserver. Two volumes get distinct bytes, one group
// snapshot covers both, the sources are overwritten, and each member restores to its own bytes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAgentConfig } from "../agent/config.ts";
import { type RunningAgent, runAgent } from "../agent/main.ts";
import { externalIdFor, lvstoreNameFor, snapshotExternalIdFor } from "../agent/partitions/identity.ts";
import {
  API_VERSION,
  GROUP_SNAPSHOT_LABEL,
  GroupSnapshotAnnotations,
  kinds,
  type NVMeDevice,
  type NVMeDeviceClaim,
  type NVMePartition,
  type NVMeSnapshot,
} from "../api/index.ts";
import {
  GroupControllerServiceCapability_RPC_Type as GroupCap,
  GroupController,
  Identity,
  PluginCapability_Service_Type as ServiceType,
} from "../gen/csi/v1/csi_pb.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { startTestCsiController, type TestCsiController } from "../lab/harness/csi-controller.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { GrpcCallError, type GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { register } from "../lib/grpc/server.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { formatVolumeId, parseVolumeId } from "./controller/volume-id.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const M = GroupController.method;

let tc: TestCluster;
let root: string;
let node: SimStorageNode;
let agent: RunningAgent;
let csi: TestCsiController;
let client: GrpcJsClient;
let ns: string;
let device: NVMeDevice;
let claim: NVMeDeviceClaim;
let parts: ResourceClient<NVMePartition>;

beforeAll(async () => {
  tc = await testCluster();
  root = await mkdtemp(join(tmpdir(), "distort-group-"));
  ns = await tc.namespace("group");
  node = await startSimStorageNode({
    nodeName: "node-a",
    drives: [{ serial: "SIMG0001", pciAddress: "0000:3b:00.0", sizeBytes: 4 * GiB }],
  });
  agent = await runAgent(parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns)), silentLogger);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMG0001"),
    15_000,
    "NVMeDevice reported",
  );
  claim = await claimDevice(tc.conn, device, ns);
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  csi = await startTestCsiController({
    conn: tc.conn,
    namespace: ns,
    dir: root,
    services: (c) => [register(GroupController, c.groupService())],
  });
  client = csi.client;
}, 300_000);

afterAll(async () => {
  await csi?.close();
  await agent?.stop();
  await node?.close();
  await tc?.stop();
  await rm(root, { recursive: true, force: true });
});

async function code(p: Promise<unknown>): Promise<number> {
  try {
    await p;
    return 0;
  } catch (err) {
    if (err instanceof GrpcCallError) return err.code;
    throw err;
  }
}

const exported = (name: string) =>
  eventually(
    async () => {
      const p = await parts.get(name, ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    20_000,
    `${name} Exported`,
  );

/** 4 KiB blocks each naming the volume and block number: distinct bytes per volume. */
function pattern(label: string, bytes: number): Buffer {
  const b = Buffer.alloc(bytes);
  for (let i = 0; i < bytes; i += 4096) b.write(`${label}: block ${i / 4096}`, i);
  return b;
}

test("the plugin advertises the group controller service and its one capability", async () => {
  const plugin = await client.unary(Identity.method.getPluginCapabilities, {});
  expect(
    plugin.capabilities.some(
      (c) => c.type.case === "service" && c.type.value.type === ServiceType.GROUP_CONTROLLER_SERVICE,
    ),
  ).toBe(true);
  const caps = await client.unary(M.groupControllerGetCapabilities, {});
  expect(caps.capabilities.map((c) => (c.type.case === "rpc" ? c.type.value.type : -1))).toEqual([
    GroupCap.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
  ]);
});

test("a group snapshot of two volumes restores each member byte for byte; idempotent by name; deletion removes every member", async () => {
  const size = 8 * MiB;
  const lvs = lvstoreNameFor(device.spec.serial);
  const sources: { name: string; id: string; lvol: string; bytes: Buffer }[] = [];
  for (const name of ["vol-a", "vol-b"]) {
    const p = await createPlaced(tc.conn, placedPartition(name, ns, device, claim, size), device);
    await exported(name);
    const lvol = externalIdFor(p.metadata.uid as string);
    const bytes = pattern(name, size);
    await node.emulator.bdev(`${lvs}/${lvol}`).write(0, bytes);
    sources.push({
      name,
      id: formatVolumeId({ namespace: ns, name, uid: p.metadata.uid as string }),
      lvol,
      bytes,
    });
  }
  const [a, b] = sources as [(typeof sources)[0], (typeof sources)[0]];

  const created = await client.unary(M.createVolumeGroupSnapshot, {
    name: "group-1",
    sourceVolumeIds: [b.id, a.id],
  });
  const g = created.groupSnapshot;
  expect(g?.readyToUse).toBe(true);
  expect(g?.creationTime).toBeDefined();
  expect(g?.snapshots.map((s) => s.sourceVolumeId).sort()).toEqual([a.id, b.id].sort());
  for (const s of g?.snapshots ?? []) {
    expect(s.readyToUse).toBe(true);
    expect(s.sizeBytes).toBe(BigInt(size));
    expect(s.groupSnapshotId).toBe(g?.groupSnapshotId as string);
  }
  const groupId = g?.groupSnapshotId as string;
  const snapshotIds = (g?.snapshots ?? []).map((s) => s.snapshotId).sort();

  // Same name, same sources (in any order): the same group. Other sources: ALREADY_EXISTS.
  const again = await client.unary(M.createVolumeGroupSnapshot, {
    name: "group-1",
    sourceVolumeIds: [a.id, b.id],
  });
  expect(again.groupSnapshot?.groupSnapshotId).toBe(groupId);
  expect(again.groupSnapshot?.snapshots.map((s) => s.snapshotId).sort()).toEqual(snapshotIds);
  expect(
    await code(client.unary(M.createVolumeGroupSnapshot, { name: "group-1", sourceVolumeIds: [a.id] })),
  ).toBe(6);

  const got = await client.unary(M.getVolumeGroupSnapshot, { groupSnapshotId: groupId, snapshotIds });
  expect(got.groupSnapshot?.snapshots.map((s) => s.snapshotId).sort()).toEqual(snapshotIds);
  expect(got.groupSnapshot?.readyToUse).toBe(true);

  // Overwrite both sources, then restore each member like any snapshot: the group's bytes come back.
  for (const s of sources)
    await node.emulator.bdev(`${lvs}/${s.lvol}`).write(0, pattern("overwritten", size));
  const restored: string[] = [];
  for (const snap of g?.snapshots ?? []) {
    const src = sources.find((s) => s.id === snap.sourceVolumeId) as (typeof sources)[0];
    const ref = parseVolumeId(snap.snapshotId);
    if (!ref) throw new Error(`bad snapshot id ${snap.snapshotId}`);
    const r = placedPartition(`restore-${src.name}`, ns, device, claim, size);
    r.spec.contentSource = { kind: "Snapshot", name: ref.name, uid: ref.uid };
    const made = await createPlaced(tc.conn, r, device);
    await exported(r.metadata.name);
    restored.push(r.metadata.name);
    const got = await node.emulator
      .bdev(`${lvs}/${externalIdFor(made.metadata.uid as string)}`)
      .read(0, size);
    expect(got.equals(src.bytes)).toBe(true);
  }
  expect(restored).toHaveLength(2);

  // A wrong member list is refused; the right one (or none) deletes every member.
  expect(
    await code(
      client.unary(M.deleteVolumeGroupSnapshot, {
        groupSnapshotId: groupId,
        snapshotIds: [snapshotIds[0] as string],
      }),
    ),
  ).toBe(9);
  for (const name of restored) await parts.delete(name, ns);
  for (const name of restored)
    await eventually(async () => !(await parts.get(name, ns)), 20_000, `${name} gone`);
  await client.unary(M.deleteVolumeGroupSnapshot, { groupSnapshotId: groupId, snapshotIds });
  const snaps = new ResourceClient(tc.conn, kinds.NVMeSnapshot);
  expect((await snaps.list({ namespace: ns })).items).toEqual([]);
  expect(await code(client.unary(M.getVolumeGroupSnapshot, { groupSnapshotId: groupId }))).toBe(5);
  // Deleting again is OK.
  expect(
    await code(client.unary(M.deleteVolumeGroupSnapshot, { groupSnapshotId: groupId, snapshotIds })),
  ).toBe(0);
  const lvolsLeft = node.emulator.state().lvols.map((l) => l.name);
  expect(lvolsLeft.filter((n) => n.startsWith("snap-"))).toEqual([]);
  for (const s of sources) await parts.delete(s.name, ns);
}, 120_000);

test("bad requests get their codes and create nothing; sources on two storage nodes are refused", async () => {
  const elsewhere = placedPartition("vol-elsewhere", ns, device, claim, 8 * MiB);
  elsewhere.spec.nodeName = "node-z";
  const z = await parts.create(elsewhere);
  const here = await createPlaced(tc.conn, placedPartition("vol-here", ns, device, claim, 8 * MiB), device);
  const idOf = (p: NVMePartition) =>
    formatVolumeId({ namespace: ns, name: p.metadata.name, uid: p.metadata.uid as string });
  const fake = formatVolumeId({ namespace: ns, name: "nope", uid: "00000000-0000-4000-8000-000000000000" });
  const cases: [string, () => Promise<unknown>, number][] = [
    ["no name", () => client.unary(M.createVolumeGroupSnapshot, { sourceVolumeIds: [idOf(here)] }), 3],
    ["no sources", () => client.unary(M.createVolumeGroupSnapshot, { name: "g" }), 3],
    [
      "a source twice",
      () =>
        client.unary(M.createVolumeGroupSnapshot, { name: "g", sourceVolumeIds: [idOf(here), idOf(here)] }),
      3,
    ],
    [
      "parameters",
      () =>
        client.unary(M.createVolumeGroupSnapshot, {
          name: "g",
          sourceVolumeIds: [idOf(here)],
          parameters: { x: "1" },
        }),
      3,
    ],
    [
      "missing source",
      () => client.unary(M.createVolumeGroupSnapshot, { name: "g", sourceVolumeIds: [idOf(here), fake] }),
      5,
    ],
    [
      "two nodes",
      () => client.unary(M.createVolumeGroupSnapshot, { name: "g", sourceVolumeIds: [idOf(here), idOf(z)] }),
      9,
    ],
    ["delete without id", () => client.unary(M.deleteVolumeGroupSnapshot, {}), 3],
    [
      "delete unknown id",
      () => client.unary(M.deleteVolumeGroupSnapshot, { groupSnapshotId: "elsewhere/g" }),
      0,
    ],
    ["get unknown id", () => client.unary(M.getVolumeGroupSnapshot, { groupSnapshotId: `${ns}/nothing` }), 5],
  ];
  for (const [what, call, want] of cases) expect([what, await code(call())]).toEqual([what, want]);
  const snaps = new ResourceClient(tc.conn, kinds.NVMeSnapshot);
  expect((await snaps.list({ namespace: ns })).items).toEqual([]);
  await parts.delete("vol-elsewhere", ns);
  await parts.delete("vol-here", ns);
}, 60_000);

test("a group take interrupted before any member was ready is redone whole: a member lvol left behind is replaced", async () => {
  const size = 4 * MiB;
  const lvs = lvstoreNameFor(device.spec.serial);
  const snaps = new ResourceClient(tc.conn, kinds.NVMeSnapshot);
  const srcs: { name: string; uid: string; lvol: string }[] = [];
  for (const name of ["crash-a", "crash-b"]) {
    const p = await createPlaced(tc.conn, placedPartition(name, ns, device, claim, size), device);
    await exported(name);
    srcs.push({ name, uid: p.metadata.uid as string, lvol: externalIdFor(p.metadata.uid as string) });
  }
  const members = ["gs-crash-a", "gs-crash-b"];
  const memberOf = (i: number): NVMeSnapshot => ({
    apiVersion: API_VERSION,
    kind: "NVMeSnapshot",
    metadata: {
      name: members[i] as string,
      namespace: ns,
      labels: { [GROUP_SNAPSHOT_LABEL]: "crash-group" },
      annotations: { [GroupSnapshotAnnotations.members]: JSON.stringify(members) },
    },
    spec: { sourcePartitionName: srcs[i]?.name as string, sourcePartitionUID: srcs[i]?.uid as string },
  });
  // Member a exists alone: the agent waits for b, takes nothing.
  const a = await snaps.create(memberOf(0));
  await eventually(
    async () =>
      (await snaps.get(members[0] as string, ns))?.status?.conditions?.find(
        (c) => c.reason === "MemberMissing",
      ),
    20_000,
    "member a waits for b",
  );
  // What an interrupted burst would leave: a's snapshot lvol holding older bytes than the group's point.
  const rpc = new SpdkClient({ socketPath: node.spdkSocket, logger: silentLogger });
  try {
    const srcA = `${lvs}/${srcs[0]?.lvol}`;
    await node.emulator.bdev(srcA).write(0, pattern("stale", size));
    await new SpdkMethods(rpc).bdevLvolSnapshot(srcA, snapshotExternalIdFor(a.metadata.uid as string));
  } finally {
    await rpc.close();
  }
  const now = srcs.map((s) => pattern(`group point ${s.name}`, size));
  for (const [i, s] of srcs.entries())
    await node.emulator.bdev(`${lvs}/${s.lvol}`).write(0, now[i] as Buffer);
  await snaps.create(memberOf(1));
  const ready = await eventually(
    async () => {
      const all = await Promise.all(members.map((m) => snaps.get(m, ns)));
      return all.every((m) => m?.status?.readyToUse) ? (all as NVMeSnapshot[]) : undefined;
    },
    20_000,
    "both members ready",
  );
  for (const [i, m] of ready.entries()) {
    const got = await node.emulator.bdev(`${lvs}/${m.status?.externalId}`).read(0, size);
    expect([m.metadata.name, got.equals(now[i] as Buffer)]).toEqual([m.metadata.name, true]);
  }
  for (const m of members) await snaps.delete(m, ns);
  for (const m of members) await eventually(async () => !(await snaps.get(m, ns)), 20_000, `${m} gone`);
  for (const s of srcs) await parts.delete(s.name, ns);
}, 60_000);
