// decideFailover on plain objects: nothing while the serving node beats; then fence every live
// current copy, wait for their agents, raise the generation over the unfenced, and only then serve.
import { describe, expect, test } from "bun:test";
import type { NVMePartition, NVMeVolumeAttachment, ReplicaStatus } from "../../api/index.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { Inventory } from "../inventory.ts";
import { partition, storageNode, T0 } from "../testdata/fixtures.ts";
import { decideFailover, servingNodeLost } from "./failover.ts";

const NS = "distort-system";
const CFG = { stalenessMs: 20_000 };
const entry = (
  i: number,
  node: string,
  generation = 5,
  state: ReplicaStatus["state"] = "Online",
): ReplicaStatus => ({
  name: `vol-r${i}`,
  uid: `uid-r${i}`,
  nodeName: node,
  deviceSerial: `S-${node}`,
  state,
  generation,
});

function volume(replicas: ReplicaStatus[], serving = "a", failoverAfterSeconds?: number): NVMePartition {
  const v = partition(NS, "vol", { uid: "uid-vol" });
  v.spec.replicas = 3;
  v.spec.nodeName = serving;
  if (failoverAfterSeconds) v.spec.failoverAfterSeconds = failoverAfterSeconds;
  v.status = { state: "Exported", dataGeneration: 5, replicas, conditions: [] };
  return v;
}

/** Node -> seconds since its last heartbeat at NOW. */
function view(ages: Record<string, number>) {
  const inv = new Inventory();
  for (const [n, age] of Object.entries(ages)) inv.setNode(storageNode(n, { heartbeat: NOW - age * 1000 }));
  return inv;
}
const NOW = T0 + 3_600_000;

function admission(e: ReplicaStatus, node: string, enforced: boolean): [string, NVMeVolumeAttachment] {
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
}

const three = [entry(0, "a"), entry(1, "b"), entry(2, "c")];

describe("decideFailover", () => {
  test("nothing while the serving node's heartbeat is within the volume's bound", () => {
    const v = volume(three, "a", 30);
    expect(servingNodeLost(v, view({ a: 29, b: 0, c: 0 }), NOW)).toBe(false);
    expect(decideFailover(v, new Map(), view({ a: 29, b: 0, c: 0 }), NOW, CFG)).toEqual({ kind: "none" });
    expect(servingNodeLost(v, view({ a: 31, b: 0, c: 0 }), NOW)).toBe(true);
  });

  test("lost: fence every current copy on a live node for the new serving node, not the lost node's", () => {
    const attachments = new Map(three.map((e) => admission(e, "a", true)));
    const step = decideFailover(volume(three), attachments, view({ a: 60, b: 0, c: 0 }), NOW, CFG);
    expect(step).toEqual({
      kind: "fence",
      from: "a",
      to: "b",
      moves: [
        { attachment: attachmentNameFor("vol-r1", "uid-r1"), copy: "vol-r1", uid: "uid-r1" },
        { attachment: attachmentNameFor("vol-r2", "uid-r2"), copy: "vol-r2", uid: "uid-r2" },
      ],
    });
  });

  test("moved but not yet enforced by the copies' agents: wait, and keep the chosen node", () => {
    const attachments = new Map([
      admission(three[0]!, "a", true),
      admission(three[1]!, "c", true),
      admission(three[2]!, "c", false),
    ]);
    const step = decideFailover(volume(three), attachments, view({ a: 60, b: 0, c: 0 }), NOW, CFG);
    // r1 already names c (an earlier pass chose c): c stays the choice, r1 is enforced, r2 is not.
    expect(step).toEqual({ kind: "wait-fenced", from: "a", to: "c", waiting: ["vol-r2"] });
  });

  test("every live current copy fenced: the generation rises over them; the lost node's copy is Stale", () => {
    const attachments = new Map([
      admission(three[0]!, "a", true),
      admission(three[1]!, "b", true),
      admission(three[2]!, "b", true),
    ]);
    const step = decideFailover(volume(three), attachments, view({ a: 60, b: 0, c: 0 }), NOW, CFG);
    expect(step.kind).toBe("promote");
    if (step.kind !== "promote") return;
    expect(step.dataGeneration).toBe(6);
    expect(step.replicas.map((e) => [e.name, e.state, e.generation])).toEqual([
      ["vol-r0", "Stale", 5],
      ["vol-r1", "Online", 6],
      ["vol-r2", "Online", 6],
    ]);
    expect(step.replicas[0]?.message).toContain("lost serving node a");
  });

  test("a copy on another dead node is left out too; after the raise only serving remains (never a second raise)", () => {
    const attachments = new Map([admission(three[1]!, "b", true)]);
    const step = decideFailover(volume(three), attachments, view({ a: 60, b: 0, c: 60 }), NOW, CFG);
    expect(step.kind).toBe("promote");
    if (step.kind !== "promote") return;
    expect(step.replicas.map((e) => e.state)).toEqual(["Stale", "Online", "Stale"]);
    expect(step.replicas[2]?.message).toContain("not reachable to fence");
    const after = volume(step.replicas);
    after.status!.dataGeneration = step.dataGeneration;
    const attachments6 = new Map([admission(step.replicas[1]!, "b", true)]);
    expect(decideFailover(after, attachments6, view({ a: 60, b: 0, c: 60 }), NOW, CFG)).toEqual({
      kind: "serve",
      from: "a",
      to: "b",
    });
  });

  test("a stale copy is never chosen, even when it is the only one alive", () => {
    const v = volume([entry(0, "a"), entry(1, "b", 4, "Stale"), entry(2, "c")]);
    const step = decideFailover(v, new Map(), view({ a: 60, b: 0, c: 60 }), NOW, CFG);
    expect(step.kind).toBe("stuck");
    if (step.kind === "stuck")
      expect(step.message).toContain("no current copy is on a live node (current: vol-r0 on a, vol-r2 on c)");
  });
});
