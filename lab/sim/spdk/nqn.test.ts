// NQN validation against the cases SPDK v25.05.1 accepted and refused.
import { expect, test } from "bun:test";
import { isValidNqn } from "./nqn.ts";

test("NQN validation follows SPDK: real UUIDs in the uuid form, reverse domains otherwise", () => {
  expect(isValidNqn("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555")).toBe(true);
  expect(isValidNqn("nqn.2014-08.org.nvmexpress:uuid:allowed-host-0001")).toBe(false);
  expect(isValidNqn("nqn.2016-06.io.spdk:host-allowed")).toBe(true);
  expect(isValidNqn("nqn.2026-02.io.distort:volume-abc")).toBe(true);
  expect(isValidNqn("nqn.2014-08.org.nvmexpress.discovery")).toBe(true);
  expect(isValidNqn("not-a-valid-nqn")).toBe(false);
  expect(isValidNqn("nqn.2016-06.io.spdk")).toBe(false); // no ':'
  expect(isValidNqn("nqn.2016-06.io.spdk:")).toBe(false); // empty user part
  expect(isValidNqn("nqn.2016-06.1io.spdk:x")).toBe(false); // label starts with a digit
  expect(isValidNqn("nqn.2016-06.io-.spdk:x")).toBe(false); // hyphen before a dot
  expect(isValidNqn(`nqn.2016-06.io.spdk:${"x".repeat(220)}`)).toBe(false); // over 223 bytes
});
