import { describe, expect, test } from "bun:test";
import type { NVMePartition, ReplicaStatus } from "../../api/index.ts";
import { nexusBdevFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { PARTITION_FINALIZER } from "../partitions/decide.ts";
import { externalIdFor, nqnFor, serialNumberFor } from "../partitions/identity.ts";
import { currentCopies, decideNexus, isReplicatedVolume, type NexusObserved } from "./decide.ts";
import {
  controllerOfMemberBdev,
  nexusControllerNameFor,
  nexusMemberBdevFor,
  nexusRaidUuidFor,
  replicaNamespaceUuidFor,
} from "./identity.ts";

const NODE = "node-a";
const VUID = "11111111-2222-4333-8444-555555555555";

function entry(name: string, over: Partial<ReplicaStatus> = {}): ReplicaStatus {
  return { name, uid: `uid-${name}`, nodeName: `n-${name}`, state: "Online", generation: 1, ...over };
}

function volume(over: { replicas?: ReplicaStatus[]; gen?: number | null; deleting?: boolean } = {}) {
  const v: NVMePartition = {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: {
      name: "vol",
      namespace: "distort",
      uid: VUID,
      finalizers: [PARTITION_FINALIZER],
      ...(over.deleting ? { deletionTimestamp: "2026-12-02T00:00:00Z" } : {}),
    },
    spec: {
      sizeBytes: 64 * 1024 * 1024,
      nodeName: NODE,
      backend: "spdk",
      volumeManager: "partition",
      replicas: 2,
      targetOptions: { transport: "tcp" },
    },
    status: {
      state: "Placed",
      ...(over.gen === null ? {} : { dataGeneration: over.gen ?? 1 }),
      replicas: over.replicas ?? [entry("vol-r0"), entry("vol-r1")],
      conditions: [],
    },
  } as NVMePartition;
  return v;
}

function copy(
  name: string,
  over: { status?: Partial<NonNullable<NVMePartition["status"]>>; of?: string } = {},
) {
  const uid = `uid-${name}`;
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name, namespace: "distort", uid },
    spec: {
      sizeBytes: 64 * 1024 * 1024,
      nodeName: `n-${name}`,
      deviceSerial: `S-${name}`,
      backend: "spdk",
      volumeManager: "partition",
      replicaOf: { name: "vol", uid: over.of ?? VUID },
    },
    status: {
      state: "Exported",
      nqn: nqnFor(externalIdFor(uid)),
      portalIP: name.endsWith("0") ? "10.0.0.1" : "fd00::2",
      portalPort: 4420,
      transport: "tcp",
      conditions: [],
      ...over.status,
    },
  } as NVMePartition;
}

function observed(v: NVMePartition, copies: NVMePartition[] = [], over: Partial<NexusObserved> = {}) {
  return {
    volume: v,
    nodeName: NODE,
    spdk: true,
    attachments: [],
    copies: new Map(copies.map((c) => [c.metadata.name, c])),
    ...over,
  } satisfies NexusObserved;
}

describe("currentCopies", () => {
  test("only Online or Degraded copies at exactly the data generation count", () => {
    const v = volume({
      gen: 3,
      replicas: [
        entry("a", { generation: 3 }),
        entry("b", { generation: 3, state: "Degraded" }),
        entry("c", { generation: 2 }), // behind: stale whatever its state says
        entry("d", { generation: 3, state: "Stale" }),
        entry("e", { generation: 3, state: "Rebuilding" }),
        entry("f", { generation: 3, state: "Faulted" }),
        entry("g", { generation: 3, state: "Pending" }),
        entry("h", { generation: 4 }), // ahead of the volume: not the manager's current either
        { name: "i", state: "Online", generation: 3 }, // no UID yet
      ],
    });
    expect(currentCopies(v).map((r) => r.name)).toEqual(["a", "b"]);
  });

  test("none before the manager declared a generation", () => {
    expect(currentCopies(volume({ gen: null }))).toEqual([]);
  });
});

describe("decideNexus", () => {
  test("replicated volumes are those with spec.replicas above 1", () => {
    expect(isReplicatedVolume(volume())).toBe(true);
    expect(isReplicatedVolume(copy("vol-r0"))).toBe(false);
  });

  test("another node's volume, or one without a serving node, is ignored", () => {
    const v = volume();
    expect(decideNexus(observed(v, [], { nodeName: "node-b" })).action).toBe("ignore");
    const unplaced = structuredClone(v);
    delete unplaced.spec.nodeName;
    expect(decideNexus(observed(unplaced)).action).toBe("ignore");
  });

  test("an agent without SPDK refuses before taking the finalizer", () => {
    const v = volume();
    v.metadata.finalizers = [];
    const d = decideNexus(observed(v, [], { spdk: false }));
    expect(d).toMatchObject({ action: "refuse", why: { reason: "ReplicasNeedSpdk" } });
    if (d.action === "refuse") expect(d.why.message).toContain("no spdk backend");
  });

  test("the finalizer comes first", () => {
    const v = volume();
    v.metadata.finalizers = [];
    expect(decideNexus(observed(v)).action).toBe("add-finalizer");
  });

  test("nothing is served before a data generation, or with no current copy", () => {
    expect(decideNexus(observed(volume({ gen: null })))).toMatchObject({
      action: "wait",
      why: { reason: "ReplicasPending" },
    });
    const none = volume({
      replicas: [entry("vol-r0", { state: "Stale" }), entry("vol-r1", { generation: 0 })],
    });
    expect(decideNexus(observed(none, [copy("vol-r0"), copy("vol-r1")]))).toMatchObject({
      action: "wait",
      why: { reason: "NoCurrentReplica" },
    });
  });

  test("one current copy is not enough for a raid1 (degraded start not built)", () => {
    const v = volume({ replicas: [entry("vol-r0"), entry("vol-r1", { state: "Faulted" })] });
    const d = decideNexus(observed(v, [copy("vol-r0"), copy("vol-r1")]));
    expect(d).toMatchObject({ action: "wait", why: { reason: "TooFewCurrentReplicas" } });
  });

  test("every current copy must be Exported at a portal under its derived NQN; the wait names which", () => {
    const cases: [string, NVMePartition | null, string][] = [
      ["missing", null, "vol-r1 not found"],
      [
        "provisioning",
        copy("vol-r1", { status: { state: "Provisioning" } }),
        "vol-r1 is Provisioning, not Exported",
      ],
      [
        "foreign nqn",
        copy("vol-r1", { status: { nqn: "nqn.2026-02.io.distort:volume-vol-x" } }),
        "reports NQN",
      ],
      ["no portal", copy("vol-r1", { status: { portalIP: undefined } }), "reports no portal"],
      ["other volume", copy("vol-r1", { of: "someone-else" }), "does not name this volume"],
    ];
    for (const [what, c, message] of cases) {
      const copies = new Map<string, NVMePartition | null>([
        ["vol-r0", copy("vol-r0")],
        ["vol-r1", c],
      ]);
      const d = decideNexus({ ...observed(volume()), copies });
      expect(d.action, what).toBe("wait");
      if (d.action === "wait") {
        expect(d.why.reason, what).toBe("ReplicasNotReady");
        expect(d.why.message, what).toContain(message);
        expect(d.why.message, what).not.toContain("vol-r0");
      }
    }
    // A copy whose partition was recreated under the same name is another incarnation.
    const recreated = copy("vol-r1");
    recreated.metadata.uid = "uid-new";
    const d = decideNexus(observed(volume(), [copy("vol-r0"), recreated]));
    expect(d).toMatchObject({ action: "wait", why: { reason: "ReplicasNotReady" } });
  });

  test("assembles from the current copies only, with identities derived from UIDs", () => {
    const v = volume({
      gen: 2,
      replicas: [
        entry("vol-r0", { generation: 2 }),
        entry("vol-r1", { generation: 1, state: "Stale" }),
        entry("vol-r2", { generation: 2, state: "Degraded" }),
      ],
    });
    v.spec.replicas = 3;
    const d = decideNexus(observed(v, [copy("vol-r0"), copy("vol-r1"), copy("vol-r2")]));
    expect(d.action).toBe("assemble");
    if (d.action !== "assemble") return;
    const ext = externalIdFor(VUID);
    expect(d.plan).toMatchObject({
      externalId: ext,
      nqn: nqnFor(ext),
      raidBdev: nexusBdevFor(ext),
      raidUuid: nexusRaidUuidFor(VUID),
      hostNqn: nexusHostNqnFor(NODE),
      transport: "tcp",
      sizeBytes: 64 * 1024 * 1024,
    });
    // The stale copy is not a member, though its partition is Exported.
    expect(d.plan.members.map((m) => m.name)).toEqual(["vol-r0", "vol-r2"]);
    expect(d.plan.members[0]).toEqual({
      name: "vol-r0",
      uid: "uid-vol-r0",
      controller: nexusControllerNameFor("uid-vol-r0"),
      trtype: "TCP",
      adrfam: "IPv4",
      traddr: "10.0.0.1",
      trsvcid: "4420",
      subnqn: nqnFor(externalIdFor("uid-vol-r0")),
      serialNumber: serialNumberFor(externalIdFor("uid-vol-r0")),
    });
    expect(d.plan.members[1]?.adrfam).toBe("IPv6");
  });

  test("deletion waits for the volume's attachments, then tears down every controller it ever named", () => {
    const v = volume({ deleting: true, replicas: [entry("vol-r1"), entry("vol-r0"), entry("vol-r0")] });
    expect(decideNexus(observed(v, [], { attachments: ["vol-abc"] }))).toMatchObject({
      action: "block-deletion",
      why: { reason: "AttachmentsExist" },
    });
    const d = decideNexus(observed(v));
    expect(d.action).toBe("teardown");
    if (d.action !== "teardown") return;
    const ext = externalIdFor(VUID);
    expect(d.teardown).toEqual({
      nqn: nqnFor(ext),
      raidBdev: nexusBdevFor(ext),
      controllers: ["uid-vol-r0", "uid-vol-r1"].map(nexusControllerNameFor).sort(),
    });
    const released = structuredClone(v);
    released.metadata.finalizers = [];
    expect(decideNexus(observed(released)).action).toBe("done");
    expect(decideNexus(observed(v, [], { spdk: false })).action).toBe("wait");
  });
});

describe("nexus identities", () => {
  test("stable, distinct, and in the forms SPDK takes", () => {
    const c = nexusControllerNameFor("uid-1");
    expect(c).toMatch(/^nxr_[0-9a-f]{16}$/);
    expect(nexusControllerNameFor("uid-1")).toBe(c);
    expect(nexusControllerNameFor("uid-2")).not.toBe(c);
    expect(controllerOfMemberBdev(nexusMemberBdevFor(c))).toBe(c);
    expect(controllerOfMemberBdev("nvme_0123n1")).toBeUndefined();
    const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    expect(replicaNamespaceUuidFor("uid-1")).toMatch(uuid);
    expect(nexusRaidUuidFor("uid-1")).toMatch(uuid);
    expect(replicaNamespaceUuidFor("uid-1")).not.toBe(nexusRaidUuidFor("uid-1"));
    expect(replicaNamespaceUuidFor("uid-1")).toBe(replicaNamespaceUuidFor("uid-1"));
    expect(() => nexusControllerNameFor("")).toThrow();
  });
});
