// Tests for port id selection: reuse of an exact listener, adoption of crash leftovers, lowest free id.
import { expect, test } from "bun:test";
import { choosePort, type Listener, MAX_PORT_ID, type ObservedPort } from "./port-registry.ts";

const want: Listener = { trtype: "rdma", adrfam: "ipv4", traddr: "10.0.0.5", trsvcid: "4420" };
const port = (id: number, over: Partial<ObservedPort> = {}): ObservedPort => ({
  id,
  ...want,
  links: 1,
  ...over,
});

test.each<[string, ObservedPort[], ReturnType<typeof choosePort>]>([
  ["no ports: create 1", [], { id: 1, action: "create" }],
  ["exact match is reused even when not linked", [port(4, { links: 0 })], { id: 4, action: "reuse" }],
  ["exact match wins over a lower free id", [port(7)], { id: 7, action: "reuse" }],
  ["several exact matches: the lowest", [port(9), port(3)], { id: 3, action: "reuse" }],
  ["another service port is not a match", [port(1, { trsvcid: "4421" })], { id: 2, action: "create" }],
  ["another transport is not a match", [port(1, { trtype: "tcp" })], { id: 2, action: "create" }],
  ["another address is not a match", [port(1, { traddr: "10.0.0.6" })], { id: 2, action: "create" }],
  [
    "gaps are filled from the bottom",
    [port(1, { traddr: "a" }), port(3, { traddr: "b" })],
    { id: 2, action: "create" },
  ],
  [
    "an unlinked, half-written port is adopted",
    [port(1, { traddr: "x" }), port(2, { links: 0, adrfam: "", traddr: "", trsvcid: "" })],
    { id: 2, action: "adopt" },
  ],
  [
    "a linked port is never adopted, however incomplete it looks",
    [port(1, { links: 1, traddr: "" })],
    { id: 2, action: "create" },
  ],
  [
    "a complete unlinked port for another listener is left alone",
    [port(1, { links: 0, traddr: "10.0.0.9" })],
    { id: 2, action: "create" },
  ],
])("%s", (_name, ports, expected) => {
  expect(choosePort(ports, want)).toEqual(expected);
  // Deterministic: the input order does not matter.
  expect(choosePort([...ports].reverse(), want)).toEqual(expected);
});

test("all ids taken is exhausted", () => {
  const ports = Array.from({ length: MAX_PORT_ID }, (_, i) => port(i + 1, { traddr: `x${i}` }));
  expect(() => choosePort(ports, want)).toThrow(expect.objectContaining({ kind: "exhausted" }));
});
