// decideRotation: which partitions a rotate-keys annotation rotates, and why the others are refused.
import { expect, test } from "bun:test";
import type { NVMePartition } from "../../api/index.ts";
import { decideRotation, ROTATE_KEYS_ANNOTATION } from "./key-rotation.ts";

const dhchap = {
  mode: "unidirectional",
  hash: "sha256",
  dhgroup: "null",
  secretName: "dhchap-pv-1",
} as const;

function partition(
  annotation: string | undefined,
  targetOptions: Record<string, unknown> | undefined,
  backend: "spdk" | "kernel" = "spdk",
  deleting = false,
): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: {
      name: "pv-1",
      namespace: "distort",
      ...(annotation === undefined ? {} : { annotations: { [ROTATE_KEYS_ANNOTATION]: annotation } }),
      ...(deleting ? { deletionTimestamp: "2026-12-02T00:00:00Z" } : {}),
    },
    spec: {
      sizeBytes: 1 << 30,
      backend,
      volumeManager: "partition",
      ...(targetOptions ? { targetOptions } : {}),
    },
  } as NVMePartition;
}

test.each([
  ["no annotation", partition(undefined, { dhchap }), { action: "none" }],
  ["an empty annotation", partition("", { dhchap }), { action: "none" }],
  ["a partition being deleted", partition("2", { dhchap }, "spdk", true), { action: "none" }],
  [
    "per-volume keys on SPDK",
    partition("2", { dhchap }),
    { action: "rotate", generation: "2", secretName: "dhchap-pv-1" },
  ],
])("%s", (_what, p, want) => {
  expect(decideRotation(p)).toEqual(want as ReturnType<typeof decideRotation>);
});

test("refused with a reason: no keys, the operator's own Secret, per-host nvmet keys", () => {
  const none = decideRotation(partition("1", { transport: "tcp" }));
  const ref = decideRotation(partition("1", { dhchapSecretRef: { name: "mine", key: "k" } }));
  const kernel = decideRotation(partition("1", { dhchap }, "kernel"));
  for (const d of [none, ref, kernel])
    expect(d).toMatchObject({ action: "refuse", reason: "KeyRotationUnsupported" });
  expect(none).toMatchObject({ message: "the volume has no DH-HMAC-CHAP keys to rotate" });
  expect(ref).toMatchObject({ message: expect.stringContaining("operator's Secret mine") });
  expect(kernel).toMatchObject({ message: expect.stringContaining("per host") });
});
