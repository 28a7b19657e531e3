// NVMeDevice names: readable node prefix + SHA-256 suffix over (node, serial); always a DNS-1123
// label of at most 63 characters, whatever the node name or serial looks like.
import { expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { NAME_HASH_HEX, nvmeDeviceName } from "./device-name.ts";

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

test.each([
  ["plain", "node-a", "S4EWNX0R123456", "node-a"],
  ["fqdn node", "worker-1.rack3.example.com", "S4EW", "worker-1-rack3-example-com"],
  ["upper case and underscores", "Node_A", "X", "node-a"],
  ["accents keep their letters", "nöde-Ä", "X", "node-a"],
  ["letters without an ASCII form drop out", "nöde-ß", "X", "node"],
  ["cjk only", "節点", "X", "node"],
  ["leading and trailing junk", "--.node.--", "X", "node"],
  ["empty node name", "", "X", "node"],
  ["long node name cut on a boundary", `${"a".repeat(39)}-${"b".repeat(30)}`, "X", "a".repeat(39)],
  ["serial with spaces", "node-a", "  S4EW NX0R 123  ", "node-a"],
  ["serial with slashes", "node-a", "a/b/../c", "node-a"],
  ["unicode serial", "node-a", "シリアル№1", "node-a"],
  ["serial with quotes and nul", "node-a", 'x"\u0000y', "node-a"],
])("%s", (_name, node, serial, prefix) => {
  const name = nvmeDeviceName(node, serial);
  expect(name).toMatch(DNS1123_LABEL);
  expect(name.length).toBeLessThanOrEqual(63);
  expect(name.startsWith(`${prefix}-`)).toBe(true);
  const digest = createHash("sha256")
    .update(JSON.stringify([node, serial]))
    .digest("hex");
  expect(name.endsWith(digest.slice(0, NAME_HASH_HEX))).toBe(true);
  expect(nvmeDeviceName(node, serial)).toBe(name); // deterministic across restarts
});

test("distinct for pairs whose readable prefixes or naive concatenations coincide", () => {
  const pairs: [string, string][] = [
    ["node-a", "S1"],
    ["node-a", "S2"],
    ["node.a", "S1"], // same prefix as node-a
    ["Node-A", "S1"], // same prefix as node-a
    ["node-a", "S1 "], // the serial is exact: padding is not trimmed here
    ["node-a1", ""],
    ["node-a", "1"],
    ["a,b", "c"],
    ["a", "b,c"],
  ];
  const names = new Set(pairs.map(([n, s]) => nvmeDeviceName(n, s)));
  expect(names.size).toBe(pairs.length);
});

test("the serial never shows in the name", () => {
  expect(nvmeDeviceName("node-a", "secretserial42")).not.toContain("secretserial42");
});
