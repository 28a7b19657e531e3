// Table test of the one StorageError -> gRPC code mapping, and of what passes through unchanged.

import { describe, expect, test } from "bun:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorKind, StorageError } from "../errors";
import { codeName, KIND_TO_CODE, toConnectError } from "./status";

const TABLE: [ErrorKind, Code, string][] = [
  ["invalid", Code.InvalidArgument, "INVALID_ARGUMENT"],
  ["not-found", Code.NotFound, "NOT_FOUND"],
  ["already-exists", Code.AlreadyExists, "ALREADY_EXISTS"],
  ["precondition", Code.FailedPrecondition, "FAILED_PRECONDITION"],
  ["busy", Code.Aborted, "ABORTED"],
  ["conflict", Code.Aborted, "ABORTED"],
  ["exhausted", Code.ResourceExhausted, "RESOURCE_EXHAUSTED"],
  ["out-of-range", Code.OutOfRange, "OUT_OF_RANGE"],
  ["unavailable", Code.Unavailable, "UNAVAILABLE"],
  ["timeout", Code.DeadlineExceeded, "DEADLINE_EXCEEDED"],
  ["unimplemented", Code.Unimplemented, "UNIMPLEMENTED"],
  ["internal", Code.Internal, "INTERNAL"],
];

describe("toConnectError", () => {
  for (const [kind, code, name] of TABLE) {
    test(`StorageError ${kind} -> ${name}`, () => {
      const cause = new Error("low level");
      const err = toConnectError(new StorageError(kind, `volume v1: ${kind}`, { cause }));
      expect(err.code).toBe(code);
      expect(codeName(err.code)).toBe(name);
      expect(err.rawMessage).toBe(`volume v1: ${kind}`);
      expect((err.cause as StorageError).kind).toBe(kind);
    });
  }

  test("the table covers every kind exactly once", () => {
    expect(Object.keys(KIND_TO_CODE).sort()).toEqual(TABLE.map(([k]) => k).sort());
  });

  test("a ConnectError thrown by a handler passes through untouched", () => {
    const original = new ConnectError("handler chose this", Code.PermissionDenied);
    expect(toConnectError(original)).toBe(original);
  });

  test("anything else is INTERNAL with its message", () => {
    expect(toConnectError(new TypeError("x is undefined"))).toMatchObject({
      code: Code.Internal,
      rawMessage: "x is undefined",
    });
    expect(toConnectError("a string")).toMatchObject({ code: Code.Internal, rawMessage: "a string" });
  });

  test("codeName of OK", () => {
    expect(codeName(0)).toBe("OK");
  });
});
