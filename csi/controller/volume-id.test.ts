// Volume ids, partition names and attachment names: formats, limits, and what parses.
import { expect, test } from "bun:test";
import {
  attachmentNameFor,
  formatVolumeId,
  MAX_NAMESPACE_LENGTH,
  MAX_VOLUME_ID_BYTES,
  parseVolumeId,
  partitionNameFor,
} from "./volume-id.ts";

const UID = "0f8fad5b-d9cb-469f-a165-70867728950e";

test("partition names: PV-like names verbatim, anything else hashed", () => {
  expect(partitionNameFor("pvc-0f8fad5b-d9cb-469f-a165-70867728950e")).toBe(
    "pvc-0f8fad5b-d9cb-469f-a165-70867728950e",
  );
  expect(partitionNameFor("data")).toBe("data");
  for (const odd of [
    "Upper",
    "has space",
    "a".repeat(41),
    "x".repeat(128),
    "-lead",
    "trail-",
    "dots.in.it",
    "ünï",
  ]) {
    const n = partitionNameFor(odd);
    expect(n).toMatch(/^csi-[0-9a-f]{24}$/);
    expect(partitionNameFor(odd)).toBe(n);
  }
  expect(partitionNameFor("Upper")).not.toBe(partitionNameFor("upper "));
});

test("ids round-trip and stay within 128 bytes for the longest namespace", () => {
  const ref = { namespace: "a".repeat(MAX_NAMESPACE_LENGTH), name: "b".repeat(40), uid: UID };
  const id = formatVolumeId(ref);
  expect(Buffer.byteLength(id)).toBeLessThanOrEqual(MAX_VOLUME_ID_BYTES);
  expect(parseVolumeId(id)).toEqual(ref);
  expect(formatVolumeId({ namespace: "distort-system", name: "pvc-1", uid: UID })).toBe(
    `distort-system/pvc-1/${UID}`,
  );
  expect(() => formatVolumeId({ namespace: "a".repeat(60), name: "b".repeat(40), uid: UID })).toThrow(
    "exceeds",
  );
});

test("anything this driver never issued does not parse", () => {
  for (const bad of [
    "",
    "fake-volume-id",
    "ns/name",
    `ns/name/${UID}/extra`,
    "ns/name/not-a-uid",
    `NS/name/${UID}`,
    `ns/Name/${UID}`,
    `ns//${UID}`,
    `ns/${"n".repeat(41)}/${UID}`,
    `ns/name/${UID.toUpperCase()}`,
    "x".repeat(200),
  ]) {
    expect(parseVolumeId(bad)).toBeUndefined();
  }
});

test("attachment names: one per UID, never shared between incarnations", () => {
  const a = attachmentNameFor("pvc-1", UID);
  expect(a).toMatch(/^pvc-1-[0-9a-f]{10}$/);
  expect(attachmentNameFor("pvc-1", UID)).toBe(a);
  expect(attachmentNameFor("pvc-1", "11111111-2222-4333-8444-555555555555")).not.toBe(a);
  expect(attachmentNameFor("b".repeat(40), UID).length).toBeLessThanOrEqual(63);
});
