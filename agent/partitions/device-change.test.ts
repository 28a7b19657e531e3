// Which NVMeDevice updates requeue the drive's partitions.
import { describe, expect, test } from "bun:test";
import { exampleNVMeDevice } from "../../api/examples.ts";
import type { NVMeDevice } from "../../api/index.ts";
import { deviceChangeMatters } from "./device-change.ts";

function changed(mut: (d: NVMeDevice) => void): [NVMeDevice, NVMeDevice] {
  const old = exampleNVMeDevice();
  const next = structuredClone(old);
  mut(next);
  return [old, next];
}

describe("deviceChangeMatters", () => {
  test("a ledger-only write does not matter", () => {
    const [old, next] = changed((d) => {
      d.metadata.resourceVersion = "43";
      d.metadata.managedFields = [{ manager: "distort-manager", operation: "Update" }];
      d.status!.freeBytes = (d.status!.freeBytes ?? 0) - 64 * 1024 ** 2;
      d.status!.reservations = [
        ...(d.status!.reservations ?? []),
        { uid: "u-2", namespace: "distort-system", name: "pvc-2", bytes: 64 * 1024 ** 2 },
      ];
    });
    expect(deviceChangeMatters(old, next)).toBe(false);
  });

  test("an identical object does not matter", () => {
    const d = exampleNVMeDevice();
    expect(deviceChangeMatters(d, structuredClone(d))).toBe(false);
  });

  const relevant: [string, (d: NVMeDevice) => void][] = [
    ["status.phase", (d) => (d.status!.phase = "Unavailable")],
    ["status.activeBackend set", (d) => delete d.status!.activeBackend],
    ["status.activeBackend changed", (d) => (d.status!.activeBackend = "kernel")],
    ["status.claimRef removed", (d) => delete d.status!.claimRef],
    ["status.claimRef uid", (d) => (d.status!.claimRef!.uid = "other")],
    ["status.claimRef name", (d) => (d.status!.claimRef!.name = "drive-2")],
    ["status.claimRef namespace", (d) => (d.status!.claimRef!.namespace = "other-ns")],
    ["whole status gone", (d) => delete d.status],
    ["spec.serial", (d) => (d.spec.serial = "OTHER")],
    ["spec.nodeName", (d) => (d.spec.nodeName = "node-b")],
    ["spec.pciAddress", (d) => (d.spec.pciAddress = "0000:5e:00.0")],
    ["metadata.name", (d) => (d.metadata.name = "node-a-other")],
    ["metadata.uid (a replacement)", (d) => (d.metadata.uid = "another-uid")],
  ];
  for (const [field, mut] of relevant) {
    test(`${field} matters`, () => {
      const [old, next] = changed(mut);
      expect(deviceChangeMatters(old, next)).toBe(true);
      expect(deviceChangeMatters(next, old)).toBe(true);
    });
  }

  test("an add or a delete always matters", () => {
    expect(deviceChangeMatters(undefined, exampleNVMeDevice())).toBe(true);
    expect(deviceChangeMatters(exampleNVMeDevice(), undefined)).toBe(true);
  });
});
