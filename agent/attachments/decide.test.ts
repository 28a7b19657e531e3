// Table tests of the attachment reconciler's decisions: who owns the ACL, when to grant, when to
// revoke and when to let go of the finalizer.
import { describe, expect, test } from "bun:test";
import { exampleNVMePartition, exampleNVMeVolumeAttachment } from "../../api/examples.ts";
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { desiredHosts } from "../partitions/controller.ts";
import { ATTACHMENT_FINALIZER, type AttachmentDecision, decideAttachment } from "./controller.ts";

const DELETED = "2026-02-01T10:00:00Z";
function att(mut: (a: NVMeVolumeAttachment) => void = () => {}): NVMeVolumeAttachment {
  const a = exampleNVMeVolumeAttachment();
  a.metadata.uid = "a-uid";
  a.metadata.finalizers = [ATTACHMENT_FINALIZER];
  mut(a);
  return a;
}
function part(mut: (p: NVMePartition) => void = () => {}): NVMePartition {
  const p = exampleNVMePartition();
  mut(p);
  return p;
}

describe("decideAttachment", () => {
  const cases: [
    string,
    NVMeVolumeAttachment,
    NVMePartition | undefined,
    AttachmentDecision["action"],
    string?,
  ][] = [
    ["exported partition on this node: grant", att(), part(), "grant"],
    ["no finalizer yet", att((a) => (a.metadata.finalizers = [])), part(), "add-finalizer"],
    [
      "partition not exported yet",
      att(),
      part((p) => (p.status!.state = "Provisioning")),
      "wait",
      "NotExported",
    ],
    ["partition on another node", att(), part((p) => (p.spec.nodeName = "node-z")), "ignore"],
    ["partition missing", att(), undefined, "ignore"],
    ["partition replaced (other uid)", att(), part((p) => (p.metadata.uid = "new")), "ignore"],
    [
      "same partition UID, but in a tenant's namespace: not the partition's record",
      att((a) => (a.metadata.namespace = "tenant-b")),
      part(),
      "ignore",
    ],
    [
      "same partition UID and namespace, but not the name CSI derives: not the record",
      att((a) => (a.metadata.name = "forged")),
      part(),
      "ignore",
    ],
    [
      "a look-alike being deleted is let go without touching the ACL",
      att((a) => {
        a.metadata.name = "forged";
        a.metadata.deletionTimestamp = DELETED;
      }),
      part(),
      "revoke",
    ],
    [
      "deleting, ours: revoke with an export",
      att((a) => (a.metadata.deletionTimestamp = DELETED)),
      part(),
      "revoke",
    ],
    [
      "deleting, partition gone: let go",
      att((a) => (a.metadata.deletionTimestamp = DELETED)),
      undefined,
      "revoke",
    ],
    [
      "deleting, partition on another node: that agent's job",
      att((a) => (a.metadata.deletionTimestamp = DELETED)),
      part((p) => (p.spec.nodeName = "node-z")),
      "ignore",
    ],
    [
      "deleting, partition never placed: let go",
      att((a) => (a.metadata.deletionTimestamp = DELETED)),
      part((p) => {
        delete p.spec.nodeName;
        delete p.spec.deviceSerial;
      }),
      "revoke",
    ],
    [
      "deleting without finalizer",
      att((a) => {
        a.metadata.deletionTimestamp = DELETED;
        a.metadata.finalizers = [];
      }),
      part(),
      "ignore",
    ],
  ];
  for (const [name, a, p, action, reason] of cases) {
    test(name, () => {
      const d = decideAttachment(a, p, [a], "node-a");
      expect(d.action).toBe(action);
      if (reason) expect((d as { reason: string }).reason).toBe(reason);
    });
  }

  test("grant allows exactly the attachment's host; revoke of the last attachment leaves none", () => {
    const a = att();
    const g = decideAttachment(a, part(), [a], "node-a");
    expect(g).toMatchObject({ action: "grant", hosts: [a.spec.hostNQN], nqn: part().status!.nqn });
    const r = decideAttachment(
      att((x) => (x.metadata.deletionTimestamp = DELETED)),
      part(),
      [a],
      "node-a",
    );
    expect(r).toMatchObject({ action: "revoke", hosts: [], nqn: part().status!.nqn });
  });

  test("a takeover (new host NQN in the spec) grants only the new host", () => {
    const a = att(
      (x) => (x.spec.hostNQN = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"),
    );
    const g = decideAttachment(a, part(), [a], "node-a");
    expect(g).toMatchObject({
      hosts: ["nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"],
    });
  });

  test("look-alikes in other namespaces or under other names never reach the ACL", () => {
    const record = att();
    const other = "nqn.2014-08.org.nvmexpress:uuid:22222222-3333-4444-8555-666666666666";
    const foreign = att((x) => {
      x.metadata.namespace = "tenant-b";
      x.spec.hostNQN = other;
    });
    const renamed = att((x) => {
      x.metadata.name = "forged";
      x.spec.hostNQN = other;
    });
    expect(desiredHosts(part(), [record, foreign, renamed])).toEqual([record.spec.hostNQN]);
    expect(decideAttachment(record, part(), [record, foreign, renamed], "node-a")).toMatchObject({
      action: "grant",
      hosts: [record.spec.hostNQN],
    });
    const gone = att((x) => (x.metadata.deletionTimestamp = DELETED));
    expect(decideAttachment(gone, part(), [gone, foreign, renamed], "node-a")).toMatchObject({
      action: "revoke",
      hosts: [],
    });
  });
});
