// Table tests for NQN validation: the forms the kernel target accepts and each rule it enforces.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../../lib/errors.ts";
import { DISCOVERY_NQN, NQN_MAX_BYTES, validateNqn } from "./nqn.ts";

const UUID = "6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";

describe("validateNqn", () => {
  test.each([
    "nqn.2026-02.io.distort:volume-vol-3f2a9c",
    "nqn.2016-06.io.spdk:host-allowed",
    `nqn.2014-08.org.nvmexpress:uuid:${UUID}`,
    `nqn.2014-08.org.nvmexpress:uuid:${UUID.toUpperCase()}`,
    "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
    "nqn.2024-12.localdomain:host.a_b-c",
  ])("accepts %s", (nqn) => {
    expect(validateNqn(nqn, "host")).toBe(nqn);
  });

  test.each([
    ["", "is empty"],
    ["iqn.2026-02.io.distort:x", "not of the form"],
    ["nqn.26-02.io.distort:x", "not of the form"],
    ["nqn.2026-13.io.distort:x", "month"],
    ["nqn.2026-00.io.distort:x", "month"],
    ["nqn.2026-02.io.distort", "not of the form"],
    ["nqn.2026-02.io.distort:", "not of the form"],
    ["nqn.2026-02.9io.distort:x", "not of the form"],
    ["nqn.2026-02.io.-distort:x", "not of the form"],
    ["nqn.2026-02.io.distort:a/b", "slash"],
    ["nqn.2026-02.io.distort:a b", "whitespace"],
    ["nqn.2026-02.io.distort:a\tb", "whitespace"],
    ["nqn.2014-08.org.nvmexpress:uuid:allowed-host-0001", "real UUID"],
    [`nqn.2014-08.org.nvmexpress:uuid:${UUID}x`, "real UUID"],
    [DISCOVERY_NQN, "discovery"],
    [`nqn.2026-02.io.distort:${"x".repeat(NQN_MAX_BYTES)}`, "bytes long"],
    // 2-byte characters: 112 of them alone exceed 223 bytes though the string is short.
    [`nqn.2026-02.io.distort:${"é".repeat(105)}`, "bytes long"],
  ])("rejects %j (%s)", (nqn, why) => {
    let err: unknown;
    try {
      validateNqn(nqn, "subsystem");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    expect((err as StorageError).message).toContain(why);
  });

  test("the byte limit is exactly 223", () => {
    const prefix = "nqn.2026-02.io.distort:";
    expect(validateNqn(prefix + "x".repeat(NQN_MAX_BYTES - prefix.length), "host")).toHaveLength(223);
    expect(() => validateNqn(prefix + "x".repeat(NQN_MAX_BYTES - prefix.length + 1), "host")).toThrow(
      "224 bytes",
    );
  });
});
