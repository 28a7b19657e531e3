import { describe, expect, test } from "bun:test";
import type { NVMePartition, RebuildSlot, ReplicaStatus } from "../../api/index.ts";
import type { RaidBdev } from "../../lib/spdk/schemas.ts";
import { PARTITION_FINALIZER } from "../partitions/decide.ts";
import { externalIdFor, nqnFor } from "../partitions/identity.ts";
import { nexusControllerNameFor, nexusMemberBdevFor } from "./identity.ts";
import {
  applyRebuildStep,
  applySlotStep,
  decideRebuilds,
  type RebuildObserved,
  type RebuildSession,
  rebuildCandidates,
} from "./rebuild.ts";

const VUID = "11111111-2222-4333-8444-555555555555";
const MiB = 1024 * 1024;

function entry(name: string, over: Partial<ReplicaStatus> = {}): ReplicaStatus {
  return { name, uid: `uid-${name}`, nodeName: `n-${name}`, state: "Online", generation: 2, ...over };
}

function volume(replicas: ReplicaStatus[], gen = 2): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: "vol", namespace: "distort", uid: VUID, finalizers: [PARTITION_FINALIZER] },
    spec: {
      sizeBytes: 64 * MiB,
      nodeName: "node-a",
      backend: "spdk",
      volumeManager: "partition",
      replicas: 2,
    },
    status: { state: "Exported", dataGeneration: gen, replicas, conditions: [] },
  } as NVMePartition;
}

function copy(name: string, state = "Exported"): NVMePartition {
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
      state,
      nqn: nqnFor(externalIdFor(uid)),
      portalIP: "10.0.0.2",
      portalPort: 4420,
      transport: "tcp",
      conditions: [],
    },
  } as NVMePartition;
}

const bdevOf = (name: string) => nexusMemberBdevFor(nexusControllerNameFor(`uid-${name}`));

function raid(
  members: { name: string; configured?: boolean }[],
  process?: { target: string; blocks: number },
): RaidBdev {
  return {
    name: "nexus_x",
    uuid: "00000000-0000-4000-8000-000000000001",
    strip_size_kb: 0,
    state: "online",
    raid_level: "raid1",
    superblock: true,
    num_base_bdevs: 2,
    num_base_bdevs_discovered: members.length,
    num_base_bdevs_operational: members.length,
    ...(process
      ? {
          process: {
            type: "rebuild",
            target: process.target,
            progress: { blocks: process.blocks, percent: Math.floor((process.blocks * 100) / 1000) },
          },
        }
      : {}),
    base_bdevs_list: members.map((m, i) => ({
      name: m.name,
      uuid: `00000000-0000-4000-8000-00000000001${i}`,
      is_configured: m.configured ?? true,
      data_offset: 2048,
      data_size: 1000,
    })),
  } as RaidBdev;
}

function session(name: string): RebuildSession {
  const controller = nexusControllerNameFor(`uid-${name}`);
  return { copyName: name, copyUid: `uid-${name}`, controller, bdev: nexusMemberBdevFor(controller) };
}

function observed(over: Partial<RebuildObserved> & { volume: NVMePartition }): RebuildObserved {
  return {
    raid: raid([{ name: bdevOf("vol-r0") }]),
    raidBytes: 1000 * 512,
    blockSize: 512,
    sessions: new Map(),
    runningElsewhere: 0,
    nodeCap: 2,
    controllersUp: new Set([nexusControllerNameFor("uid-vol-r0"), nexusControllerNameFor("uid-vol-r1")]),
    copies: new Map([["vol-r1", copy("vol-r1")]]),
    ...over,
  };
}

const stale = () => volume([entry("vol-r0"), entry("vol-r1", { state: "Faulted", generation: 1 })]);

describe("rebuildCandidates", () => {
  test("behind copies that are Stale, Faulted or Rebuilding; not current, Pending or UID-less ones", () => {
    const v = volume([
      entry("vol-r0"),
      entry("vol-r1", { state: "Stale", generation: 1 }),
      entry("vol-r2", { state: "Pending", generation: 0 }),
      entry("vol-r3", { state: "Rebuilding", generation: 1 }),
      { name: "vol-r4", state: "Stale", generation: 0 },
    ]);
    expect(rebuildCandidates(v).map((e) => e.name)).toEqual(["vol-r1", "vol-r3"]);
  });
});

describe("decideRebuilds", () => {
  test("a behind copy that is exported starts a rebuild", () => {
    const steps = decideRebuilds(observed({ volume: stale() }));
    expect(steps).toHaveLength(1);
    expect(steps[0]).toMatchObject({ kind: "start", endpoint: { name: "vol-r1", uid: "uid-vol-r1" } });
  });

  test("a copy that is not Exported waits, saying why", () => {
    const steps = decideRebuilds(
      observed({ volume: stale(), copies: new Map([["vol-r1", copy("vol-r1", "Provisioning")]]) }),
    );
    expect(steps).toEqual([
      {
        kind: "wait",
        copyName: "vol-r1",
        copyUid: "uid-vol-r1",
        why: expect.stringContaining("not Exported"),
      },
    ]);
  });

  test("the node's cap holds copies back with a message naming the slots", () => {
    const steps = decideRebuilds(observed({ volume: stale(), runningElsewhere: 2 }));
    expect(steps).toEqual([
      {
        kind: "wait",
        copyName: "vol-r1",
        copyUid: "uid-vol-r1",
        why: "waits for a rebuild slot on serving node node-a: 2 of 2 running",
      },
    ]);
    expect(decideRebuilds(observed({ volume: stale(), runningElsewhere: 1 }))[0]?.kind).toBe("start");
  });

  test("one rebuild per raid: a second behind copy waits while the first runs", () => {
    const v = volume([
      entry("vol-r0"),
      entry("vol-r1", { state: "Rebuilding", generation: 1 }),
      entry("vol-r2", { state: "Stale", generation: 1 }),
    ]);
    const steps = decideRebuilds(
      observed({
        volume: v,
        raid: raid([{ name: bdevOf("vol-r0") }, { name: bdevOf("vol-r1") }], {
          target: bdevOf("vol-r1"),
          blocks: 250,
        }),
        sessions: new Map([["uid-vol-r1", session("vol-r1")]]),
        copies: new Map([
          ["vol-r1", copy("vol-r1")],
          ["vol-r2", copy("vol-r2")],
        ]),
        nodeCap: 3,
      }),
    );
    expect(steps.map((s) => s.kind)).toEqual(["progress", "wait"]);
    expect(steps[0]).toMatchObject({
      progress: { percent: 25, bytesDone: 250 * 512, bytesTotal: 1000 * 512 },
    });
    expect(steps[1]).toMatchObject({ why: expect.stringContaining("another rebuild") });
  });

  test("a watched rebuild whose process is gone with the member configured completes", () => {
    const v = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })]);
    const steps = decideRebuilds(
      observed({
        volume: v,
        raid: raid([{ name: bdevOf("vol-r0") }, { name: bdevOf("vol-r1") }]),
        sessions: new Map([["uid-vol-r1", session("vol-r1")]]),
      }),
    );
    expect(steps).toEqual([{ kind: "complete", session: session("vol-r1") }]);
  });

  test("a member that left the raid, or lost its controller, aborts; so does one found in the raid unwatched", () => {
    const v = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })]);
    const left = decideRebuilds(
      observed({ volume: v, sessions: new Map([["uid-vol-r1", session("vol-r1")]]) }),
    );
    expect(left[0]).toMatchObject({
      kind: "abort",
      copyName: "vol-r1",
      why: expect.stringContaining("left raid"),
    });
    const lost = decideRebuilds(
      observed({
        volume: v,
        raid: raid([{ name: bdevOf("vol-r0") }, { name: bdevOf("vol-r1") }], {
          target: bdevOf("vol-r1"),
          blocks: 9,
        }),
        sessions: new Map([["uid-vol-r1", session("vol-r1")]]),
        controllersUp: new Set([nexusControllerNameFor("uid-vol-r0")]),
      }),
    );
    expect(lost[0]).toMatchObject({ kind: "abort", why: expect.stringContaining("lost its controller") });
    const unwatched = decideRebuilds(
      observed({ volume: v, raid: raid([{ name: bdevOf("vol-r0") }, { name: bdevOf("vol-r1") }]) }),
    );
    expect(unwatched[0]).toMatchObject({ kind: "abort", why: expect.stringContaining("without a rebuild") });
  });

  test("a Rebuilding entry with no member and no session (its start was cut off) starts again", () => {
    const v = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })]);
    expect(decideRebuilds(observed({ volume: v }))[0]?.kind).toBe("start");
  });
});

describe("applyRebuildStep", () => {
  const replicas = () => [
    entry("vol-r0", { generation: 3 }),
    entry("vol-r1", { state: "Faulted", generation: 1 }),
  ];

  test("start, progress, complete: the copy ends Online at the generation of the write", () => {
    const v = stale();
    const [start] = decideRebuilds(observed({ volume: v }));
    const r1 = applyRebuildStep(replicas(), 3, start as never);
    expect(r1?.[1]).toMatchObject({ state: "Rebuilding", generation: 1 });
    const progress = { percent: 50, bytesDone: 10, bytesTotal: 20 };
    const r2 = applyRebuildStep(r1 as ReplicaStatus[], 3, {
      kind: "progress",
      session: session("vol-r1"),
      progress,
    });
    expect(r2?.[1]?.rebuild).toEqual(progress);
    const r3 = applyRebuildStep(r2 as ReplicaStatus[], 3, { kind: "complete", session: session("vol-r1") });
    expect(r3?.[1]).toEqual({
      name: "vol-r1",
      uid: "uid-vol-r1",
      nodeName: "n-vol-r1",
      state: "Online",
      generation: 3,
    });
    expect(r3?.[0]).toEqual(replicas()[0] as ReplicaStatus);
  });

  test("a completion is never recorded over an entry that is not Rebuilding", () => {
    expect(applyRebuildStep(replicas(), 3, { kind: "complete", session: session("vol-r1") })).toBeUndefined();
    expect(applyRebuildStep(replicas(), 3, { kind: "complete", session: session("vol-r0") })).toBeUndefined();
  });

  test("an abort leaves the copy Stale at its old generation, progress gone", () => {
    const rebuilding = [
      entry("vol-r0", { generation: 3 }),
      entry("vol-r1", {
        state: "Rebuilding",
        generation: 1,
        rebuild: { percent: 40, bytesDone: 4, bytesTotal: 10 },
      }),
    ];
    const out = applyRebuildStep(rebuilding, 3, {
      kind: "abort",
      copyName: "vol-r1",
      copyUid: "uid-vol-r1",
      controller: "c",
      why: "left",
    });
    expect(out?.[1]).toEqual({
      name: "vol-r1",
      uid: "uid-vol-r1",
      nodeName: "n-vol-r1",
      state: "Stale",
      generation: 1,
      message: "left",
    });
  });

  test("a wait keeps a Faulted copy Faulted and only says why", () => {
    const out = applyRebuildStep(replicas(), 3, {
      kind: "wait",
      copyName: "vol-r1",
      copyUid: "uid-vol-r1",
      why: "w",
    });
    expect(out?.[1]).toMatchObject({ state: "Faulted", generation: 1, message: "w" });
  });
});

describe("decideRebuilds under cluster grants", () => {
  const GRANT = { node: "node-a", requestedElsewhere: 0, nowIso: "2026-02-01T10:00:00.000Z" };
  const slot = (over: Partial<RebuildSlot> = {}): RebuildSlot => ({
    replica: "vol-r1",
    uid: "uid-vol-r1",
    node: "node-a",
    requestedAt: "2026-02-01T09:00:00.000Z",
    ...over,
  });
  const withSlot = (s?: RebuildSlot) => {
    const v = stale();
    if (s && v.status) v.status.rebuildSlot = s;
    return v;
  };
  const cases: { name: string; volume: NVMePartition; over?: Partial<RebuildObserved>; want: unknown[] }[] = [
    {
      name: "no slot yet: asks for one, and says it waits for the grant",
      volume: withSlot(),
      want: [
        {
          kind: "request",
          copyName: "vol-r1",
          copyUid: "uid-vol-r1",
          slot: { replica: "vol-r1", uid: "uid-vol-r1", node: "node-a", requestedAt: GRANT.nowIso },
          why: "RebuildQueued: waits for the manager's cluster-wide rebuild grant",
        },
      ],
    },
    {
      name: "asked, queued: waits with the manager's reason",
      volume: withSlot(slot({ message: "cluster rebuild cap 1 reached" })),
      want: [
        {
          kind: "wait",
          copyName: "vol-r1",
          copyUid: "uid-vol-r1",
          why: "RebuildQueued: cluster rebuild cap 1 reached",
        },
      ],
    },
    {
      name: "granted to this copy and node: starts",
      volume: withSlot(slot({ grantedAt: "2026-02-01T09:00:01.000Z" })),
      want: [
        expect.objectContaining({ kind: "start", endpoint: expect.objectContaining({ name: "vol-r1" }) }),
      ],
    },
    {
      name: "a slot held for the node that served before: waits for the manager to release it",
      volume: withSlot(slot({ node: "node-b", grantedAt: "2026-02-01T09:00:01.000Z" })),
      want: [
        expect.objectContaining({
          kind: "wait",
          why: "RebuildQueued: the volume's rebuild slot is still held for node-b; the manager releases it",
        }),
      ],
    },
    {
      name: "the node's cap counts this node's requests on other volumes: no request past it",
      volume: withSlot(),
      over: { runningElsewhere: 1, grant: { ...GRANT, requestedElsewhere: 1 } },
      want: [
        expect.objectContaining({
          kind: "wait",
          why: "waits for a rebuild slot on serving node node-a: 1 of 2 running, 1 more asked for",
        }),
      ],
    },
    {
      name: "node cap 0: nothing is asked for",
      volume: withSlot(),
      over: { nodeCap: 0 },
      want: [expect.objectContaining({ kind: "wait", why: expect.stringContaining("0 of 0 running") })],
    },
  ];
  for (const c of cases)
    test(c.name, () => {
      expect(decideRebuilds(observed({ volume: c.volume, grant: GRANT, ...c.over }))).toEqual(
        c.want as never,
      );
    });

  test("a copy whose export went away gives back the slot it holds; without one it only waits", () => {
    const gone = new Map([["vol-r1", copy("vol-r1", "Provisioning")]]);
    const held = withSlot(slot({ grantedAt: "2026-02-01T09:00:01.000Z" }));
    expect(decideRebuilds(observed({ volume: held, grant: GRANT, copies: gone }))).toEqual([
      expect.objectContaining({ kind: "wait", copyName: "vol-r1", release: true }),
    ]);
    const [plain] = decideRebuilds(observed({ volume: withSlot(), grant: GRANT, copies: gone }));
    expect(plain?.kind).toBe("wait");
    expect(plain && "release" in plain).toBe(false);
  });

  test("one slot per volume: the second behind copy waits while the first asks", () => {
    const v = volume([
      entry("vol-r0"),
      entry("vol-r1", { state: "Stale", generation: 1 }),
      entry("vol-r2", { state: "Stale", generation: 1 }),
    ]);
    const steps = decideRebuilds(
      observed({
        volume: v,
        grant: GRANT,
        copies: new Map([
          ["vol-r1", copy("vol-r1")],
          ["vol-r2", copy("vol-r2")],
        ]),
      }),
    );
    expect(steps.map((s) => [s.kind, "copyName" in s ? s.copyName : ""])).toEqual([
      ["request", "vol-r1"],
      ["wait", "vol-r2"],
    ]);
  });

  test("a running rebuild whose slot the manager released is aborted, never completed", () => {
    const v = volume([entry("vol-r0"), entry("vol-r1", { state: "Rebuilding", generation: 1 })]);
    const s = session("vol-r1");
    const members = [{ name: bdevOf("vol-r0") }, { name: s.bdev }];
    const steps = decideRebuilds(
      observed({ volume: v, grant: GRANT, sessions: new Map([[s.copyUid, s]]), raid: raid(members) }),
    );
    expect(steps).toEqual([expect.objectContaining({ kind: "abort", why: expect.stringContaining("slot") })]);
    // Still granted: the finished rebuild completes.
    if (v.status) v.status.rebuildSlot = slot({ grantedAt: "2026-02-01T09:00:01.000Z" });
    const done = decideRebuilds(
      observed({ volume: v, grant: GRANT, sessions: new Map([[s.copyUid, s]]), raid: raid(members) }),
    );
    expect(done).toEqual([{ kind: "complete", session: s }]);
  });
});

describe("applySlotStep", () => {
  const held: RebuildSlot = {
    replica: "vol-r1",
    uid: "uid-vol-r1",
    node: "node-a",
    requestedAt: "2026-02-01T09:00:00.000Z",
    grantedAt: "2026-02-01T09:00:01.000Z",
  };
  const wait = { kind: "wait" as const, copyName: "vol-r1", copyUid: "uid-vol-r1", why: "w" };
  const abort = {
    kind: "abort" as const,
    copyName: "vol-r1",
    copyUid: "uid-vol-r1",
    controller: "c",
    why: "a",
  };
  test("a request sets the slot only where none is held", () => {
    const request = {
      kind: "request" as const,
      copyName: "vol-r1",
      copyUid: "uid-vol-r1",
      slot: held,
      why: "q",
    };
    expect(applySlotStep(undefined, "node-a", request)).toEqual({ slot: held });
    expect(applySlotStep({ ...held, node: "node-b" }, "node-a", request)).toBeUndefined();
  });
  test("finishing, failing or a granted copy that cannot start gives the slot back; waiting keeps it", () => {
    expect(applySlotStep(held, "node-a", { kind: "complete", session: session("vol-r1") })).toEqual({
      slot: undefined,
    });
    expect(applySlotStep(held, "node-a", abort)).toEqual({ slot: undefined });
    expect(applySlotStep(held, "node-a", { ...wait, release: true })).toEqual({ slot: undefined });
    expect(applySlotStep(held, "node-a", wait)).toBeUndefined();
  });
  test("never another node's or another copy's slot", () => {
    expect(applySlotStep({ ...held, node: "node-b" }, "node-a", abort)).toBeUndefined();
    expect(applySlotStep({ ...held, uid: "uid-vol-r2" }, "node-a", abort)).toBeUndefined();
    expect(applySlotStep(undefined, "node-a", abort)).toBeUndefined();
  });
});
