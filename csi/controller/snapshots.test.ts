// NVMeSnapshot -> CSI Snapshot, and which Ready=False reasons end a CreateSnapshot wait.
import { expect, test } from "bun:test";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { NVMeSnapshot } from "../../api/index.ts";
import { SnapshotAnnotations, snapshotInfo, snapshotRefusal } from "./snapshots.ts";

const UID = "0b6f3c1e-6a2d-4f1b-9c3e-8d7a5b4c2e10";
const SRC_UID = "7e2d9a4c-1b3f-4e6a-8c5d-0f9b2a7e3d61";

function snap(
  over: { annotations?: Record<string, string>; status?: NVMeSnapshot["status"] } = {},
): NVMeSnapshot {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeSnapshot",
    metadata: {
      name: "snap-1",
      namespace: "ns",
      uid: UID,
      creationTimestamp: "2026-01-01T00:00:00Z",
      ...(over.annotations ? { annotations: over.annotations } : {}),
    },
    spec: { sourcePartitionName: "pvc-1", sourcePartitionUID: SRC_UID },
    ...(over.status ? { status: over.status } : {}),
  };
}

const ready = (status: "True" | "False", reason: string, message: string) => ({
  type: "Ready",
  status,
  reason,
  message,
  lastTransitionTime: "2026-01-01T00:00:00Z",
});

test("snapshotInfo: the recorded source id wins; status fills size, readiness and time", () => {
  const info = snapshotInfo(
    snap({
      annotations: { [SnapshotAnnotations.sourceVolumeId]: "ns/recorded/uid-x" },
      status: { readyToUse: true, sizeBytes: 4096, creationTime: "2026-01-02T03:04:05Z", conditions: [] },
    }),
    "ns",
  );
  expect(info.snapshotId).toBe(`ns/snap-1/${UID}`);
  expect(info.sourceVolumeId).toBe("ns/recorded/uid-x");
  expect(info.sizeBytes).toBe(4096n);
  expect(info.readyToUse).toBe(true);
  expect(info.creationTime).toEqual(timestampFromDate(new Date("2026-01-02T03:04:05Z")));
});

test("snapshotInfo: without a recorded source the id is composed from the spec; not ready without status", () => {
  const info = snapshotInfo(snap(), "ns");
  expect(info.sourceVolumeId).toBe(`ns/pvc-1/${SRC_UID}`);
  expect(info.sizeBytes).toBe(0n);
  expect(info.readyToUse).toBe(false);
  // Falls back to the object's creation time.
  expect(info.creationTime).toEqual(timestampFromDate(new Date("2026-01-01T00:00:00Z")));
});

test("snapshotRefusal: only the agent's final refusals end the wait", () => {
  expect(snapshotRefusal(snap({ status: { conditions: [ready("False", "SourceNotFound", "gone")] } }))).toBe(
    "gone",
  );
  expect(
    snapshotRefusal(snap({ status: { conditions: [ready("False", "UnsupportedBackend", "kernel")] } })),
  ).toBe("kernel");
  expect(
    snapshotRefusal(snap({ status: { conditions: [ready("False", "Creating", "soon")] } })),
  ).toBeUndefined();
  expect(snapshotRefusal(snap({ status: { conditions: [ready("True", "Ready", "")] } }))).toBeUndefined();
  expect(snapshotRefusal(snap())).toBeUndefined();
});
