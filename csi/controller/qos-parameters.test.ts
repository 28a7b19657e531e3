// Table tests of the qos.* parameter parser shared by StorageClass and VolumeAttributesClass maps.
import { describe, expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { completeQos, parseMutableParameters, parseQos, requireQosBackend } from "./qos-parameters.ts";

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    return (err as StorageError).message;
  }
  throw new Error("expected INVALID_ARGUMENT");
}

describe("parseQos", () => {
  test("the four keys map to the four spec.qos fields; other keys are left alone", () => {
    expect(
      parseQos(
        { "qos.rwIops": "5000", "qos.rwMBps": "200", "qos.rMBps": "0", "qos.wMBps": "40", backend: "spdk" },
        "parameter",
      ),
    ).toEqual({ rwIosPerSec: 5000, rwMBytesPerSec: 200, rMBytesPerSec: 0, wMBytesPerSec: 40 });
    expect(parseQos({ backend: "spdk" }, "parameter")).toBeUndefined();
  });

  const bad: [string, Record<string, string>, string][] = [
    ["IOPS not a multiple of 1000 (SPDK would round it up)", { "qos.rwIops": "1500" }, "multiple of 1000"],
    ["IOPS below the step", { "qos.rwIops": "999" }, "multiple of 1000"],
    ["a fraction", { "qos.rMBps": "1.5" }, "whole number"],
    ["a negative value", { "qos.wMBps": "-10" }, "whole number"],
    ["not a number", { "qos.rwMBps": "fast" }, "whole number"],
    ["empty", { "qos.rwMBps": "" }, "whole number"],
    ["above the maximum", { "qos.rwMBps": "1000001" }, "above the maximum"],
    ["IOPS above the maximum", { "qos.rwIops": "2000000000" }, "above the maximum"],
  ];
  for (const [name, raw, why] of bad) {
    test(`refused: ${name}`, () => {
      const msg = refusal(() => parseQos(raw, "parameter"));
      expect(msg).toContain(why);
      expect(msg).toContain(Object.keys(raw)[0] as string);
    });
  }
});

describe("parseMutableParameters", () => {
  test("only qos.* keys are mutable, and the message lists them", () => {
    const msg = refusal(() => parseMutableParameters({ XXX_FakeKey: "XXX_FakeValue" }));
    expect(msg).toContain('"XXX_FakeKey"');
    expect(msg).toContain("qos.rwIops, qos.rwMBps, qos.rMBps, qos.wMBps");
    expect(refusal(() => parseMutableParameters({ "qos.rMBps": "5", backend: "kernel" }))).toContain(
      '"backend"',
    );
  });

  test("an empty map is no change", () => {
    expect(parseMutableParameters({})).toBeUndefined();
  });
});

describe("requireQosBackend", () => {
  test("the kernel backend takes no limit above 0, and says why", () => {
    expect(refusal(() => requireQosBackend("kernel", { rwIosPerSec: 1000 }, "parameters"))).toContain(
      "no per-namespace rate limits",
    );
    expect(() =>
      requireQosBackend("kernel", { rwIosPerSec: 0, rMBytesPerSec: 0 }, "parameters"),
    ).not.toThrow();
    expect(() => requireQosBackend("kernel", undefined, "parameters")).not.toThrow();
    expect(() => requireQosBackend("spdk", { wMBytesPerSec: 10 }, "parameters")).not.toThrow();
  });
});

test("completeQos fills every absent limit with 0", () => {
  expect(completeQos({ rMBytesPerSec: 3 })).toEqual({
    rwIosPerSec: 0,
    rwMBytesPerSec: 0,
    rMBytesPerSec: 3,
    wMBytesPerSec: 0,
  });
  expect(completeQos(undefined)).toEqual({
    rwIosPerSec: 0,
    rwMBytesPerSec: 0,
    rMBytesPerSec: 0,
    wMBytesPerSec: 0,
  });
});
