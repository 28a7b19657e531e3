// Table tests of the group snapshot decision: all members or none, one node only, fresh retakes.
import { expect, test } from "bun:test";
import { exampleNVMePartition, exampleNVMeSnapshot } from "../../api/examples.ts";
import { GROUP_SPANS_NODES_REASON, type NVMePartition, type NVMeSnapshot } from "../../api/index.ts";
import { externalIdFor } from "../../lib/volume-identity.ts";
import { SNAPSHOT_FINALIZER } from "./decide.ts";
import { decideGroup, type GroupDecision } from "./group.ts";

/** Member `i` of a two-member group, finalizer held, nothing taken; its source is partition `i`. */
function member(i: number, mut: (s: NVMeSnapshot) => void = () => {}): NVMeSnapshot {
  const s = exampleNVMeSnapshot();
  s.metadata.name = `gs-${i}`;
  s.metadata.uid = `00000000-0000-4000-8000-00000000000${i}`;
  s.metadata.finalizers = [SNAPSHOT_FINALIZER];
  s.spec = { sourcePartitionName: `p-${i}`, sourcePartitionUID: `p-uid-${i}` };
  delete s.status;
  mut(s);
  return s;
}
function source(i: number, mut: (p: NVMePartition) => void = () => {}): NVMePartition {
  const p = exampleNVMePartition();
  p.metadata.name = `p-${i}`;
  p.metadata.uid = `p-uid-${i}`;
  p.status = { ...p.status, state: "Exported", externalId: `vol-${i}` } as NVMePartition["status"];
  mut(p);
  return p;
}
const NAMES = ["gs-1", "gs-2"];

function decide(members: NVMeSnapshot[], sources: NVMePartition[], node = "node-a"): GroupDecision {
  const byName = new Map(members.map((m) => [m.metadata.name, m]));
  return decideGroup(
    NAMES,
    byName,
    (m) => sources.find((p) => p.metadata.name === m.spec.sourcePartitionName),
    node,
  );
}

const ready = (s: NVMeSnapshot) => {
  s.status = {
    readyToUse: true,
    nodeName: "node-a",
    deviceSerial: "S",
    externalId: `snap-${s.metadata.name}`,
    conditions: [],
  };
};

const cases: [string, () => GroupDecision, GroupDecision["action"], string?][] = [
  ["a member not created yet", () => decide([member(1)], [source(1), source(2)]), "wait", "MemberMissing"],
  [
    "a member without its finalizer",
    () => decide([member(1), member(2, (s) => (s.metadata.finalizers = []))], [source(1), source(2)]),
    "wait",
    "MemberPending",
  ],
  [
    "a source not exported yet",
    () => decide([member(1), member(2)], [source(1), source(2, (p) => (p.status!.state = "Provisioning"))]),
    "wait",
    "SourceNotExported",
  ],
  [
    "sources on two nodes",
    () => decide([member(1), member(2)], [source(1), source(2, (p) => (p.spec.nodeName = "node-b"))]),
    "refuse",
    GROUP_SPANS_NODES_REASON,
  ],
  [
    "a kernel-backend source",
    () => decide([member(1), member(2)], [source(1), source(2, (p) => (p.spec.backend = "kernel"))]),
    "refuse",
    "UnsupportedBackend",
  ],
  [
    "a member being deleted",
    () =>
      decide(
        [member(1), member(2, (s) => (s.metadata.deletionTimestamp = "2026-01-01T00:00:00Z"))],
        [source(1), source(2)],
      ),
    "ignore",
  ],
  [
    "the group belongs to another node",
    () => decide([member(1), member(2)], [source(1), source(2)], "node-b"),
    "ignore",
  ],
  [
    "every member ready",
    () => decide([member(1, ready), member(2, ready)], [source(1), source(2)]),
    "ignore",
  ],
];

for (const [name, run, action, reason] of cases)
  test(`group: ${name} -> ${action}`, () => {
    const d = run();
    expect(d.action).toBe(action);
    if (reason) expect(d.action === "wait" || d.action === "refuse" ? d.why.reason : undefined).toBe(reason);
  });

test("all members ready to take: both taken together, fresh (no member was ever ready)", () => {
  const d = decide([member(1), member(2)], [source(1), source(2)]);
  if (d.action !== "take") throw new Error(`expected take, got ${d.action}`);
  expect(d.fresh).toBe(true);
  expect(d.members.map((t) => [t.snapshot.metadata.name, t.sourceLvol])).toEqual([
    // Lvol identity derives from the source's UID alone (status.externalId is not trusted).
    ["gs-1", externalIdFor("p-uid-1")],
    ["gs-2", externalIdFor("p-uid-2")],
  ]);
});

test("one member already ready: an earlier burst completed, the rest are taken without a retake", () => {
  const d = decide([member(1, ready), member(2)], [source(1), source(2)]);
  if (d.action !== "take") throw new Error(`expected take, got ${d.action}`);
  expect(d.fresh).toBe(false);
  expect(d.members.map((t) => t.snapshot.metadata.name)).toEqual(["gs-2"]);
});
