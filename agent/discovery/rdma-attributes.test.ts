// Parsers of infiniband sysfs attributes and `ip -j addr` output.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { type PortState, parseIpAddrJson, parsePortState, parseRateMbps } from "./rdma-attributes.ts";

test.each<[string, PortState]>([
  ["4: ACTIVE\n", "ACTIVE"],
  ["1: DOWN", "DOWN"],
  ["2: INIT", "INIT"],
  ["3: ARMED", "ARMED"],
  ["5: ACTIVE_DEFER", "ACTIVE_DEFER"],
  ["ACTIVE", "UNKNOWN"],
  ["", "UNKNOWN"],
  ["9: SOMETHING", "UNKNOWN"],
])("state %p -> %p", (text, want) => {
  expect(parsePortState(text)).toBe(want);
});

test.each<[string, number | undefined]>([
  ["100 Gb/sec (4X EDR)\n", 100_000],
  ["200 Gb/sec (4X HDR)", 200_000],
  ["56 Gb/sec (4X FDR)", 56_000],
  ["2.5 Gb/sec (1X SDR)", 2_500],
  ["25 Gb/sec (1X EDR)", 25_000],
  ["", undefined],
  ["invalid", undefined],
])("rate %p -> %p", (text, want) => {
  expect(parseRateMbps(text)).toBe(want);
});

// Shape of iproute2's JSON, including IPv6 flags that make an address unusable.
const IP_JSON = JSON.stringify([
  {
    ifindex: 4,
    ifname: "ens1f0",
    flags: ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
    mtu: 9000,
    operstate: "UP",
    link_type: "ether",
    address: "b8:ce:f6:00:00:01",
    addr_info: [
      { family: "inet", local: "192.168.100.10", prefixlen: 24, scope: "global", label: "ens1f0" },
      { family: "inet", local: "192.168.100.11", prefixlen: 24, secondary: true, scope: "global" },
      { family: "inet6", local: "2001:db8::10", prefixlen: 64, scope: "global", tentative: true },
      {
        family: "inet6",
        local: "2001:db8::11",
        prefixlen: 64,
        scope: "global",
        deprecated: true,
        dadfailed: true,
      },
      { family: "inet6", local: "fe80::bace:f6ff:fe00:1", prefixlen: 64, scope: "link" },
    ],
  },
]);

test("ip -j addr: addresses with their flags", () => {
  const iface = parseIpAddrJson(IP_JSON);
  expect(iface?.name).toBe("ens1f0");
  expect(iface?.operstate).toBe("UP");
  expect(
    iface?.addresses.map((a) => [a.address, a.scope, a.secondary, a.tentative, a.deprecated, a.dadFailed]),
  ).toEqual([
    ["192.168.100.10", "global", false, false, false, false],
    ["192.168.100.11", "global", true, false, false, false],
    ["2001:db8::10", "global", false, true, false, false],
    ["2001:db8::11", "global", false, false, true, true],
    ["fe80::bace:f6ff:fe00:1", "link", false, false, false, false],
  ]);
});

test("ip -j addr: an interface without addresses, and an empty answer", () => {
  expect(parseIpAddrJson(JSON.stringify([{ ifname: "ib0", operstate: "DOWN" }]))).toEqual({
    name: "ib0",
    operstate: "DOWN",
    addresses: [],
  });
  expect(parseIpAddrJson("[]")).toBeUndefined();
});

test.each(['Device "x" does not exist.', "{}", JSON.stringify([{ addr_info: [] }])])("rejects %p", (text) => {
  expect(() => parseIpAddrJson(text)).toThrow(StorageError);
});
