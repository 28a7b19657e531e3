import { expect, test } from "bun:test";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { JsonPatchOp } from "../lib/kube/resource.ts";
import { fencePatch, renderFence } from "./fence.ts";

const att = (annotations?: Record<string, string>): NVMeVolumeAttachment => ({
  apiVersion: "storage.distort.io/v1alpha1",
  kind: "NVMeVolumeAttachment",
  metadata: { name: "a", namespace: "distort-system", uid: "u-1", ...(annotations ? { annotations } : {}) },
  spec: {
    partitionName: "p",
    partitionUID: "pu",
    nodeId: "n1/nqn.x",
    hostNQN: "nqn.2014-08.org.nvmexpress:uuid:x",
    attachmentId: "1",
  },
});

test("fencing patches are guarded by uid and holder, and create the annotations map when absent", () => {
  const guard: JsonPatchOp[] = [
    { op: "test", path: "/metadata/uid", value: "u-1" },
    { op: "test", path: "/spec/nodeId", value: "n1/nqn.x" },
  ];
  expect(fencePatch(att(), true)).toEqual([
    ...guard,
    { op: "add", path: "/metadata/annotations", value: { "storage.distort.io/fenced": "true" } },
  ]);
  expect(fencePatch(att({ other: "1" }), true)).toEqual([
    ...guard,
    { op: "add", path: "/metadata/annotations/storage.distort.io~1fenced", value: "true" },
  ]);
  expect(fencePatch(att({ "storage.distort.io/fenced": "true" }), true)).toBeUndefined();
  expect(fencePatch(att({ "storage.distort.io/fenced": "true" }), false)).toEqual([
    ...guard,
    { op: "remove", path: "/metadata/annotations/storage.distort.io~1fenced" },
  ]);
  expect(fencePatch(att(), false)).toBeUndefined();
});

test("the text names each attachment and warns what fencing allows", () => {
  const text = renderFence("n1", true, [
    { namespace: "ns", name: "a", partition: "p", nodeId: "n1", outcome: "changed" },
    { namespace: "ns", name: "b", partition: "q", nodeId: "n1", outcome: "moved" },
  ]);
  expect(text).toContain(
    "ns/a (partition p): fenced\nns/b (partition q): taken over meanwhile, left alone\n",
  );
  expect(text).toContain("takes them over from n1");
  expect(renderFence("n1", false, [])).toBe("node n1 holds no NVMeVolumeAttachment: nothing to unfence\n");
});
