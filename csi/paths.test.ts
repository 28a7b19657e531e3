// Path validation table: every shape of non-canonical path is refused with a reason, canonical ones pass.
import { expect, test } from "bun:test";
import { StorageError } from "../lib/errors.ts";
import { MAX_PATH_BYTES, pathProblem, requireCanonicalPath } from "./paths.ts";

test.each<[string, string]>([
  ["", "is empty"],
  ["relative/path", "is not absolute"],
  ["./var/lib", "is not absolute"],
  ["/", "is the root directory"],
  ["/var/lib/kubelet/", "ends with a separator"],
  ["/var//lib", "contains an empty segment (//)"],
  ["//var/lib", "contains an empty segment (//)"],
  ["/var/./lib", 'contains a "." segment'],
  ["/var/lib/..", 'contains a ".." segment'],
  ["/var/lib/../../etc/shadow", 'contains a ".." segment'],
  ["/var/lib\0/x", "contains a NUL byte"],
  [`/${"a".repeat(MAX_PATH_BYTES)}`, `is longer than ${MAX_PATH_BYTES} bytes`],
])("refuses %j: %s", (path, want) => {
  expect(pathProblem(path)).toBe(want);
  expect(() => requireCanonicalPath("target_path", path)).toThrow(`target_path ${want}`);
});

test.each([
  "/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/0f3e/globalmount",
  "/var/lib/kubelet/pods/4b9c/volumes/kubernetes.io~csi/pvc-1/mount",
  "/a",
  "/dir/..hidden/.x/...",
  "/with space/and:colon",
])("accepts %s", (path) => {
  expect(pathProblem(path)).toBeUndefined();
  expect(requireCanonicalPath("staging_target_path", path)).toBe(path);
});

test("the error is an invalid-argument StorageError naming the field", () => {
  try {
    requireCanonicalPath("volume_path", "x");
    throw new Error("did not throw");
  } catch (err) {
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    expect((err as StorageError).details).toEqual({ field: "volume_path" });
  }
});
