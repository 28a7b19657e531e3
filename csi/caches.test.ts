// What the CSI controller keeps of the devices it caches: GetCapacity answers the same without the rest.
import { expect, test } from "bun:test";
import { exampleNVMeDevice, exampleNVMePartition, exampleRDMAStorageNode } from "../api/examples.ts";
import { kinds } from "../api/index.ts";
import type { KubeObject, ResourceKind } from "../lib/kube/resource.ts";
import { csiTransform } from "./caches.ts";
import { deviceFreeBytes } from "./controller/capacity-report.ts";

const shape = (kind: ResourceKind, obj: KubeObject) => csiTransform(kind, structuredClone(obj));

test("a device with freeBytes loses its ledger and conditions; its free bytes read the same", () => {
  const d = exampleNVMeDevice();
  const out = shape(kinds.NVMeDevice as ResourceKind, d) as typeof d;
  expect(out.status?.reservations).toBeUndefined();
  expect(out.status?.conditions).toBeUndefined();
  expect(deviceFreeBytes(out)).toBe(deviceFreeBytes(d));
  expect(out.spec).toEqual(d.spec);
  expect(out.status?.phase).toBe(d.status?.phase as NonNullable<typeof d.status>["phase"]);
});

test("a device without freeBytes keeps the ledger GetCapacity falls back on", () => {
  const d = exampleNVMeDevice();
  delete d.status?.freeBytes;
  const out = shape(kinds.NVMeDevice as ResourceKind, d) as typeof d;
  expect(out.status?.reservations).toEqual(d.status?.reservations as never);
  expect(deviceFreeBytes(out)).toBe(deviceFreeBytes(d));
});

test("every other kind passes unchanged", () => {
  for (const [kind, obj] of [
    [kinds.NVMePartition, exampleNVMePartition()],
    [kinds.RDMAStorageNode, exampleRDMAStorageNode()],
  ] as const) {
    expect(shape(kind as ResourceKind, obj)).toEqual(obj);
  }
});
