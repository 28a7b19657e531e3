// NVMeVolumeAttachment schema: the example parses, and every constraint is reported at the field it guards.
import { describe, expect, test } from "bun:test";
import { exampleNVMeVolumeAttachment } from "./examples.ts";
import { NVMeVolumeAttachmentSchema } from "./nvme-volume-attachment.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

describe("NVMeVolumeAttachment", () => {
  const accepts: { name: string; set: Record<string, unknown> }[] = [
    { name: "the example", set: {} },
    { name: "before the agent acted", set: { status: undefined } },
    { name: "non-uuid host NQN", set: { "spec.hostNQN": "nqn.2026-02.io.distort:host-node-b" } },
  ];
  test.each(accepts)("accepts $name", ({ set }) => {
    expect(issuePaths(NVMeVolumeAttachmentSchema, withPaths(exampleNVMeVolumeAttachment(), set))).toEqual([]);
  });

  const rejects: RejectCase[] = [
    { name: "empty partitionName", set: { "spec.partitionName": "" }, at: "spec.partitionName" },
    { name: "empty partitionUID", set: { "spec.partitionUID": "" }, at: "spec.partitionUID" },
    { name: "missing nodeId", set: { "spec.nodeId": undefined }, at: "spec.nodeId" },
    { name: "host NQN without prefix", set: { "spec.hostNQN": "node-b" }, at: "spec.hostNQN" },
    {
      name: "host NQN without colon",
      set: { "spec.hostNQN": "nqn.2014-08.org.nvmexpress" },
      at: "spec.hostNQN",
    },
    {
      name: "host NQN over 223 bytes",
      set: { "spec.hostNQN": `nqn.2014-08.org.nvmexpress:${"x".repeat(200)}` },
      at: "spec.hostNQN",
    },
    { name: "empty attachmentId", set: { "spec.attachmentId": "" }, at: "spec.attachmentId" },
    {
      name: "empty observedAttachmentId",
      set: { "status.observedAttachmentId": "" },
      at: "status.observedAttachmentId",
    },
    {
      name: "bad condition time",
      set: { "status.conditions.0.lastTransitionTime": "now" },
      at: "status.conditions.0.lastTransitionTime",
    },
  ];
  test.each(rejects)("rejects $name at $at", ({ set, at }) => {
    expect(issuePaths(NVMeVolumeAttachmentSchema, withPaths(exampleNVMeVolumeAttachment(), set))).toContain(
      at,
    );
  });
});
