// NVMeDeviceClaim schema: the example parses, and every constraint is reported at the field it guards.
import { describe, expect, test } from "bun:test";
import { exampleNVMeDeviceClaim } from "./examples.ts";
import { NVMeDeviceClaimSchema } from "./nvme-device-claim.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

describe("NVMeDeviceClaim", () => {
  const accepts: { name: string; set: Record<string, unknown> }[] = [
    { name: "the example", set: {} },
    { name: "no node restriction", set: { "spec.nodeName": undefined } },
    { name: "Pending without device", set: { status: { phase: "Pending" } } },
    { name: "Lost keeps device", set: { "status.phase": "Lost" } },
  ];
  test.each(accepts)("accepts $name", ({ set }) => {
    expect(issuePaths(NVMeDeviceClaimSchema, withPaths(exampleNVMeDeviceClaim(), set))).toEqual([]);
  });

  const rejects: RejectCase[] = [
    { name: "empty serial", set: { "spec.serial": "" }, at: "spec.serial" },
    { name: "missing serial", set: { "spec.serial": undefined }, at: "spec.serial" },
    { name: "overlong serial", set: { "spec.serial": "S".repeat(257) }, at: "spec.serial" },
    { name: "empty nodeName", set: { "spec.nodeName": "" }, at: "spec.nodeName" },
    { name: "unknown phase", set: { "status.phase": "Released" }, at: "status.phase" },
    { name: "status without phase", set: { "status.phase": undefined }, at: "status.phase" },
    { name: "empty deviceName", set: { "status.deviceName": "" }, at: "status.deviceName" },
    {
      name: "bad condition status",
      set: { "status.conditions.0.status": "Yes" },
      at: "status.conditions.0.status",
    },
  ];
  test.each(rejects)("rejects $name at $at", ({ set, at }) => {
    expect(issuePaths(NVMeDeviceClaimSchema, withPaths(exampleNVMeDeviceClaim(), set))).toContain(at);
  });
});
