// spdk_get_version parsing and the minimum-version comparison.
import { expect, test } from "bun:test";
import { formatSpdkVersion, MIN_SPDK_VERSION, parseSpdkVersion, spdkVersionSupported } from "./version.ts";

test("parses the reply of v25.05.1 and spells it as SPDK does", () => {
  const got = parseSpdkVersion({
    version: "SPDK v25.05.1 git sha1 44b23be7c3",
    fields: { major: 25, minor: 5, patch: 1, suffix: "", commit: "44b23be7c3" },
  });
  expect(got).toEqual({ major: 25, minor: 5, patch: 1, text: "SPDK v25.05.1 git sha1 44b23be7c3" });
  expect(formatSpdkVersion(got as NonNullable<typeof got>)).toBe("v25.05.1");
  expect(parseSpdkVersion({ version: "SPDK v25.05" })).toBeUndefined();
  expect(parseSpdkVersion("v25.05.1")).toBeUndefined();
});

test.each([
  [25, 5, 0, true],
  [25, 5, 1, true],
  [25, 9, 0, true],
  [26, 1, 0, true],
  [25, 1, 9, false],
  [24, 9, 0, false],
])("v%d.%d.%d supported: %p", (major, minor, patch, want) => {
  expect(spdkVersionSupported({ major, minor, patch })).toBe(want);
});

test("the minimum itself is supported", () => {
  expect(spdkVersionSupported(MIN_SPDK_VERSION)).toBe(true);
});
