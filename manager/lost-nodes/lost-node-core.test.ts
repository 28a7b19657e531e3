// decideLostNode on plain objects: a deleted partition held by the agent of a node that stopped
// beating is released only past the bound, never while a live attachment names it, and with the
// attachments being deleted released first; a node that beats again keeps its partition.
import { describe, expect, test } from "bun:test";
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { Inventory } from "../inventory.ts";
import { partition, storageNode, T0 } from "../testdata/fixtures.ts";
import { AGENT_ATTACHMENT_FINALIZER, AGENT_PARTITION_FINALIZER, decideLostNode } from "./lost-node-core.ts";

const NS = "distort-system";
const BOUND = 900_000;
const DELETED = "2026-02-01T10:00:00Z";

function deleting(edit: (p: NVMePartition) => void = () => {}): NVMePartition {
  const p = partition(NS, "p", { node: "node-a", serial: "SER-1" });
  p.metadata.deletionTimestamp = DELETED;
  p.metadata.finalizers = [AGENT_PARTITION_FINALIZER];
  edit(p);
  return p;
}
/** node-a's last heartbeat at `hb` (undefined: no RDMAStorageNode at all). */
function view(hb: number | undefined): Inventory {
  const inv = new Inventory();
  if (hb !== undefined) inv.setNode(storageNode("node-a", { heartbeat: hb }));
  return inv;
}
function attachment(name: string, o: { deleting?: boolean; uid?: string } = {}): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: {
      name,
      namespace: NS,
      finalizers: [AGENT_ATTACHMENT_FINALIZER],
      ...(o.deleting ? { deletionTimestamp: DELETED } : {}),
    },
    spec: {
      partitionName: "p",
      partitionUID: o.uid ?? "uid-part-p",
      nodeId: "consumer",
      hostNQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001",
      attachmentId: "a",
    },
    status: { conditions: [] },
  };
}

describe("decideLostNode", () => {
  const HB = T0;
  const table: [
    string,
    NVMePartition,
    Inventory,
    NVMeVolumeAttachment[],
    number,
    "none" | "wait" | "release",
  ][] = [
    ["not being deleted", partition(NS, "p", { node: "node-a" }), view(HB), [], HB + 2 * BOUND, "none"],
    [
      "the agent's finalizer already gone",
      deleting((p) => (p.metadata.finalizers = ["x"])),
      view(HB),
      [],
      HB + 2 * BOUND,
      "none",
    ],
    ["node beat within the bound (briefly cut off)", deleting(), view(HB), [], HB + BOUND - 1, "wait"],
    ["node silent past the bound", deleting(), view(HB), [], HB + BOUND, "release"],
    [
      "node silent past the bound, but a live attachment names it",
      deleting(),
      view(HB),
      [attachment("va")],
      HB + BOUND,
      "wait",
    ],
    [
      "an attachment of another partition does not hold it",
      deleting(),
      view(HB),
      [attachment("va", { uid: "other" })],
      HB + BOUND,
      "release",
    ],
    [
      "no RDMAStorageNode: timed from the deletion",
      deleting(),
      view(undefined),
      [],
      Date.parse(DELETED) + BOUND,
      "wait",
    ],
    [
      "no RDMAStorageNode, past the bound",
      deleting(),
      view(undefined),
      [],
      Date.parse(DELETED) + 999 + BOUND,
      "release",
    ],
  ];
  test.each(table)("%s -> %s", (_n, p, v, as, now, kind) => {
    expect(decideLostNode(p, v, as, now, BOUND).kind).toBe(kind);
  });

  test("the release frees the attachments being deleted, and names the node and the drive", () => {
    const step = decideLostNode(
      deleting(),
      view(HB),
      [attachment("va", { deleting: true })],
      HB + BOUND,
      BOUND,
    );
    if (step.kind !== "release") throw new Error(step.kind);
    expect(step.attachments).toEqual(["va"]);
    expect(step.node).toBe("node-a");
    expect(step.message).toContain("storage node node-a is lost");
    expect(step.message).toContain("drive SER-1 on node-a");
  });

  test("a replicated volume (no drive) is released without a word of a drive", () => {
    const v = deleting((p) => {
      delete p.spec.deviceSerial;
      p.spec.replicas = 2;
    });
    const step = decideLostNode(v, view(HB), [], HB + BOUND, BOUND);
    expect(step.kind === "release" && step.message).not.toContain("drive");
  });

  test("the wait says when it would release, the same on every pass", () => {
    const a = decideLostNode(deleting(), view(HB), [], HB + 1000, BOUND);
    const b = decideLostNode(deleting(), view(HB), [], HB + 9000, BOUND);
    if (a.kind !== "wait" || b.kind !== "wait") throw new Error("no wait");
    expect(a.why).toBe(b.why);
    expect(a.why).toContain(new Date(HB + BOUND).toISOString());
  });
});
