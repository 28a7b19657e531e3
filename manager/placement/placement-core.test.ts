// decidePlacement, table-driven on plain objects: which device wins, and the reason named when
// none can take the partition. The view is the real Inventory fed with the fixtures.
import { describe, expect, test } from "bun:test";
import type { NVMeDevice, NVMeDeviceClaim, NVMePartition, RDMAStorageNode } from "../../api/index.ts";
import { formatConditionTime } from "../../lib/kube/conditions.ts";
import { Inventory } from "../inventory.ts";
import {
  claim,
  claimedDevice,
  cond,
  device,
  GiB,
  MiB,
  partition,
  refOf,
  storageNode,
  T0,
} from "../testdata/fixtures.ts";
import {
  backoffMs,
  decidePlacement,
  type PlacementConfig,
  type UnschedulableReason,
} from "./placement-core.ts";

const CFG: PlacementConfig = {
  stalenessMs: 60_000,
  policy: "most-free-device",
  backoff: { initialMs: 1000, maxMs: 60_000 },
};
const NOW = T0 + 10_000;

function view(o: {
  devices?: NVMeDevice[];
  claims?: NVMeDeviceClaim[];
  nodes?: RDMAStorageNode[];
  partitions?: NVMePartition[];
}): Inventory {
  const inv = new Inventory();
  for (const d of o.devices ?? []) inv.setDevice(d);
  for (const c of o.claims ?? []) inv.setClaim(c);
  for (const n of o.nodes ?? []) inv.setNode(n);
  for (const p of o.partitions ?? []) inv.setPartition(p);
  return inv;
}

/** Two claimed devices on two healthy nodes: d1 (node-a, 100 GiB), d2 (node-b, 50 GiB). */
function twoDevices(
  o1: Parameters<typeof claimedDevice>[1] = {},
  o2: Parameters<typeof claimedDevice>[1] = {},
) {
  const a = claimedDevice("d1", { node: "node-a", allocatable: 100 * GiB, ...o1 });
  const b = claimedDevice("d2", { node: "node-b", allocatable: 50 * GiB, ...o2 });
  return {
    devices: [a.device, b.device],
    claims: [a.claim, b.claim],
    nodes: [storageNode("node-a"), storageNode("node-b")],
  };
}

const pending = (o: Parameters<typeof partition>[2] = {}) => partition("apps", "vol", o);

describe("decidePlacement picks", () => {
  const cases: {
    name: string;
    setup: () => Parameters<typeof view>[0];
    p?: NVMePartition;
    cfg?: Partial<PlacementConfig>;
    want: string;
  }[] = [
    { name: "the device with most free bytes", setup: () => twoDevices(), want: "d1" },
    {
      name: "a schedulable device over a cordoned one with more free bytes",
      setup: () => {
        const s = twoDevices();
        s.devices[0] = { ...s.devices[0]!, spec: { ...s.devices[0]!.spec, unschedulable: true } };
        return s;
      },
      want: "d2",
    },
    {
      name: "most free after counting placed partitions",
      setup: () => ({
        ...twoDevices(),
        partitions: [partition("apps", "big", { node: "node-a", serial: "SER-d1", size: 80 * GiB })],
      }),
      want: "d2",
    },
    {
      name: "most free after counting ledger entries of unplaced partitions",
      setup: () =>
        twoDevices({ reservations: [{ uid: "other", namespace: "apps", name: "other", bytes: 80 * GiB }] }),
      want: "d2",
    },
    {
      name: "counting terminating partitions",
      setup: () => ({
        ...twoDevices(),
        partitions: [
          partition("apps", "old", { node: "node-a", serial: "SER-d1", size: 80 * GiB, deleting: true }),
        ],
      }),
      want: "d2",
    },
    {
      name: "the device already holding this partition's ledger entry, even with less free",
      setup: () =>
        twoDevices(
          {},
          { reservations: [{ uid: "uid-part-vol", namespace: "apps", name: "vol", bytes: GiB }] },
        ),
      want: "d2",
    },
    {
      name: "a device whose active backend matches",
      setup: () => twoDevices({ activeBackend: "kernel" }, { activeBackend: "spdk" }),
      want: "d2",
    },
    {
      name: "a requisite topology over more free bytes",
      setup: () => {
        const s = twoDevices();
        s.nodes = [
          storageNode("node-a", { labels: { zone: "a" } }),
          storageNode("node-b", { labels: { zone: "b" } }),
        ];
        return s;
      },
      p: pending({ topology: { requisite: [{ segments: { zone: "b" } }] } }),
      want: "d2",
    },
    {
      name: "a preferred topology over more free bytes",
      setup: () => {
        const s = twoDevices();
        s.nodes = [
          storageNode("node-a", { labels: { zone: "a" } }),
          storageNode("node-b", { labels: { zone: "b" } }),
        ];
        return s;
      },
      p: pending({ topology: { preferred: [{ segments: { zone: "b" } }, { segments: { zone: "a" } }] } }),
      want: "d2",
    },
    {
      name: "least-loaded node first under that policy",
      setup: () => ({
        ...twoDevices(),
        partitions: [partition("apps", "small", { node: "node-a", serial: "SER-d1", size: GiB })],
      }),
      cfg: { policy: "least-loaded-node" },
      want: "d2",
    },
    {
      name: "most free among equally loaded nodes under least-loaded-node",
      setup: () => twoDevices(),
      cfg: { policy: "least-loaded-node" },
      want: "d1",
    },
    {
      name: "a device with exactly enough room after rounding",
      setup: () => {
        const a = claimedDevice("d1", { allocatable: 8 * MiB });
        return {
          devices: [a.device],
          claims: [a.claim],
          nodes: [storageNode("node-a")],
          partitions: [partition("apps", "one-byte", { node: "node-a", serial: "SER-d1", size: 1 })],
        };
      },
      p: pending({ size: 4 * MiB }),
      want: "d1",
    },
  ];
  test.each(cases)("$name", ({ setup, p, cfg, want }) => {
    const out = decidePlacement(p ?? pending(), view(setup()), NOW, { ...CFG, ...cfg });
    expect(out.result).toBe("placed");
    const reserve = out.actions[0];
    expect(reserve?.type).toBe("reserve");
    if (reserve?.type !== "reserve") return;
    expect(reserve.device).toBe(want);
    const assign = out.actions[1];
    expect(assign).toMatchObject({ type: "assign", nodeName: reserve.nodeName, serial: reserve.serial });
    expect(assign?.type === "assign" && assign.claimRef.uid).toBe(`uid-claim-claim-${want}`);
    expect(out.actions[2]).toMatchObject({ type: "event", eventType: "Normal", reason: "Placed" });
  });

  test("sizes are rounded up to 4 MiB in the reservation", () => {
    const out = decidePlacement(pending({ size: 4 * MiB + 1 }), view(twoDevices()), NOW, CFG);
    expect(out.actions[0]).toMatchObject({ type: "reserve", bytes: 8 * MiB, reuse: false });
  });
});

describe("decidePlacement refuses", () => {
  const node = (o: Parameters<typeof storageNode>[1]) => [storageNode("node-a", o)];
  const one = (o: Parameters<typeof claimedDevice>[1] = {}) =>
    claimedDevice("d1", { allocatable: 10 * GiB, ...o });
  const cases: {
    name: string;
    setup: () => Parameters<typeof view>[0];
    p?: NVMePartition;
    reason: UnschedulableReason;
    message: RegExp;
  }[] = [
    {
      name: "with no device at all",
      setup: () => ({}),
      reason: "NoClaimedDevice",
      message: /no NVMeDevice exists/,
    },
    {
      name: "an unclaimed device",
      setup: () => ({ devices: [device("d1", { phase: "Available" })], nodes: node({}) }),
      reason: "NoClaimedDevice",
      message: /1 not owned by a live bound claim/,
    },
    {
      name: "a device whose claim is gone",
      setup: () => ({ devices: [one().device], nodes: node({}) }),
      reason: "NoClaimedDevice",
      message: /not owned/,
    },
    {
      name: "a device whose claim was replaced (other UID)",
      setup: () => {
        const { device: d, claim: c } = one();
        return {
          devices: [d],
          claims: [{ ...c, metadata: { ...c.metadata, uid: "new-uid" } }],
          nodes: node({}),
        };
      },
      reason: "NoClaimedDevice",
      message: /not owned/,
    },
    {
      name: "a device whose claim is being deleted",
      setup: () => {
        const { device: d, claim: c } = one();
        return {
          devices: [d],
          claims: [{ ...c, metadata: { ...c.metadata, deletionTimestamp: "2026-02-01T10:00:00Z" } }],
          nodes: node({}),
        };
      },
      reason: "NoClaimedDevice",
      message: /not owned/,
    },
    {
      name: "a device whose claim is not Bound yet",
      setup: () => {
        const { device: d, claim: c } = one();
        return { devices: [d], claims: [{ ...c, status: undefined }], nodes: node({}) };
      },
      reason: "NoClaimedDevice",
      message: /not owned/,
    },
    {
      name: "an Unavailable device",
      setup: () => {
        const { device: d, claim: c } = one({ phase: "Unavailable" });
        return { devices: [d], claims: [c], nodes: node({}) };
      },
      reason: "NoClaimedDevice",
      message: /not owned/,
    },
    {
      name: "a stale node",
      setup: () => ({ ...pair(one()), nodes: node({ heartbeat: T0 - 120_000 }) }),
      reason: "NodeStale",
      message: /1 on stale nodes \(node-a: HeartbeatStale\)/,
    },
    {
      name: "a node that never sent a heartbeat",
      setup: () => ({ ...pair(one()), nodes: node({ heartbeat: undefined }) }),
      reason: "NodeStale",
      message: /node-a: NoHeartbeat/,
    },
    {
      name: "a missing node record",
      setup: () => pair(one()),
      reason: "NodeNotReady",
      message: /node-a: NodeMissing/,
    },
    {
      name: "a node that is not Ready",
      setup: () => ({ ...pair(one()), nodes: node({ ready: false }) }),
      reason: "NodeNotReady",
      message: /node-a: NodeNotReady/,
    },
    {
      name: "a node without an RDMA endpoint",
      setup: () => ({ ...pair(one()), nodes: node({ rdmaIP: null }) }),
      reason: "NodeNotReady",
      message: /node-a: NoEndpoint/,
    },
    {
      name: "a node with incomplete inventory",
      setup: () => ({ ...pair(one()), nodes: node({ inventory: false }) }),
      reason: "NodeNotReady",
      message: /node-a: InventoryNotReady/,
    },
    {
      name: "a cordoned node",
      setup: () => {
        const [n] = node({});
        return { ...pair(one()), nodes: [{ ...n!, spec: { ...n!.spec, unschedulable: true } }] };
      },
      reason: "Cordoned",
      message: /1 cordoned or draining \(node node-a cordoned\)/,
    },
    {
      name: "a draining node",
      setup: () => {
        const [n] = node({});
        return { ...pair(one()), nodes: [{ ...n!, spec: { ...n!.spec, drain: true } }] };
      },
      reason: "Cordoned",
      message: /node node-a draining/,
    },
    {
      name: "a draining drive",
      setup: () => {
        const s = pair(one());
        const [d] = s.devices;
        return { ...s, devices: [{ ...d!, spec: { ...d!.spec, drain: true } }], nodes: node({}) };
      },
      reason: "Cordoned",
      message: /device d1 draining/,
    },
    {
      name: "a device locked to the other backend",
      setup: () => ({ ...pair(one({ activeBackend: "kernel" })), nodes: node({}) }),
      reason: "BackendLocked",
      message: /1 locked to backend kernel/,
    },
    {
      name: "a node outside the requisite topology",
      setup: () => ({ ...pair(one()), nodes: node({ labels: { zone: "a" } }) }),
      p: pending({ topology: { requisite: [{ segments: { zone: "b" } }] } }),
      reason: "TopologyMismatch",
      message: /1 outside the requested topology/,
    },
    {
      name: "a device without room",
      setup: () => ({ ...pair(one()), nodes: node({}) }),
      p: pending({ size: 11 * GiB }),
      reason: "InsufficientCapacity",
      message: /0\/1 devices can hold 11 GiB \(spdk\): 1 without room \(most free 10 GiB\)/,
    },
    {
      name: "a device without room once rounding is counted",
      setup: () => ({
        ...pair(one({ allocatable: 8 * MiB })),
        nodes: node({}),
        partitions: [partition("apps", "one-byte", { node: "node-a", serial: "SER-d1", size: 1 })],
      }),
      p: pending({ size: 4 * MiB + 1 }),
      reason: "InsufficientCapacity",
      message: /most free 4 MiB/,
    },
    {
      name: "a device full of terminating partitions",
      setup: () => ({
        ...pair(one()),
        nodes: node({}),
        partitions: [
          partition("apps", "old", { node: "node-a", serial: "SER-d1", size: 10 * GiB, deleting: true }),
        ],
      }),
      reason: "InsufficientCapacity",
      message: /most free 0 B/,
    },
  ];
  test.each(cases)("$name: $reason", ({ name, setup, p, reason, message }) => {
    const out = decidePlacement(p ?? pending(), view(setup()), NOW, CFG);
    expect(out.result).toBe("unschedulable");
    // The device names a claim the view does not show as its bound owner: possibly caches that
    // have not caught up with each other, which the controller may wait out.
    const settling = /claim is gone|claim was replaced|not Bound yet/.test(name) ? 1 : undefined;
    expect(out.settling).toBe(settling);
    const c = out.status?.conditions?.[0];
    expect(c).toMatchObject({ type: "Scheduled", status: "False", reason, observedGeneration: 1 });
    expect(c?.message).toMatch(message);
    expect(out.actions).toEqual([
      { type: "event", eventType: "Warning", reason: "FailedPlacement", note: c?.message ?? "" },
    ]);
    expect(out.requeueAfterMs).toBe(CFG.backoff.initialMs);
    expect(out.status?.set).toEqual({ state: "Pending" });
  });

  test("counts as settling only the devices whose claim view lags, beside a real refusal", () => {
    const bound = claimedDevice("d1", { node: "node-a", allocatable: GiB });
    const lagging = claimedDevice("d2", { node: "node-a", allocatable: 100 * GiB });
    const inv = view({
      devices: [bound.device, lagging.device, device("d3", { phase: "Available" })],
      claims: [bound.claim, { ...lagging.claim, status: undefined }],
      nodes: [storageNode("node-a")],
    });
    const out = decidePlacement(pending({ size: 2 * GiB }), inv, NOW, CFG);
    expect(out.status?.conditions?.[0]?.reason).toBe("InsufficientCapacity");
    expect(out.settling).toBe(1);
  });

  test("names the reason that got furthest: capacity beats a stale node", () => {
    const a = claimedDevice("d1", { node: "node-a", allocatable: GiB });
    const b = claimedDevice("d2", { node: "node-b", allocatable: 100 * GiB });
    const inv = view({
      devices: [a.device, b.device, device("d3", { phase: "Available" })],
      claims: [a.claim, b.claim],
      nodes: [storageNode("node-a"), storageNode("node-b", { heartbeat: T0 - 600_000 })],
    });
    const out = decidePlacement(pending({ size: 2 * GiB }), inv, NOW, CFG);
    const c = out.status?.conditions?.[0];
    expect(c?.reason).toBe("InsufficientCapacity");
    expect(c?.message).toBe(
      "0/3 devices can hold 2 GiB (spdk): 1 without room (most free 1 GiB); 1 on stale nodes (node-b: HeartbeatStale); 1 not owned by a live bound claim",
    );
  });
});

function pair(x: { device: NVMeDevice; claim: NVMeDeviceClaim }) {
  return { devices: [x.device], claims: [x.claim] };
}

describe("decidePlacement on placed or deleting partitions", () => {
  const ref = refOf(claim("admin", "c"));
  test("a placed partition without Scheduled gets Scheduled=True and state Placed", () => {
    const p = partition("apps", "vol", { node: "node-a", serial: "S1", claimRef: ref, generation: 2 });
    const out = decidePlacement(p, view({}), NOW, CFG);
    expect(out.result).toBe("already-placed");
    expect(out.actions).toEqual([]);
    expect(out.status?.set).toEqual({ state: "Placed" });
    expect(out.status?.conditions?.[0]).toMatchObject({
      type: "Scheduled",
      status: "True",
      reason: "Placed",
      observedGeneration: 2,
    });
  });

  test("a placed partition the agent already moved on keeps its state", () => {
    const p = partition("apps", "vol", { node: "node-a", serial: "S1", state: "Exported" });
    expect(decidePlacement(p, view({}), NOW, CFG).status?.set).toEqual({});
  });

  test("nothing to write when Scheduled=True is current", () => {
    const p = partition("apps", "vol", {
      node: "node-a",
      serial: "S1",
      state: "Placed",
      conditions: [{ ...cond("Scheduled", "True", "Placed"), observedGeneration: 1 }],
    });
    const out = decidePlacement(p, view({}), NOW, CFG);
    expect(out).toEqual({ actions: [], result: "already-placed" });
  });

  test("an unplaced partition being deleted is left alone", () => {
    const out = decidePlacement(pending({ deleting: true }), view(twoDevices()), NOW, CFG);
    expect(out).toEqual({ actions: [], result: "ignored" });
  });
});

describe("backoffMs", () => {
  const at = (ms: number) => formatConditionTime(new Date(ms));
  test.each([
    ["first failure", undefined, 1000],
    ["just failed", at(NOW), 1000],
    ["failing for 5 s", at(NOW - 5000), 5000],
    ["failing for an hour", at(NOW - 3_600_000), 60_000],
    ["unparseable time", "garbage", 1000],
  ])("%s", (_name, since, want) => {
    expect(backoffMs(since, NOW, CFG)).toBe(want);
  });

  test("an unschedulable partition is requeued after the time it has been unschedulable", () => {
    const p = pending({ conditions: [cond("Scheduled", "False", "NoClaimedDevice", NOW - 8000)] });
    expect(decidePlacement(p, view({}), NOW, CFG).requeueAfterMs).toBe(8000);
  });
});

describe("decidePlacement with a content source (clone or restore)", () => {
  const reasonOf = (out: ReturnType<typeof decidePlacement>) =>
    out.status?.conditions?.find((c) => c.type === "Scheduled")?.reason;

  test("goes to the source's drive even when another has more room", () => {
    const out = decidePlacement(pending(), view(twoDevices()), NOW, CFG, { serial: "SER-d2", why: "clone" });
    expect(out.result).toBe("placed");
    expect(out.actions[0]).toMatchObject({
      type: "reserve",
      device: "d2",
      serial: "SER-d2",
      nodeName: "node-b",
    });
  });

  test("source drive without room: Scheduled=False InsufficientCapacity, no other drive tried", () => {
    const out = decidePlacement(pending({ size: 60 * GiB }), view(twoDevices()), NOW, CFG, {
      serial: "SER-d2",
      why: "clone of partition src must share its drive",
    });
    expect(out.result).toBe("unschedulable");
    expect(reasonOf(out)).toBe("InsufficientCapacity");
    expect(out.actions).toHaveLength(1);
  });

  test("source unresolved or its drive unknown: SourceUnavailable", () => {
    const gone = decidePlacement(pending(), view(twoDevices()), NOW, CFG, {
      why: "source snapshot s not found",
    });
    expect(reasonOf(gone)).toBe("SourceUnavailable");
    expect(gone.status?.conditions?.[0]?.message).toContain("source snapshot s not found");
    const nowhere = decidePlacement(pending(), view(twoDevices()), NOW, CFG, {
      serial: "SER-zz",
      why: "clone",
    });
    expect(reasonOf(nowhere)).toBe("SourceUnavailable");
  });
});

describe("thin partitions and the overcommit ratio", () => {
  /** One 10 GiB drive whose claim has `ratio`, holding `held` (placed) partitions. */
  function oneDrive(
    ratio: number | undefined,
    held: NVMePartition[],
    lvstore?: { total: number; free: number },
  ) {
    const a = claimedDevice("d1", { node: "node-a", allocatable: 10 * GiB });
    if (ratio !== undefined) a.claim.spec.overcommitRatio = ratio;
    if (lvstore && a.device.status)
      a.device.status.lvstore = {
        totalBytes: lvstore.total,
        freeBytes: lvstore.free,
        observedTime: "2026-02-01T10:00:00Z",
      };
    return view({ devices: [a.device], claims: [a.claim], nodes: [storageNode("node-a")], partitions: held });
  }
  const placed = (name: string, size: number, thin: boolean) => {
    const p = partition("apps", name, { node: "node-a", serial: "SER-d1", size });
    if (thin) p.spec.thinProvisioning = true;
    return p;
  };
  const want = (size: number, thin: boolean) => {
    const p = pending({ size });
    if (thin) p.spec.thinProvisioning = true;
    return p;
  };
  const decide = (v: Inventory, p: NVMePartition) => decidePlacement(p, v, NOW, CFG);
  const reasonOf = (out: ReturnType<typeof decide>) => out.status?.conditions?.[0];

  test("ratio 1 (no setting): a thin volume gets no more than a thick one", () => {
    const v = oneDrive(undefined, [placed("a", 8 * GiB, true)]);
    expect(decide(v, want(2 * GiB, true)).result).toBe("placed");
    const out = decide(v, want(3 * GiB, true));
    expect(out.result).toBe("unschedulable");
    expect(reasonOf(out)).toMatchObject({ reason: "InsufficientCapacity" });
  });

  test("ratio 2: thin volumes up to twice the drive, each counted at its full size", () => {
    const v = oneDrive(2, [placed("a", 8 * GiB, true), placed("b", 8 * GiB, true)]);
    expect(decide(v, want(4 * GiB, true)).result).toBe("placed");
    const out = decide(v, want(5 * GiB, true));
    expect(reasonOf(out)).toMatchObject({ status: "False", reason: "InsufficientCapacity" });
    expect(reasonOf(out)?.message).toContain("thin");
    expect(reasonOf(out)?.message).toContain("within the overcommit ratio (most free 4 GiB)");
  });

  test("ratio 2: a thick volume still needs physical room next to the thick ones", () => {
    // 6 GiB thick + 4 GiB thin: 4 GiB physically left for thick, 10 GiB of budget.
    const v = oneDrive(2, [placed("a", 6 * GiB, false), placed("b", 4 * GiB, true)]);
    expect(decide(v, want(4 * GiB, false)).result).toBe("placed");
    expect(reasonOf(decide(v, want(5 * GiB, false)))).toMatchObject({ reason: "InsufficientCapacity" });
    expect(decide(v, want(10 * GiB, true)).result).toBe("placed");
    expect(decide(v, want(11 * GiB, true)).result).toBe("unschedulable");
  });

  test("an lvstore above 85 % refuses new thin volumes (LvstoreFull), never thick ones", () => {
    const total = 10 * GiB;
    const full = oneDrive(4, [], { total, free: total / 10 }); // 90 % full
    const out = decide(full, want(GiB, true));
    expect(reasonOf(out)).toMatchObject({ status: "False", reason: "LvstoreFull" });
    expect(reasonOf(out)?.message).toContain("above 85% full, too full for new thin volumes (fullest 90%)");
    expect(decide(full, want(GiB, false)).result).toBe("placed");
    expect(decide(oneDrive(4, [], { total, free: total / 5 }), want(GiB, true)).result).toBe("placed");
    // The limit is configuration.
    const lax = decidePlacement(want(GiB, true), full, NOW, { ...CFG, thinLvstoreFullPercent: 95 });
    expect(lax.result).toBe("placed");
  });
});

describe("replicas", () => {
  const threeNodes = (labels: Record<string, Record<string, string>> = {}) => {
    const ds = ["a", "b", "c"].map((n, i) =>
      claimedDevice(`d${i + 1}`, { node: `node-${n}`, allocatable: (100 - 10 * i) * GiB }),
    );
    return view({
      devices: ds.map((d) => d.device),
      claims: ds.map((d) => d.claim),
      nodes: ["a", "b", "c"].map((n) => storageNode(`node-${n}`, { labels: labels[`node-${n}`] })),
    });
  };

  test("a replicated volume itself is never placed", () => {
    const v = pending();
    v.spec.replicas = 2;
    expect(decidePlacement(v, threeNodes(), NOW, CFG).result).toBe("ignored");
  });

  test("a replica avoids the nodes of its siblings and takes the best of the rest", () => {
    const out = decidePlacement(pending(), threeNodes(), NOW, CFG, undefined, {
      avoidNodes: new Map([["node-a", "vol-r0"]]),
      avoidValues: new Map(),
    });
    expect(out.result).toBe("placed");
    expect(out.actions[0]).toMatchObject({ type: "reserve", device: "d2", nodeName: "node-b" });
  });

  test("with every node holding a sibling: ReplicaAntiAffinity, naming them", () => {
    const out = decidePlacement(pending(), threeNodes(), NOW, CFG, undefined, {
      avoidNodes: new Map([
        ["node-a", "vol-r0"],
        ["node-b", "vol-r1"],
        ["node-c", "vol-r2"],
      ]),
      avoidValues: new Map(),
    });
    expect(out.result).toBe("unschedulable");
    const c = out.status?.conditions?.[0];
    expect(c?.reason).toBe("ReplicaAntiAffinity");
    expect(c?.message).toContain(
      "3 on nodes that already hold another replica of this volume (node-a, node-b, node-c)",
    );
  });

  test("a spread key leaves out nodes sharing a sibling's value and nodes without the label", () => {
    const inv = threeNodes({ "node-a": { zone: "z1" }, "node-b": { zone: "z1" } });
    const spread = {
      avoidNodes: new Map([["node-a", "vol-r0"]]),
      key: "zone",
      avoidValues: new Map([["z1", "vol-r0"]]),
    };
    const out = decidePlacement(pending(), inv, NOW, CFG, undefined, spread);
    expect(out.result).toBe("unschedulable");
    expect(out.status?.conditions?.[0]?.message).toContain("share a zone value with another replica");
    expect(out.status?.conditions?.[0]?.message).toContain("without the label zone");
    const inv2 = threeNodes({ "node-a": { zone: "z1" }, "node-b": { zone: "z1" }, "node-c": { zone: "z2" } });
    expect(decidePlacement(pending(), inv2, NOW, CFG, undefined, spread).actions[0]).toMatchObject({
      nodeName: "node-c",
    });
  });
});
