// hostAddressCheck: which listen addresses the emulated host may bind.
import { expect, test } from "bun:test";
import { hostAddressCheck } from "./host-addresses.ts";

test("a node given its addresses has those and the wildcards, nothing else", () => {
  const has = hostAddressCheck(["127.0.0.2", "FD00::2"]);
  expect(["127.0.0.2", "fd00::2", "[fd00::2]", "::ffff:127.0.0.2", "0.0.0.0", "::"].map(has)).toEqual([
    true,
    true,
    true,
    true,
    true,
    true,
  ]);
  expect(["127.0.0.1", "127.0.0.3", "10.0.0.2", "fd00::3"].map(has)).toEqual([false, false, false, false]);
});

test("without a list every address is the host's (an emulator standing in for any node)", () => {
  const has = hostAddressCheck();
  expect(["127.0.0.1", "10.20.0.1", "fd00:10::1"].map(has)).toEqual([true, true, true]);
});
