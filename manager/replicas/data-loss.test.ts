// decideDataLoss on plain objects: a stuck volume's accept-data-loss annotation picks a usable
// stale copy (by name, or the newest), fences every copy on a live node to it first, and only then
// raises the generation with that copy alone current; a value naming no usable copy is refused.
import { describe, expect, test } from "bun:test";
import type { NVMePartition, NVMeVolumeAttachment, ReplicaStatus } from "../../api/index.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { Inventory } from "../inventory.ts";
import { partition, storageNode, T0 } from "../testdata/fixtures.ts";
import { decideDataLoss } from "./data-loss.ts";
import { decideFailover } from "./failover.ts";

const NS = "distort-system";
const CFG = { stalenessMs: 20_000 };
const NOW = T0 + 3_600_000;
const entry = (
  i: number,
  node: string,
  generation: number,
  state: ReplicaStatus["state"],
): ReplicaStatus => ({
  name: `vol-r${i}`,
  uid: `uid-r${i}`,
  nodeName: node,
  deviceSerial: `S-${node}`,
  state,
  generation,
  ...(state === "Stale" ? { message: "left out" } : {}),
});

/** Served from a (lost) at generation 7: r0 on a is the only current copy. */
const COPIES = [entry(0, "a", 7, "Online"), entry(1, "b", 5, "Stale"), entry(2, "c", 6, "Faulted")];

function volume(replicas: ReplicaStatus[] = COPIES): NVMePartition {
  const v = partition(NS, "vol", { uid: "uid-vol" });
  v.spec.replicas = 3;
  v.spec.nodeName = "a";
  v.status = { state: "Exported", dataGeneration: 7, replicas, conditions: [] };
  return v;
}
function copies(edit: (m: Map<string, NVMePartition>) => void = () => {}): Map<string, NVMePartition> {
  const m = new Map(
    COPIES.map((e) => [e.name, partition(NS, e.name, { uid: e.uid, node: e.nodeName, state: "Exported" })]),
  );
  edit(m);
  return m;
}
/** Node -> seconds since its last heartbeat at NOW. */
function view(ages: Record<string, number> = { a: 600, b: 0, c: 0 }) {
  const inv = new Inventory();
  for (const [n, age] of Object.entries(ages)) inv.setNode(storageNode(n, { heartbeat: NOW - age * 1000 }));
  return inv;
}
function fencedTo(node: string, names: string[], enforced = true): Map<string, NVMeVolumeAttachment> {
  return new Map(
    COPIES.filter((e) => names.includes(e.name)).map((e) => {
      const name = attachmentNameFor(e.name, e.uid as string);
      const host = nexusHostNqnFor(node);
      return [
        name,
        {
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "NVMeVolumeAttachment",
          metadata: { name, namespace: NS },
          spec: {
            partitionName: e.name,
            partitionUID: e.uid as string,
            nodeId: `${node}/${host}`,
            hostNQN: host,
            attachmentId: `id-${node}`,
          },
          status: { ...(enforced ? { observedAttachmentId: `id-${node}` } : {}), conditions: [] },
        },
      ];
    }),
  );
}

describe("decideDataLoss", () => {
  test("the volume is stuck to begin with, and its message offers the choice", () => {
    const step = decideFailover(volume(), new Map(), view(), NOW, CFG);
    expect(step.kind).toBe("stuck");
    expect(step.kind === "stuck" && step.message).toContain("storage.distort.io/accept-data-loss=newest");
    expect(step.kind === "stuck" && step.message).toContain("vol-r2 on c at generation 6");
  });

  test("newest: fence every copy on a live node to the newest one's node first", () => {
    const step = decideDataLoss(volume(), "newest", copies(), new Map(), view(), NOW, CFG);
    expect(step).toEqual({
      kind: "fence",
      from: "a",
      to: "c",
      moves: [
        { attachment: attachmentNameFor("vol-r1", "uid-r1"), copy: "vol-r1", uid: "uid-r1" },
        { attachment: attachmentNameFor("vol-r2", "uid-r2"), copy: "vol-r2", uid: "uid-r2" },
      ],
    });
  });

  test("then waits until each copy's agent enforces it", () => {
    const step = decideDataLoss(
      volume(),
      "newest",
      copies(),
      fencedTo("c", ["vol-r1", "vol-r2"], false),
      view(),
      NOW,
      CFG,
    );
    expect(step).toEqual({ kind: "wait-fenced", from: "a", to: "c", waiting: ["vol-r1", "vol-r2"] });
  });

  test("then raises the generation with the chosen copy alone current; the lost node's copy goes Stale", () => {
    const step = decideDataLoss(
      volume(),
      "newest",
      copies(),
      fencedTo("c", ["vol-r1", "vol-r2"]),
      view(),
      NOW,
      CFG,
    );
    if (step.kind !== "accept") throw new Error(step.kind);
    expect(step).toMatchObject({
      copy: "vol-r2",
      copyGeneration: 6,
      dataGeneration: 8,
      lost: { from: 7, to: 7 },
    });
    expect(step.replicas.map((r) => [r.name, r.state, r.generation])).toEqual([
      ["vol-r0", "Stale", 7],
      ["vol-r1", "Stale", 5],
      ["vol-r2", "Online", 8],
    ]);
    expect(step.replicas[2]?.message).toBeUndefined();
    // With that status, the failover itself goes on to serve from c (no stale copy is current).
    const after = volume(step.replicas);
    after.status!.dataGeneration = 8;
    expect(decideFailover(after, fencedTo("c", ["vol-r1", "vol-r2"]), view(), NOW, CFG)).toEqual({
      kind: "serve",
      from: "a",
      to: "c",
    });
  });

  test("a named copy is promoted even when it is not the newest; the generations lost are named", () => {
    const step = decideDataLoss(
      volume(),
      " vol-r1 ",
      copies(),
      fencedTo("b", ["vol-r1", "vol-r2"]),
      view(),
      NOW,
      CFG,
    );
    if (step.kind !== "accept") throw new Error(step.kind);
    expect(step).toMatchObject({ copy: "vol-r1", to: "b", dataGeneration: 8, lost: { from: 6, to: 7 } });
  });

  const refused: [string, string, Map<string, NVMePartition>, Inventory, RegExp][] = [
    [
      "a name that is no copy",
      "vol-r9",
      copies(),
      view(),
      /names no copy of this volume; use "newest" or one of: vol-r0, vol-r1, vol-r2/,
    ],
    ["an empty value", "", copies(), view(), /names no copy/],
    [
      "the copy on the lost node",
      "vol-r0",
      copies(),
      view(),
      /vol-r0: that copy cannot be served: its node a is not live/,
    ],
    [
      "a copy whose node is down too",
      "vol-r1",
      copies(),
      view({ a: 600, b: 600, c: 0 }),
      /its node b is not live/,
    ],
    [
      "a copy whose partition is gone",
      "vol-r2",
      copies((m) => m.delete("vol-r2")),
      view(),
      /vol-r2: that copy cannot be served: its partition is gone/,
    ],
    [
      "a copy whose partition was recreated (another UID)",
      "vol-r2",
      copies((m) => m.set("vol-r2", partition(NS, "vol-r2", { uid: "other", node: "c", state: "Exported" }))),
      view(),
      /its partition is gone/,
    ],
    [
      "a copy not exported",
      "vol-r2",
      copies((m) => m.set("vol-r2", partition(NS, "vol-r2", { uid: "uid-r2", node: "c", state: "Failed" }))),
      view(),
      /its partition is Failed, not Exported/,
    ],
    [
      "newest, with every other node down",
      "newest",
      copies(),
      view({ a: 600, b: 600, c: 600 }),
      /no copy can be served/,
    ],
  ];
  test.each(refused)("refused: %s", (_n, value, cs, v, message) => {
    const step = decideDataLoss(volume(), value, cs, new Map(), v, NOW, CFG);
    expect(step.kind).toBe("invalid");
    expect(step.kind === "invalid" && step.message).toMatch(message);
  });

  test.each([
    ["Rebuilding (a mix of old and new blocks)", "Rebuilding" as const, 6, /Rebuilding/],
    ["generation 0 (never held data)", "Stale" as const, 0, /never held data/],
  ])("a copy that is %s is never served, by name or as the newest", (_n, state, generation, message) => {
    const replicas = [COPIES[0] as ReplicaStatus, entry(1, "b", generation, state)];
    const v = volume(replicas);
    const named = decideDataLoss(v, "vol-r1", copies(), new Map(), view(), NOW, CFG);
    expect(named.kind === "invalid" && named.message).toMatch(message);
    expect(decideDataLoss(v, "newest", copies(), new Map(), view(), NOW, CFG).kind).toBe("invalid");
  });
});
