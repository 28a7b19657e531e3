import { expect, test } from "bun:test";
import type { NVMePartition, ReplicaStatus } from "../../api/index.ts";
import { ManualClock } from "../../lib/clock.ts";
import type { ResourceClient } from "../../lib/kube/resource.ts";
import { silentLogger } from "../../lib/log.ts";
import type { RaidBdev } from "../../lib/spdk/schemas.ts";
import { PARTITION_FINALIZER } from "../partitions/decide.ts";
import { externalIdFor, nqnFor } from "../partitions/identity.ts";
import type { NexusAssembler } from "./assembler.ts";
import type { NexusPlan } from "./decide.ts";
import { nexusControllerNameFor, nexusMemberBdevFor } from "./identity.ts";
import { RebuildDriver } from "./rebuild-driver.ts";

const VUID = "11111111-2222-4333-8444-555555555555";
const MiB = 1024 * 1024;
const ctrlOf = (name: string) => nexusControllerNameFor(`uid-${name}`);

function entry(name: string, over: Partial<ReplicaStatus> = {}): ReplicaStatus {
  return { name, uid: `uid-${name}`, nodeName: `n-${name}`, state: "Online", generation: 2, ...over };
}

function volume(replicas: ReplicaStatus[], resourceVersion: string): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: {
      name: "vol",
      namespace: "distort",
      uid: VUID,
      resourceVersion,
      finalizers: [PARTITION_FINALIZER],
    },
    spec: {
      sizeBytes: 64 * MiB,
      nodeName: "node-a",
      backend: "spdk",
      volumeManager: "partition",
      replicas: 2,
    },
    status: { state: "Exported", dataGeneration: 2, replicas, conditions: [] },
  } as NVMePartition;
}

function copy(name: string): NVMePartition {
  const uid = `uid-${name}`;
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name, namespace: "distort", uid },
    spec: {
      sizeBytes: 64 * MiB,
      nodeName: `n-${name}`,
      backend: "spdk",
      volumeManager: "partition",
      replicaOf: { name: "vol", uid: VUID },
    },
    status: {
      state: "Exported",
      nqn: nqnFor(externalIdFor(uid)),
      portalIP: "10.0.0.2",
      portalPort: 4420,
      transport: "tcp",
      conditions: [],
    },
  } as NVMePartition;
}

/** A raid holding both copies' members, configured, no rebuild running. */
const RAID = {
  name: "nexus_x",
  uuid: "00000000-0000-4000-8000-000000000001",
  strip_size_kb: 0,
  state: "online",
  raid_level: "raid1",
  superblock: true,
  num_base_bdevs: 2,
  num_base_bdevs_discovered: 2,
  num_base_bdevs_operational: 2,
  base_bdevs_list: ["vol-r0", "vol-r1"].map((n, i) => ({
    name: nexusMemberBdevFor(ctrlOf(n)),
    uuid: `00000000-0000-4000-8000-00000000001${i}`,
    is_configured: true,
    data_offset: 2048,
    data_size: 1000,
  })),
} as RaidBdev;

/** The driver over an API holding `latest` as the volume, and a target holding RAID. */
function world(latest: NVMePartition) {
  let stored = latest;
  const detached: string[] = [];
  const partitions = {
    async get(name: string) {
      return name === "vol" ? stored : copy(name);
    },
    async replaceStatus(o: NVMePartition) {
      stored = o;
      return o;
    },
  } as unknown as ResourceClient<NVMePartition>;
  const assembler = {
    async raid() {
      return RAID;
    },
    async controllersUp() {
      return new Set([ctrlOf("vol-r0"), ctrlOf("vol-r1")]);
    },
    async detachController(c: string) {
      detached.push(c);
    },
    async setRebuildBandwidth() {},
  } as unknown as NexusAssembler;
  const driver = new RebuildDriver({
    assembler,
    partitions,
    logger: silentLogger,
    maxPerNode: 2,
    bandwidthMbSec: 0,
    needsGrant: false,
    nodeName: "node-a",
    clock: new ManualClock(Date.parse("2026-12-03T12:00:00Z")),
  });
  return { driver, detached, latest: () => stored };
}

const plan = { raidBdev: "nexus_x", hostNqn: "nqn.host", members: [] } as unknown as NexusPlan;

test("a pass reading the volume from before a rebuild's completion keeps the copy the API now holds current in the raid", async () => {
  // The API: vol-r1 Online at generation 2 (the rebuild was recorded finished). The pass still
  // reads it Rebuilding, and this driver holds no session for it.
  const w = world(volume([entry("vol-r0"), entry("vol-r1")], "20"));
  const stale = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })], "19");
  await w.driver.pass("distort/vol", stale, plan, 1000 * 512, silentLogger);
  expect(w.detached).toEqual([]);
  expect(w.latest().status?.replicas?.find((r) => r.name === "vol-r1")).toMatchObject({
    state: "Online",
    generation: 2,
  });
});

test("a copy found in the raid Rebuilding without a session (the agent restarted) is recorded Stale, then taken out", async () => {
  const rebuilding = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })], "19");
  const w = world(rebuilding);
  await w.driver.pass("distort/vol", rebuilding, plan, 1000 * 512, silentLogger);
  expect(w.detached).toEqual([ctrlOf("vol-r1")]);
  expect(w.latest().status?.replicas?.find((r) => r.name === "vol-r1")).toMatchObject({
    state: "Stale",
    generation: 1,
  });
});
