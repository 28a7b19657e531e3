// Request fingerprints: equal requests match, any defining difference does not, topology apart.
import { expect, test } from "bun:test";
import {
  Annotations,
  canonicalJson,
  compareFingerprints,
  fingerprintOf,
  readRecord,
  type VolumeRecord,
} from "./fingerprint.ts";

const base: VolumeRecord = {
  v: 1,
  sizeBytes: 1 << 30,
  params: { backend: "spdk", volumeManager: "partition", transport: "rdma" },
  capabilities: [{ access: "mount", fsType: "ext4", mode: "SINGLE_NODE_WRITER" }],
};
const zoneA = { requisite: [{ segments: { zone: "a" } }, { segments: { zone: "b" } }] };

test("canonical JSON ignores key order and undefined members", () => {
  expect(canonicalJson({ b: 1, a: { d: undefined, c: [2, { z: 1, y: 2 }] } })).toBe(
    '{"a":{"c":[2,{"y":2,"z":1}]},"b":1}',
  );
});

test("the same request gives the same fingerprint, whatever the requisite order", () => {
  const reordered = { requisite: [{ segments: { zone: "b" } }, { segments: { zone: "a" } }] };
  expect(fingerprintOf(base, zoneA)).toBe(fingerprintOf({ ...base }, reordered));
  expect(compareFingerprints(fingerprintOf(base, zoneA), fingerprintOf(base, reordered))).toBe("same");
});

const variants: [string, VolumeRecord][] = [
  ["capacity", { ...base, sizeBytes: 2 << 30 }],
  ["backend", { ...base, params: { ...base.params, backend: "kernel", volumeManager: "partition" } }],
  ["transport", { ...base, params: { ...base.params, transport: "tcp" } }],
  ["reconnect setting", { ...base, params: { ...base.params, ctrlLossTmo: 5 } }],
  ["capability", { ...base, capabilities: [{ access: "block", mode: "SINGLE_NODE_WRITER" }] }],
  ["content source", { ...base, source: { kind: "volume", id: "x" } }],
];
for (const [what, other] of variants) {
  test(`a different ${what} is a different request`, () => {
    expect(compareFingerprints(fingerprintOf(base, zoneA), fingerprintOf(other, zoneA))).toBe("different");
  });
}

test("only the topology half differs when only the topology does", () => {
  const stored = fingerprintOf(base, zoneA);
  expect(compareFingerprints(stored, fingerprintOf(base, { requisite: [{ segments: { zone: "c" } }] }))).toBe(
    "topology-differs",
  );
  expect(compareFingerprints(stored, fingerprintOf(base, undefined))).toBe("topology-differs");
  const preferredSwapped = fingerprintOf(base, {
    preferred: [{ segments: { zone: "b" } }, { segments: { zone: "a" } }],
  });
  expect(compareFingerprints(fingerprintOf(base, { preferred: zoneA.requisite }), preferredSwapped)).toBe(
    "topology-differs",
  );
});

test("missing or foreign stored values never match", () => {
  const want = fingerprintOf(base, undefined);
  expect(compareFingerprints(undefined, want)).toBe("different");
  expect(compareFingerprints("garbage", want)).toBe("different");
  expect(compareFingerprints(want.replace(/^v1/, "v0"), want)).toBe("different");
});

test("the stored record reads back; a broken one reads as absent", () => {
  expect(readRecord({ [Annotations.request]: canonicalJson(base) })).toEqual(base);
  expect(readRecord({ [Annotations.request]: "{not json" })).toBeUndefined();
  expect(readRecord({ [Annotations.request]: '{"v":2}' })).toBeUndefined();
  expect(readRecord(undefined)).toBeUndefined();
});
