// Table tests of the snapshot reconciler's decisions.
import { describe, expect, test } from "bun:test";
import { exampleNVMePartition, exampleNVMeSnapshot } from "../../api/examples.ts";
import type { NVMePartition, NVMeSnapshot } from "../../api/index.ts";
import { externalIdFor, snapshotExternalIdFor } from "../partitions/identity.ts";
import { decideSnapshot, SNAPSHOT_FINALIZER, type SnapshotDecision } from "./decide.ts";

/** A fresh snapshot of the example partition: finalizer held, nothing taken yet. */
function snap(mut: (s: NVMeSnapshot) => void = () => {}): NVMeSnapshot {
  const s = exampleNVMeSnapshot();
  s.metadata.finalizers = [SNAPSHOT_FINALIZER];
  delete s.status;
  mut(s);
  return s;
}
function src(mut: (p: NVMePartition) => void = () => {}): NVMePartition {
  const p = exampleNVMePartition();
  mut(p);
  return p;
}
const DELETING = "2026-01-01T00:00:00Z";

const cases: [
  string,
  NVMeSnapshot,
  NVMePartition | undefined,
  string,
  SnapshotDecision["action"],
  string?,
][] = [
  ["no uid yet", snap((s) => delete s.metadata.uid), src(), "node-a", "ignore"],
  ["source on another node", snap(), src(), "node-b", "ignore"],
  ["source unknown, nothing recorded", snap(), undefined, "node-a", "ignore"],
  ["no finalizer yet", snap((s) => (s.metadata.finalizers = [])), src(), "node-a", "add-finalizer"],
  [
    "source not exported",
    snap(),
    src((p) => (p.status!.state = "Provisioning")),
    "node-a",
    "wait",
    "SourceNotExported",
  ],
  [
    "kernel source",
    snap(),
    src((p) => {
      p.spec.backend = "kernel";
      p.spec.volumeManager = "partition";
      delete p.spec.targetOptions;
    }),
    "node-a",
    "refuse",
    "UnsupportedBackend",
  ],
  [
    "source replaced (other uid)",
    snap((s) => (s.status = { nodeName: "node-a", deviceSerial: "S4EWNX0R123456", conditions: [] })),
    src((p) => (p.metadata.uid = "11111111-2222-4333-8444-555555555555")),
    "node-a",
    "refuse",
    "SourceNotFound",
  ],
  ["exported source", snap(), src(), "node-a", "take"],
  ["already ready", snap((s) => (s.status = exampleNVMeSnapshot().status)), src(), "node-a", "ignore"],
  [
    "deleting without finalizer",
    snap((s) => {
      s.metadata.finalizers = [];
      s.metadata.deletionTimestamp = DELETING;
    }),
    src(),
    "node-a",
    "done",
  ],
  [
    "deleting, recorded here, source gone",
    snap((s) => {
      s.metadata.deletionTimestamp = DELETING;
      s.status = exampleNVMeSnapshot().status;
    }),
    undefined,
    "node-a",
    "delete",
  ],
  [
    "deleting, recorded on another node",
    snap((s) => {
      s.metadata.deletionTimestamp = DELETING;
      s.status = exampleNVMeSnapshot().status;
    }),
    undefined,
    "node-b",
    "ignore",
  ],
];

describe("decideSnapshot", () => {
  // Rows without a reason: bun passes a done callback in that slot, so read the row by index.
  test.each(cases.map((c, i) => [c[0], i] as const))("%s", (_name, i) => {
    const [, s, source, node, action, reason] = cases[i] as (typeof cases)[number];
    const d = decideSnapshot(s, source, node);
    expect(d.action).toBe(action);
    if (reason) expect("why" in d && typeof d.why === "object" ? d.why.reason : undefined).toBe(reason);
  });

  test("take names the snapshot from its own uid and snapshots the source's lvol on its drive", () => {
    const s = snap();
    const d = decideSnapshot(s, src(), "node-a");
    expect(d).toEqual({
      action: "take",
      place: {
        nodeName: "node-a",
        deviceSerial: "S4EWNX0R123456",
        externalId: snapshotExternalIdFor(s.metadata.uid as string),
      },
      sourceLvol: externalIdFor(src().metadata.uid as string),
    });
  });

  test("delete uses the recorded place, not the (possibly recreated) source, and the lvol named from the UID", () => {
    const s = snap((x) => {
      x.metadata.deletionTimestamp = DELETING;
      x.status = exampleNVMeSnapshot().status;
      // A status naming another volume's lvol must not redirect the deletion to it.
      if (x.status) x.status.externalId = "vol-0123456789abcdef0123";
    });
    const d = decideSnapshot(s, undefined, "node-a");
    expect(d).toEqual({
      action: "delete",
      place: {
        nodeName: "node-a",
        deviceSerial: "S4EWNX0R123456",
        externalId: snapshotExternalIdFor(s.metadata.uid as string),
      },
    });
  });
});
