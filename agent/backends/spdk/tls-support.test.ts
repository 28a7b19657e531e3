// The TLS gate on SPDK versions: v25.05.1 as the real target reports it (v25.05.1.jsonl seq 5) is
// refused with the reason, v26.01 and a declared backport are not.
import { expect, test } from "bun:test";
import { tlsSupport } from "./tls-support.ts";

const V25 = {
  version: "SPDK v25.05.1 git sha1 44b23be7c3",
  fields: { major: 25, minor: 5, patch: 1, suffix: "", commit: "44b23be7c3" },
};
const V26 = {
  version: "SPDK v26.01 git sha1 0a1b2c3d4e",
  fields: { major: 26, minor: 1, patch: 0, suffix: "", commit: "0a1b2c3d4e" },
};

test("v25.05.1 is refused, naming its version and the fix", () => {
  const r = tlsSupport(V25, false);
  expect(r.ok).toBe(false);
  if (!r.ok) {
    expect(r.why).toContain("SPDK v25.05.1 git sha1 44b23be7c3");
    expect(r.why).toContain("197ff0c9a5");
    expect(r.why).toContain("DISTORT_SPDK_TLS_SALT_FIX");
  }
});

test("v26.01 and later, a build at the fix commit, or a declared backport pass", () => {
  expect(tlsSupport(V26, false)).toEqual({ ok: true });
  expect(tlsSupport({ ...V26, fields: { ...V26.fields, major: 27, minor: 0 } }, false)).toEqual({ ok: true });
  expect(tlsSupport({ ...V25, fields: { ...V25.fields, commit: "197ff0c9a5" } }, false)).toEqual({
    ok: true,
  });
  expect(tlsSupport(V25, true)).toEqual({ ok: true });
  expect(tlsSupport({ ...V25, fields: { ...V25.fields, major: 26, minor: 0 } }, false).ok).toBe(false);
});
