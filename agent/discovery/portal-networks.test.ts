// Portal selection by storage network: CIDR parsing (both families, host bits refused), membership,
// and which of a node's addresses become portals in which order.
import { describe, expect, test } from "bun:test";
import { inCidr, parseCidr, portalAddressesIn } from "./portal-networks.ts";
import { type InterfaceAddress, type NetworkInterface, parseIpAddrJsonAll } from "./rdma-attributes.ts";

const addr = (address: string, over: Partial<InterfaceAddress> = {}): InterfaceAddress => ({
  family: address.includes(":") ? "inet6" : "inet",
  address,
  prefixLength: address.includes(":") ? 64 : 24,
  scope: "global",
  tentative: false,
  dadFailed: false,
  deprecated: false,
  secondary: false,
  ...over,
});
const iface = (name: string, addresses: InterfaceAddress[], operstate = "UP"): NetworkInterface => ({
  name,
  operstate,
  addresses,
});

describe("parseCidr / inCidr", () => {
  test("IPv4 and IPv6 networks; membership by prefix only", () => {
    const a = parseCidr("198.18.0.0/16");
    expect([a.family, a.prefix]).toEqual([4, 16]);
    expect(inCidr("198.18.255.7", a)).toBe(true);
    expect(inCidr("198.19.0.1", a)).toBe(false);
    expect(inCidr("fd00::1", a)).toBe(false);
    const b = parseCidr("fd00:1::/64");
    expect(inCidr("fd00:1::abcd", b)).toBe(true);
    expect(inCidr("fd00:1:0:1::1", b)).toBe(false);
    expect(inCidr("198.18.0.1", b)).toBe(false);
    expect(inCidr("10.1.2.3", parseCidr("0.0.0.0/0"))).toBe(true);
    expect(inCidr("10.1.2.3", parseCidr("10.1.2.3/32"))).toBe(true);
    expect(inCidr("10.1.2.4", parseCidr("10.1.2.3/32"))).toBe(false);
  });

  test("refused: no prefix, a bad address, a prefix too long, host bits set (with the network named)", () => {
    expect(() => parseCidr("198.18.0.0")).toThrow(/not a CIDR/);
    expect(() => parseCidr("198.18.0.300/16")).toThrow(/not a CIDR/);
    expect(() => parseCidr("198.18.0.0/33")).toThrow(/longer than 32 bits/);
    expect(() => parseCidr("fd00::/129")).toThrow(/longer than 128 bits/);
    expect(() => parseCidr("198.18.0.5/16")).toThrow(/host bits set \(the network is 198\.18\.0\.0\/16\)/);
    expect(() => parseCidr("fd00::1/64")).toThrow(/host bits set/);
  });
});

describe("portalAddressesIn", () => {
  test("every usable address in the networks, in the networks' order; the rest skipped", () => {
    const ifaces = [
      iface("lo", [addr("127.0.0.1", { scope: "host" })]),
      iface("eth0", [addr("10.0.0.5"), addr("198.18.1.11"), addr("fe80::1", { scope: "link" })]),
      iface("eth1", [addr("198.18.0.11"), addr("198.18.0.12", { tentative: true })]),
      iface("eth2", [addr("198.18.0.13")], "DOWN"),
    ];
    const nets = [parseCidr("198.18.0.0/24"), parseCidr("198.18.1.0/24")];
    expect(portalAddressesIn(ifaces, nets)).toEqual(["198.18.0.11", "198.18.1.11"]);
    // An address in two listed networks is one portal, in the first network's place.
    expect(portalAddressesIn(ifaces, [parseCidr("198.18.1.0/24"), parseCidr("198.18.0.0/16")])).toEqual([
      "198.18.1.11",
      "198.18.0.11",
    ]);
    expect(portalAddressesIn(ifaces, [parseCidr("192.0.2.0/24")])).toEqual([]);
  });

  test("reads what `ip -j addr show` prints for every interface", () => {
    const json = JSON.stringify([
      {
        ifname: "lo",
        operstate: "UNKNOWN",
        addr_info: [{ family: "inet", local: "127.0.0.1", prefixlen: 8, scope: "host" }],
      },
      {
        ifname: "eth0",
        operstate: "UP",
        addr_info: [
          { family: "inet", local: "198.18.0.11", prefixlen: 16, scope: "global" },
          { family: "inet", local: "198.18.1.11", prefixlen: 16, scope: "global", secondary: true },
        ],
      },
    ]);
    const all = parseIpAddrJsonAll(json);
    expect(all.map((i) => i.name)).toEqual(["lo", "eth0"]);
    expect(portalAddressesIn(all, [parseCidr("198.18.0.0/24"), parseCidr("198.18.1.0/24")])).toEqual([
      "198.18.0.11",
      "198.18.1.11",
    ]);
  });
});
