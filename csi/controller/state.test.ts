// The pure views ControllerState builds volumes from: storage-node labels and published nodes.
import { expect, test } from "bun:test";
import type { NVMeVolumeAttachment, RDMAStorageNode } from "../../api/index.ts";
import { publishedNodes, storageNodeLabels } from "./state.ts";

function storageNode(
  name: string,
  nodeName: string,
  heartbeat: string | undefined,
  zone: string,
): RDMAStorageNode {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name, labels: { "topology.kubernetes.io/zone": zone } },
    spec: { nodeName },
    ...(heartbeat ? { status: { lastHeartbeatTime: heartbeat, conditions: [] } } : {}),
  };
}

function attachment(
  name: string,
  partitionUID: string,
  nodeId: string,
  deleting = false,
): NVMeVolumeAttachment {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: {
      name,
      namespace: "ns",
      ...(deleting ? { deletionTimestamp: "2026-01-01T00:00:00Z" } : {}),
    },
    spec: {
      partitionName: "pvc-1",
      partitionUID,
      nodeId,
      hostNQN: "nqn.2014-08.org.nvmexpress:uuid:6f1c2a4e-0d3b-4c59-9a8e-2b7d5f0c1e93",
      attachmentId: `id-${name}`,
    },
  };
}

test("storageNodeLabels: the record with the freshest heartbeat for the node wins", () => {
  const nodes = [
    storageNode("old", "n1", "2026-01-01T00:00:00Z", "a"),
    storageNode("new", "n1", "2026-01-02T00:00:00Z", "b"),
    storageNode("never", "n1", undefined, "c"),
    storageNode("other", "n2", "2026-01-03T00:00:00Z", "d"),
  ];
  expect(storageNodeLabels(nodes, "n1")).toEqual({ "topology.kubernetes.io/zone": "b" });
  expect(storageNodeLabels(nodes, "n2")).toEqual({ "topology.kubernetes.io/zone": "d" });
});

test("storageNodeLabels: none for an unplaced partition or an unknown node", () => {
  const nodes = [storageNode("s1", "n1", "2026-01-01T00:00:00Z", "a")];
  expect(storageNodeLabels(nodes, undefined)).toEqual({});
  expect(storageNodeLabels(nodes, "n9")).toEqual({});
});

test("publishedNodes: node ids per partition UID, skipping attachments being deleted", () => {
  const out = publishedNodes([
    attachment("a1", "u1", "n1"),
    attachment("a2", "u2", "n2"),
    attachment("a3", "u2", "n3"),
    attachment("a4", "u3", "n4", true),
  ]);
  expect([...out.entries()]).toEqual([
    ["u1", ["n1"]],
    ["u2", ["n2", "n3"]],
  ]);
});
