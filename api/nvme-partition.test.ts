// NVMePartition schema: defaults, the backend/volume-manager pairing and every field constraint,
// each reported at the field it guards.
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { exampleNVMePartition } from "./examples.ts";
import { NVMePartitionSchema, NVMePartitionSpecSchema } from "./nvme-partition.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

describe("NVMePartition", () => {
  test("defaults: spdk backend, partition volume manager, rdma transport, empty conditions", () => {
    const spec = v.parse(NVMePartitionSpecSchema, { sizeBytes: 1, targetOptions: {} });
    expect(spec).toEqual({
      sizeBytes: 1,
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "rdma" },
    });
    const p = v.parse(
      NVMePartitionSchema,
      withPaths(exampleNVMePartition(), { "status.conditions": undefined }),
    );
    expect(p.status?.conditions).toEqual([]);
  });

  const accepts: { name: string; set: Record<string, unknown> }[] = [
    { name: "the example", set: {} },
    {
      name: "unplaced (as CSI creates it)",
      set: { spec: { sizeBytes: 4096 }, status: undefined },
    },
    { name: "spdk + spdk-lvol", set: { "spec.volumeManager": "spdk-lvol" } },
    {
      name: "kernel + parted, no core mask",
      set: {
        "spec.backend": "kernel",
        "spec.volumeManager": "parted",
        "spec.targetOptions.coreMask": undefined,
      },
    },
    { name: "kernel + partition", set: { "spec.backend": "kernel", "spec.targetOptions": undefined } },
    {
      name: "tcp with DH-CHAP",
      set: {
        "spec.targetOptions.transport": "tcp",
        "spec.targetOptions.dhchapSecretRef": { name: "s", key: "k" },
      },
    },
    { name: "IPv6 portal", set: { "status.portalIP": "fd00::10" } },
    { name: "Pending status only", set: { status: { state: "Pending" } } },
    {
      name: "topology requirements",
      set: {
        "spec.topology": {
          requisite: [{ segments: { "topology.kubernetes.io/zone": "a" } }],
          preferred: [{ segments: { "topology.kubernetes.io/zone": "a", rack: "r1" } }],
        },
      },
    },
    {
      name: "a replicated volume, unplaced, spread by zone, with its copies in status",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 3,
        "spec.replicaTopologyKey": "topology.kubernetes.io/zone",
        "status.dataGeneration": 2,
        "status.replicas": [
          { name: "v-r0", uid: "u0", nodeName: "a", deviceSerial: "S0", state: "Online", generation: 2 },
          { name: "v-r1", state: "Stale", generation: 1, message: "missed writes" },
        ],
      },
    },
    { name: "a replica of a volume", set: { "spec.replicaOf": { name: "v", uid: "u" } } },
    { name: "replicas 1 placed", set: { "spec.replicas": 1 } },
    {
      name: "a replicated volume served by a node, with no drive of its own",
      set: { "spec.deviceSerial": undefined, "spec.claimRef": undefined, "spec.replicas": 2 },
    },
  ];
  test.each(accepts)("accepts $name", ({ set }) => {
    expect(issuePaths(NVMePartitionSchema, withPaths(exampleNVMePartition(), set))).toEqual([]);
  });

  const rejects: RejectCase[] = [
    { name: "zero size", set: { "spec.sizeBytes": 0 }, at: "spec.sizeBytes" },
    { name: "negative size", set: { "spec.sizeBytes": -4096 }, at: "spec.sizeBytes" },
    { name: "fractional size", set: { "spec.sizeBytes": 1.5 }, at: "spec.sizeBytes" },
    { name: "missing size", set: { "spec.sizeBytes": undefined }, at: "spec.sizeBytes" },
    { name: "empty nodeName", set: { "spec.nodeName": "" }, at: "spec.nodeName" },
    {
      name: "nodeName without deviceSerial",
      set: { "spec.deviceSerial": undefined },
      at: "spec.deviceSerial",
    },
    { name: "deviceSerial without nodeName", set: { "spec.nodeName": undefined }, at: "spec.deviceSerial" },
    { name: "unknown backend", set: { "spec.backend": "zfs" }, at: "spec.backend" },
    { name: "unknown volume manager", set: { "spec.volumeManager": "lvm" }, at: "spec.volumeManager" },
    {
      name: "spdk-lvol on kernel",
      set: {
        "spec.backend": "kernel",
        "spec.volumeManager": "spdk-lvol",
        "spec.targetOptions.coreMask": undefined,
      },
      at: "spec.volumeManager",
    },
    { name: "parted on spdk", set: { "spec.volumeManager": "parted" }, at: "spec.volumeManager" },
    { name: "core mask on kernel", set: { "spec.backend": "kernel" }, at: "spec.targetOptions.coreMask" },
    {
      name: "core mask zero",
      set: { "spec.targetOptions.coreMask": "0x0" },
      at: "spec.targetOptions.coreMask",
    },
    {
      name: "core mask not hex",
      set: { "spec.targetOptions.coreMask": "3" },
      at: "spec.targetOptions.coreMask",
    },
    {
      name: "unknown transport",
      set: { "spec.targetOptions.transport": "fc" },
      at: "spec.targetOptions.transport",
    },
    { name: "port 0", set: { "spec.targetOptions.portalPort": 0 }, at: "spec.targetOptions.portalPort" },
    {
      name: "port 65536",
      set: { "spec.targetOptions.portalPort": 65536 },
      at: "spec.targetOptions.portalPort",
    },
    {
      name: "secret ref without key",
      set: { "spec.targetOptions.dhchapSecretRef": { name: "s" } },
      at: "spec.targetOptions.dhchapSecretRef.key",
    },
    {
      name: "claimRef without namespace",
      set: { "spec.claimRef.namespace": undefined },
      at: "spec.claimRef.namespace",
    },
    {
      name: "topology value over 63 characters",
      set: { "spec.topology": { requisite: [{ segments: { zone: "z".repeat(64) } }] } },
      at: "spec.topology.requisite.0.segments.zone",
    },
    {
      name: "topology without segments",
      set: { "spec.topology": { preferred: [{}] } },
      at: "spec.topology.preferred.0.segments",
    },
    {
      name: "replicas on the kernel backend",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.backend": "kernel",
        "spec.targetOptions": undefined,
        "spec.replicas": 2,
      },
      at: "spec.replicas",
    },
    { name: "a replicated volume placed on a drive", set: { "spec.replicas": 2 }, at: "spec.deviceSerial" },
    {
      name: "four replicas",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 4,
      },
      at: "spec.replicas",
    },
    {
      name: "zero replicas",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 0,
      },
      at: "spec.replicas",
    },
    {
      name: "a replica that is itself replicated",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 2,
        "spec.replicaOf": { name: "v", uid: "u" },
      },
      at: "spec.replicaOf",
    },
    {
      name: "spread without replicas",
      set: { "spec.replicaTopologyKey": "zone" },
      at: "spec.replicaTopologyKey",
    },
    {
      name: "spread key not a label key",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 2,
        "spec.replicaTopologyKey": "a b",
      },
      at: "spec.replicaTopologyKey",
    },
    {
      name: "a clone with replicas",
      set: {
        "spec.nodeName": undefined,
        "spec.deviceSerial": undefined,
        "spec.claimRef": undefined,
        "spec.replicas": 2,
        "spec.contentSource": { kind: "Partition", name: "s", uid: "u" },
      },
      at: "spec.contentSource",
    },
    {
      name: "unknown replica state",
      set: { "status.replicas": [{ name: "r", state: "Gone", generation: 1 }] },
      at: "status.replicas.0.state",
    },
    { name: "data generation 0", set: { "status.dataGeneration": 0 }, at: "status.dataGeneration" },
    { name: "unknown state", set: { "status.state": "Done" }, at: "status.state" },
    { name: "empty externalId", set: { "status.externalId": "" }, at: "status.externalId" },
    {
      name: "overlong volumeHandle",
      set: { "status.volumeHandle": "v".repeat(129) },
      at: "status.volumeHandle",
    },
    { name: "not an NQN", set: { "status.nqn": "volume-1" }, at: "status.nqn" },
    { name: "bad portal IP", set: { "status.portalIP": "10.0.0.300" }, at: "status.portalIP" },
    { name: "status port 0", set: { "status.portalPort": 0 }, at: "status.portalPort" },
    { name: "unknown status transport", set: { "status.transport": "fc" }, at: "status.transport" },
    { name: "negative allocatedBytes", set: { "status.allocatedBytes": -1 }, at: "status.allocatedBytes" },
  ];
  test.each(rejects)("rejects $name at $at", ({ set, at }) => {
    expect(issuePaths(NVMePartitionSchema, withPaths(exampleNVMePartition(), set))).toContain(at);
  });

  test("cross-field messages name the field", () => {
    const r = v.safeParse(
      NVMePartitionSchema,
      withPaths(exampleNVMePartition(), { "spec.volumeManager": "parted" }),
    );
    expect(r.issues?.map((i) => i.message)).toContain(
      "spec.volumeManager parted requires spec.backend kernel",
    );
  });
});
