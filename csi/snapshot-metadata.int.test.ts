// Changed-block tracking end to end below Kubernetes' sidecar: the CSI SnapshotMetadata service on
// a real gRPC socket, the real agent reading each snapshot's clusters through SPDK shallow copies
// into sparse files (nvmf_tgt emulator), a real kube-apiserver. Known blocks are written between
// two snapshots; the delta lists exactly the clusters holding them. An agent with the feature off
// (no scratch directory) leaves its snapshots without records, and the service refuses them.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAgentConfig } from "../agent/config.ts";
import { type RunningAgent, runAgent } from "../agent/main.ts";
import { externalIdFor, lvstoreNameFor } from "../agent/partitions/identity.ts";
import {
  kinds,
  type NVMeDevice,
  type NVMeDeviceClaim,
  type NVMePartition,
  type NVMeSnapshot,
} from "../api/index.ts";
import {
  Controller,
  Identity,
  PluginCapability_Service_Type as ServiceType,
  SnapshotMetadata,
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
import { ALLOCATION_UNIT } from "../lib/units.ts";
import { formatVolumeId, parseVolumeId } from "./controller/volume-id.ts";

const GiB = 1024 ** 3;
const CLUSTER = ALLOCATION_UNIT;
const SIZE = 16 * CLUSTER;
const SM = SnapshotMetadata.method;

let tc: TestCluster;
let root: string;
let ns: string;
let csi: TestCsiController;
let client: GrpcJsClient;
let parts: ResourceClient<NVMePartition>;
let snaps: ResourceClient<NVMeSnapshot>;
const nodes: { node: SimStorageNode; agent: RunningAgent; device: NVMeDevice; claim: NVMeDeviceClaim }[] = [];

async function storageNode(name: string, serial: string, extra: Record<string, string>) {
  const node = await startSimStorageNode({
    nodeName: name,
    drives: [{ serial, pciAddress: "0000:3b:00.0", sizeBytes: 2 * GiB }],
  });
  const agent = await runAgent(parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns, extra)), silentLogger);
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === serial),
    15_000,
    `NVMeDevice ${serial} reported`,
  );
  const claim = await claimDevice(tc.conn, device, ns);
  const n = { node, agent, device, claim };
  nodes.push(n);
  return n;
}

beforeAll(async () => {
  tc = await testCluster();
  root = await mkdtemp(join(tmpdir(), "distort-cbt-"));
  ns = await tc.namespace("cbt");
  await storageNode("node-a", "SIMCBT0001", { DISTORT_BLOCK_METADATA_DIR: join(root, "scratch-a") });
  // Changed-block tracking off: no scratch directory.
  await storageNode("node-b", "SIMCBT0002", {});
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  snaps = new ResourceClient(tc.conn, kinds.NVMeSnapshot);
  csi = await startTestCsiController({
    conn: tc.conn,
    namespace: ns,
    dir: root,
    services: (c) => [
      register(Controller, c.service()),
      register(SnapshotMetadata, c.snapshotMetadataService()),
    ],
  });
  client = csi.client;
}, 300_000);

afterAll(async () => {
  await csi?.close();
  for (const n of nodes) {
    await n.agent.stop();
    await n.node.close();
  }
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

/** A thin volume on `n`, exported; its id and its lvol's bdev. */
async function volume(n: (typeof nodes)[number], name: string) {
  const spec = placedPartition(name, ns, n.device, n.claim, SIZE);
  spec.spec.thinProvisioning = true;
  const p = await createPlaced(tc.conn, spec, n.device);
  await eventually(
    async () => ((await parts.get(name, ns))?.status?.state === "Exported" ? true : undefined),
    20_000,
    `${name} Exported`,
  );
  const lvol = `${lvstoreNameFor(n.device.spec.serial)}/${externalIdFor(p.metadata.uid as string)}`;
  return {
    id: formatVolumeId({ namespace: ns, name, uid: p.metadata.uid as string }),
    bdev: n.node.emulator.bdev(lvol),
  };
}

function block(label: string, bytes: number): Buffer {
  const b = Buffer.alloc(bytes, 0x5a);
  for (let i = 0; i < bytes; i += 4096) b.write(`${label} @${i}`, i);
  return b;
}

async function snapshot(name: string, sourceVolumeId: string): Promise<string> {
  const r = await client.unary(Controller.method.createSnapshot, { name, sourceVolumeId });
  expect(r.snapshot?.readyToUse).toBe(true);
  return r.snapshot?.snapshotId as string;
}

/** The snapshot's CR once its record reads `status` ("True": recorded). */
function recorded(id: string, status = "True") {
  const ref = parseVolumeId(id);
  if (!ref) throw new Error(`bad id ${id}`);
  return eventually(
    async () => {
      const s = await snaps.get(ref.name, ns);
      const c = s?.status?.conditions?.find((x) => x.type === "BlockMetadata");
      return c?.status === status ? s : undefined;
    },
    20_000,
    `${ref.name} BlockMetadata=${status}`,
  );
}

async function clustersOf(
  stream: Promise<
    { blockMetadata: { byteOffset: bigint; sizeBytes: bigint }[]; volumeCapacityBytes: bigint }[]
  >,
) {
  const msgs = await stream;
  for (const m of msgs) expect(m.volumeCapacityBytes).toBe(BigInt(SIZE));
  return msgs.flatMap((m) =>
    m.blockMetadata.map((b) => {
      expect(b.sizeBytes).toBe(BigInt(CLUSTER));
      return Number(b.byteOffset) / CLUSTER;
    }),
  );
}

describe("with changed-block tracking on", () => {
  test("the plugin advertises the snapshot metadata service", async () => {
    const r = await client.unary(Identity.method.getPluginCapabilities, {});
    expect(
      r.capabilities.some(
        (c) => c.type.case === "service" && c.type.value.type === ServiceType.SNAPSHOT_METADATA_SERVICE,
      ),
    ).toBe(true);
  });

  test("the delta between two snapshots lists exactly the clusters written between them; allocation, paging, merge on delete", async () => {
    const a = nodes[0] as (typeof nodes)[number];
    const v = await volume(a, "cbt-vol");
    await v.bdev.write(0, block("first", 4 * CLUSTER));
    const snapA = await snapshot("snap-a", v.id);
    await v.bdev.write(2 * CLUSTER + 8192, block("second", 4096));
    await v.bdev.write(5 * CLUSTER, block("second", 4096));
    await v.bdev.write(9 * CLUSTER, block("second", CLUSTER));
    const snapB = await snapshot("snap-b", v.id);
    const recA = await recorded(snapA);
    const recB = await recorded(snapB);
    expect(recB.status?.blockMetadata?.parentSnapshot).toBe(recA.status?.externalId as string);

    const delta = (extra: { startingOffset?: bigint; maxResults?: number } = {}) =>
      client.serverStream(SM.getMetadataDelta, { baseSnapshotId: snapA, targetSnapshotId: snapB, ...extra });
    const allocated = (snapshotId: string, extra: { startingOffset?: bigint; maxResults?: number } = {}) =>
      client.serverStream(SM.getMetadataAllocated, { snapshotId, ...extra });
    expect(await clustersOf(delta())).toEqual([2, 5, 9]);
    expect(await clustersOf(allocated(snapA))).toEqual([0, 1, 2, 3]);
    expect(await clustersOf(allocated(snapB))).toEqual([0, 1, 2, 3, 5, 9]);
    // Paging: one tuple per message, and resuming inside cluster 2 keeps cluster 2.
    const paged = await delta({ maxResults: 1 });
    expect(paged.map((m) => m.blockMetadata.length)).toEqual([1, 1, 1]);
    expect(await clustersOf(delta({ startingOffset: BigInt(2 * CLUSTER + 1) }))).toEqual([2, 5, 9]);
    expect(await clustersOf(delta({ startingOffset: BigInt(3 * CLUSTER) }))).toEqual([5, 9]);

    // Wrong way round, unknown ids, offsets outside the volume.
    const unknown = formatVolumeId({
      namespace: ns,
      name: "nope",
      uid: "00000000-0000-4000-8000-000000000000",
    });
    expect(
      await code(
        client.serverStream(SM.getMetadataDelta, { baseSnapshotId: snapB, targetSnapshotId: snapA }),
      ),
    ).toBe(3);
    expect(
      await code(
        client.serverStream(SM.getMetadataDelta, { baseSnapshotId: unknown, targetSnapshotId: snapB }),
      ),
    ).toBe(5);
    expect(await code(client.serverStream(SM.getMetadataAllocated, { snapshotId: "" }))).toBe(3);
    expect(await code(allocated(snapB, { startingOffset: BigInt(SIZE) }))).toBe(11);

    // Deleting snap-a merges it into snap-b (its only clone): snap-b's record is read again and
    // now holds snap-a's clusters, with no parent; the allocation it reports is unchanged.
    await client.unary(Controller.method.deleteSnapshot, { snapshotId: snapA });
    const merged = await eventually(
      async () => {
        const s = await snaps.get(recB.metadata.name, ns);
        const bm = s?.status?.blockMetadata;
        return bm &&
          bm.parentSnapshot === undefined &&
          bm.fingerprint !== recB.status?.blockMetadata?.fingerprint
          ? s
          : undefined;
      },
      20_000,
      "snap-b re-recorded after the merge",
    );
    expect(merged.status?.conditions?.find((c) => c.type === "BlockMetadata")?.status).toBe("True");
    expect(await clustersOf(allocated(snapB))).toEqual([0, 1, 2, 3, 5, 9]);
    // No scratch file is left behind once reads settle.
    await eventually(
      async () => ((await readdir(join(root, "scratch-a"))).length === 0 ? true : undefined),
      10_000,
      "scratch directory empty",
    );
    await client.unary(Controller.method.deleteSnapshot, { snapshotId: snapB });
  }, 120_000);
});

describe("with changed-block tracking off", () => {
  test("snapshots get no record and the service refuses them (UNAVAILABLE), never an empty answer", async () => {
    const b = nodes[1] as (typeof nodes)[number];
    const v = await volume(b, "plain-vol");
    await v.bdev.write(0, block("first", CLUSTER));
    const s1 = await snapshot("plain-1", v.id);
    await v.bdev.write(3 * CLUSTER, block("second", 4096));
    const s2 = await snapshot("plain-2", v.id);
    // Give the agent time it would need to record; nothing appears.
    await Bun.sleep(1500);
    const ref = parseVolumeId(s2);
    const cr = await snaps.get(ref?.name as string, ns);
    expect(cr?.status?.readyToUse).toBe(true);
    expect(cr?.status?.blockMetadata).toBeUndefined();
    expect(
      await code(client.serverStream(SM.getMetadataDelta, { baseSnapshotId: s1, targetSnapshotId: s2 })),
    ).toBe(14);
    expect(await code(client.serverStream(SM.getMetadataAllocated, { snapshotId: s2 }))).toBe(14);
  }, 60_000);
});
