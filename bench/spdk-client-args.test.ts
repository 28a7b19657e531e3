// Unit tests of the spdk-client bench's command line: sequences, and an external target's socket,
// base bdev and pid, with the combinations it refuses.
import { describe, expect, test } from "bun:test";
import { parseBenchArgs } from "./spdk-client.bench.ts";

describe("parseBenchArgs", () => {
  test("without arguments the bench starts the emulator and runs 2000 sequences", () => {
    expect(parseBenchArgs([])).toEqual({ sequences: 2000 });
  });

  test("an external target with its base bdev and pid, sequences anywhere", () => {
    expect(
      parseBenchArgs(["--socket", "/var/tmp/spdk.sock", "500", "--base-bdev", "Nvme0n1", "--pid", "42"]),
    ).toEqual({
      sequences: 500,
      socket: "/var/tmp/spdk.sock",
      baseBdev: "Nvme0n1",
      pid: 42,
    });
  });

  test("refuses what it cannot use", () => {
    expect(() => parseBenchArgs(["--socket"])).toThrow("--socket needs a value");
    expect(() => parseBenchArgs(["--socket", "spdk.sock"])).toThrow("absolute path");
    expect(() => parseBenchArgs(["--base-bdev", "Malloc0"])).toThrow("only apply with --socket");
    expect(() => parseBenchArgs(["0"])).toThrow("positive integer");
    expect(() => parseBenchArgs(["10", "20"])).toThrow("unknown argument 20");
    expect(() => parseBenchArgs(["--socket", "/s", "--pid", "x"])).toThrow("process id");
  });
});
