// Single-writer fencing decisions for ControllerPublish/Unpublish over one attachment per partition.
import { expect, test } from "bun:test";
import type { NVMeVolumeAttachment } from "../../api/index.ts";
import {
  ACCESS_ANNOTATION,
  accessPending,
  accessReady,
  decideExclusion,
  decidePublish,
  decideSharing,
  decideUnpublish,
  FENCED_ANNOTATION,
  type PublishIntent,
  READONLY_ANNOTATION,
} from "./fencing.ts";

const NQN_A = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-aaaa-8aaa-8aaa-aaaaaaaaaaaa";
const NQN_B = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-bbbb-8bbb-8bbb-bbbbbbbbbbbb";
const T = "2026-01-01T00:00:00Z";

function att(
  over: { node?: string; nqn?: string; ann?: Record<string, string>; deleting?: boolean } = {},
): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: {
      name: "pvc-1-0123456789",
      namespace: "ns",
      uid: "u1",
      annotations: {
        [READONLY_ANNOTATION]: "false",
        [ACCESS_ANNOTATION]: "mount:ext4:SINGLE_NODE_WRITER",
        ...over.ann,
      },
      ...(over.deleting ? { deletionTimestamp: T } : {}),
    },
    spec: {
      partitionName: "pvc-1",
      partitionUID: "p1",
      nodeId: over.node ?? "node-a",
      hostNQN: over.nqn ?? NQN_A,
      attachmentId: "att-1",
    },
  };
}
const want = (over: Partial<PublishIntent> = {}): PublishIntent => ({
  nodeId: "node-a",
  hostNQN: NQN_A,
  access: "mount:ext4:SINGLE_NODE_WRITER",
  readonly: false,
  ...over,
});

const publishRows: [string, NVMeVolumeAttachment | undefined, PublishIntent, string][] = [
  ["nothing published", undefined, want(), "create"],
  ["same node, same details: idempotent", att(), want(), "await-ready"],
  ["same node, other read-only flag", att(), want({ readonly: true }), "incompatible"],
  ["same node, other access", att(), want({ access: "block::SINGLE_NODE_WRITER" }), "incompatible"],
  ["same node, host NQN changed", att(), want({ hostNQN: NQN_B }), "renew"],
  ["other node, not fenced", att(), want({ nodeId: "node-b", hostNQN: NQN_B }), "refuse"],
  [
    "other node, fenced=yes is not true",
    att({ ann: { [FENCED_ANNOTATION]: "yes" } }),
    want({ nodeId: "node-b" }),
    "refuse",
  ],
  [
    "other node, holder fenced",
    att({ ann: { [FENCED_ANNOTATION]: "true" } }),
    want({ nodeId: "node-b", hostNQN: NQN_B }),
    "takeover",
  ],
  ["being unpublished", att({ deleting: true }), want({ nodeId: "node-b" }), "wait-gone"],
  // Node IDs carry the host NQN now; one published under the bare name of earlier releases is
  // the same node, and its record takes the new ID.
  ["same node, node ID of the new format", att(), want({ nodeId: `node-a/${NQN_A}` }), "renew"],
  [
    "same node, both new format",
    att({ node: `node-a/${NQN_A}` }),
    want({ nodeId: `node-a/${NQN_A}` }),
    "await-ready",
  ],
  [
    "other node in the new format, not fenced",
    att({ node: `node-a/${NQN_A}` }),
    want({ nodeId: `node-b/${NQN_B}`, hostNQN: NQN_B }),
    "refuse",
  ],
];
for (const [name, cur, w, action] of publishRows) {
  test(`publish: ${name} -> ${action}`, () => {
    const d = decidePublish(cur, w);
    expect(d.action as string).toBe(action);
    if (d.action === "refuse") {
      expect(d.holder).toStartWith("node-a");
      expect(d.message).toContain(`${FENCED_ANNOTATION}=true`);
    }
    if (d.action === "takeover") expect(d.from).toBe("node-a");
  });
}

const unpublishRows: [string, NVMeVolumeAttachment | undefined, string, string][] = [
  ["nothing published", undefined, "node-a", "done"],
  ["published here", att(), "node-a", "delete"],
  ["any node (empty node id)", att(), "", "delete"],
  ["stale unpublish after a takeover", att({ node: "node-b" }), "node-a", "done"],
  ["already being deleted", att({ deleting: true }), "node-a", "wait-gone"],
  // csi-attacher detaches with the node ID it attached with (its VolumeAttachment annotation).
  ["published under a bare name, unpublished with the new ID", att(), `node-a/${NQN_A}`, "delete"],
  [
    "published with the new ID, unpublished under the bare name",
    att({ node: `node-a/${NQN_A}` }),
    "node-a",
    "delete",
  ],
  ["new format, another node", att({ node: `node-b/${NQN_B}` }), `node-a/${NQN_A}`, "done"],
];
for (const [name, cur, node, action] of unpublishRows) {
  test(`unpublish: ${name} -> ${action}`, () => {
    expect(decideUnpublish(cur, node).action as string).toBe(action);
  });
}

test("AccessReady counts only for the exact lifetime the agent observed", () => {
  const ready = (observed: string, status: "True" | "False") => ({
    ...att(),
    status: {
      observedAttachmentId: observed,
      conditions: [
        { type: "AccessReady", status, reason: "HostAllowed", message: "", lastTransitionTime: T },
      ],
    },
  });
  expect(accessReady(ready("att-1", "True"), "att-1")).toBe(true);
  expect(accessReady(ready("att-0", "True"), "att-1")).toBe(false);
  expect(accessReady(ready("att-1", "False"), "att-1")).toBe(false);
  expect(accessReady(att(), "att-1")).toBe(false);
  expect(accessReady(ready("att-1", "True"), "att-2")).toBe(false);
  expect(accessPending(ready("att-0", "True"))).toContain("still enforces att-0");
  expect(accessPending(undefined)).toContain("not visible");
});

// The mode matrix of readers against writers: rows are (publishing a reader?, what holds it now).
const reader = (node: string, deleting = false) =>
  att({
    node,
    deleting,
    ann: { [ACCESS_ANNOTATION]: "mount:ext4:MULTI_NODE_READER_ONLY", [READONLY_ANNOTATION]: "true" },
  });
function mnmw(node: string, o: { deleting?: boolean; fenced?: boolean } = {}): NVMeVolumeAttachment {
  const a = att({
    node,
    ...(o.deleting ? { deleting: true } : {}),
    ann: {
      [ACCESS_ANNOTATION]: "block::MULTI_NODE_MULTI_WRITER",
      ...(o.fenced ? { [FENCED_ANNOTATION]: "true" } : {}),
    },
  });
  return { ...a, metadata: { ...a.metadata, name: `pvc-1-${node}` } };
}
const exclusionRows: [string, boolean, NVMeVolumeAttachment[], string][] = [
  ["first reader", true, [], "proceed"],
  ["reader while a writer holds it", true, [att()], "refuse"],
  [
    "reader while a SINGLE_NODE_READER_ONLY publication holds it",
    true,
    [att({ ann: { [ACCESS_ANNOTATION]: "mount:ext4:SINGLE_NODE_READER_ONLY" } })],
    "refuse",
  ],
  ["reader while the writer is being unpublished", true, [att({ deleting: true })], "wait-gone"],
  ["writer with no readers", false, [], "proceed"],
  ["writer while two readers hold it", false, [reader("node-b"), reader("node-c")], "refuse"],
  [
    "writer while one reader leaves and one stays",
    false,
    [reader("node-b", true), reader("node-c")],
    "refuse",
  ],
  [
    "writer while the last readers are leaving",
    false,
    [reader("node-b", true), reader("node-c", true)],
    "wait-gone",
  ],
  [
    "single writer while two MULTI_NODE_MULTI_WRITER hosts hold it",
    false,
    [mnmw("node-b"), mnmw("node-c")],
    "refuse",
  ],
  [
    "single writer while one of two MNMW hosts is fenced",
    false,
    [mnmw("node-b", { fenced: true }), mnmw("node-c")],
    "refuse",
  ],
  [
    "single writer while every MNMW host left is fenced: revoke them",
    false,
    [mnmw("node-b", { fenced: true }), mnmw("node-c", { fenced: true })],
    "revoke",
  ],
  ["MNMW writer while a single-node writer holds it", true, [att({ node: "node-a" })], "refuse"],
];
for (const [name, isReader, held, action] of exclusionRows) {
  test(`exclusion: ${name} -> ${action}`, () => {
    const d = decideExclusion(isReader, held);
    expect(d.action as string).toBe(action);
    if (d.action === "refuse") expect(d.message).toContain(isReader ? "node-a" : "node-c");
    if (d.action === "wait-gone") expect(d.names.length).toBe(held.length);
    if (d.action === "revoke") expect(d.names).toEqual(held.map((a) => a.metadata.name));
  });
}

// A multi-node publish against the other per-node attachments: the MULTI_NODE_MULTI_WRITER cap of
// two hosts, no mixing of readers and writers, fenced hosts revoked first.
const MNMW = "MULTI_NODE_MULTI_WRITER";
const sharingRows: [string, string, NVMeVolumeAttachment[], string, string?][] = [
  ["first MNMW host", MNMW, [], "proceed"],
  ["second MNMW host (migration destination)", MNMW, [mnmw("node-b")], "proceed"],
  ["this node's own attachment is not a peer", MNMW, [mnmw("node-a"), mnmw("node-b")], "proceed"],
  ["third MNMW host", MNMW, [mnmw("node-b"), mnmw("node-c")], "refuse", "2 nodes already"],
  [
    "third host while one of two is leaving the ACL",
    MNMW,
    [mnmw("node-b"), mnmw("node-c", { deleting: true })],
    "wait-gone",
  ],
  [
    "third host while one of two is fenced: revoke it",
    MNMW,
    [mnmw("node-b"), mnmw("node-c", { fenced: true })],
    "revoke",
  ],
  ["MNMW while readers hold it", MNMW, [reader("node-b")], "refuse", "MULTI_NODE_READER_ONLY"],
  ["MNMW while the last reader leaves", MNMW, [reader("node-b", true)], "wait-gone"],
  ["reader while an MNMW host holds it", "MULTI_NODE_READER_ONLY", [mnmw("node-b")], "refuse", MNMW],
  [
    "third reader: readers have no cap",
    "MULTI_NODE_READER_ONLY",
    [reader("node-b"), reader("node-c")],
    "proceed",
  ],
];
for (const [name, mode, shared, action, says] of sharingRows) {
  test(`sharing: ${name} -> ${action}`, () => {
    const d = decideSharing(mode, "node-a", shared, 2);
    expect(d.action as string).toBe(action);
    if (d.action === "refuse" && says) expect(d.message).toContain(says);
    if (d.action === "revoke") expect(d.names).toEqual(["pvc-1-node-c"]);
  });
}
