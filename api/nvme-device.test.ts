// NVMeDevice schema: the example parses, and every constraint is reported at the field it guards.
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { exampleNVMeDevice } from "./examples.ts";
import { NVMeDeviceSchema } from "./nvme-device.ts";
import { issuePaths, type RejectCase, withPaths } from "./testing.ts";

describe("NVMeDevice", () => {
  const accepts: { name: string; set: Record<string, unknown> }[] = [
    { name: "the example", set: {} },
    { name: "unknown NUMA node", set: { "spec.numaNode": -1 } },
    { name: "VMD PCI domain", set: { "spec.pciAddress": "10000:01:1f.7" } },
    { name: "no status yet", set: { status: undefined } },
    {
      name: "Available without claimRef",
      set: { "status.phase": "Available", "status.claimRef": undefined },
    },
    { name: "Unavailable keeps claimRef", set: { "status.phase": "Unavailable" } },
    { name: "status without conditions", set: { "status.conditions": undefined } },
    {
      name: "a placement ledger",
      set: {
        "status.reservations": [{ uid: "u1", namespace: "ns", name: "p1", bytes: 4 * 1024 ** 2 }],
      },
    },
  ];
  test.each(accepts)("accepts $name", ({ set }) => {
    expect(issuePaths(NVMeDeviceSchema, withPaths(exampleNVMeDevice(), set))).toEqual([]);
  });

  const rejects: RejectCase[] = [
    { name: "wrong apiVersion", set: { apiVersion: "storage.distort.io/v1" }, at: "apiVersion" },
    { name: "wrong kind", set: { kind: "NVMePartition" }, at: "kind" },
    { name: "empty nodeName", set: { "spec.nodeName": "" }, at: "spec.nodeName" },
    { name: "short PCI address", set: { "spec.pciAddress": "3b:00.0" }, at: "spec.pciAddress" },
    { name: "upper-case PCI address", set: { "spec.pciAddress": "0000:3B:00.0" }, at: "spec.pciAddress" },
    { name: "PCI device > 0x1f", set: { "spec.pciAddress": "0000:3b:20.0" }, at: "spec.pciAddress" },
    { name: "empty serial", set: { "spec.serial": "" }, at: "spec.serial" },
    { name: "missing model", set: { "spec.model": undefined }, at: "spec.model" },
    { name: "zero allocatableBytes", set: { "spec.allocatableBytes": 0 }, at: "spec.allocatableBytes" },
    {
      name: "fractional allocatableBytes",
      set: { "spec.allocatableBytes": 1.5 },
      at: "spec.allocatableBytes",
    },
    {
      name: "allocatableBytes beyond 2^53",
      set: { "spec.allocatableBytes": 2 ** 53 },
      at: "spec.allocatableBytes",
    },
    { name: "NUMA node -2", set: { "spec.numaNode": -2 }, at: "spec.numaNode" },
    { name: "unknown phase", set: { "status.phase": "Gone" }, at: "status.phase" },
    { name: "Claimed without claimRef", set: { "status.claimRef": undefined }, at: "status.claimRef" },
    { name: "claimRef without uid", set: { "status.claimRef.uid": undefined }, at: "status.claimRef.uid" },
    { name: "negative freeBytes", set: { "status.freeBytes": -1 }, at: "status.freeBytes" },
    { name: "unknown backend", set: { "status.activeBackend": "zfs" }, at: "status.activeBackend" },
    {
      name: "ledger entry of zero bytes",
      set: { "status.reservations": [{ uid: "u1", namespace: "ns", name: "p1", bytes: 0 }] },
      at: "status.reservations.0.bytes",
    },
    {
      name: "ledger entry without uid",
      set: { "status.reservations": [{ namespace: "ns", name: "p1", bytes: 1 }] },
      at: "status.reservations.0.uid",
    },
    {
      name: "negative observedGeneration",
      set: { "status.observedGeneration": -1 },
      at: "status.observedGeneration",
    },
  ];
  test.each(rejects)("rejects $name at $at", ({ set, at }) => {
    expect(issuePaths(NVMeDeviceSchema, withPaths(exampleNVMeDevice(), set))).toContain(at);
  });

  test("an absent ledger parses as empty", () => {
    const d = v.parse(NVMeDeviceSchema, withPaths(exampleNVMeDevice(), { "status.reservations": undefined }));
    expect(d.status?.reservations).toEqual([]);
  });

  test("the claimRef rule names its field in the message", () => {
    const r = v.safeParse(NVMeDeviceSchema, withPaths(exampleNVMeDevice(), { "status.claimRef": undefined }));
    expect(r.issues?.map((i) => i.message)).toContain(
      "status.claimRef is required when status.phase is Claimed",
    );
  });
});
