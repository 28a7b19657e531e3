// NVMePartition -> CSI VolumeHealth: the id it is reported under and the error type of each issue.
import { expect, test } from "bun:test";
import type { NVMePartition } from "../../api/index.ts";
import { VolumeHealthErrorType } from "../../gen/csi/v1/csi_pb.ts";
import { healthOf } from "./health.ts";

const UID = "3c9e1f7a-2b4d-4a6e-8f0c-5d1b7e9a2c43";

function part(extra: Partial<NVMePartition["metadata"]>, status?: NVMePartition["status"]): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: "pvc-1", namespace: "ns", uid: UID, generation: 1, ...extra },
    spec: { sizeBytes: 8 * 1024 * 1024, backend: "spdk", volumeManager: "partition" },
    ...(status ? { status } : {}),
  };
}

test("healthOf: a volume being deleted is INACCESSIBLE under its volume id", () => {
  const h = healthOf(part({ deletionTimestamp: "2026-01-01T00:00:00Z" }), "ns");
  expect(h.volumeId).toBe(`ns/pvc-1/${UID}`);
  expect(h.healthStatuses).toHaveLength(1);
  expect(h.healthStatuses[0]).toMatchObject({
    status: VolumeHealthErrorType.INACCESSIBLE,
    reason: "Deleting",
  });
});

test("healthOf: a partition not exported yet is INACCESSIBLE with reason NotExported", () => {
  const h = healthOf(part({}, { state: "Pending", conditions: [] }), "ns");
  expect(h.healthStatuses.map((s) => [s.status, s.reason])).toEqual([
    [VolumeHealthErrorType.INACCESSIBLE, "NotExported"],
  ]);
});
