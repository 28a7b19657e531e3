// RDMA endpoint selection: pure address and port ranking tables, then the production
// NetworkSource reading simulated infiniband sysfs trees and `ip -j addr` output.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { buildSysfs, type SimRdmaPort, type SimSysfs } from "../../lab/sim/sysfs/build-sysfs.ts";
import { type ScratchRoot, scratchRoot } from "../../lab/sim/sysfs/scratch-root.ts";
import { hostNetworkSource, type NetworkSource, type RdmaPort } from "./network-source.ts";
import type { InterfaceAddress, NetworkInterface } from "./rdma-attributes.ts";
import { findRdmaEndpoint, pickAddress, rankPorts } from "./rdma-endpoint.ts";

const addr = (address: string, extra: Partial<InterfaceAddress> = {}): InterfaceAddress => ({
  family: address.includes(":") ? "inet6" : "inet",
  address,
  prefixLength: 24,
  scope: "global",
  tentative: false,
  dadFailed: false,
  deprecated: false,
  secondary: false,
  ...extra,
});
const iface = (addresses: InterfaceAddress[], operstate = "UP"): NetworkInterface => ({
  name: "ens1f0",
  operstate,
  addresses,
});

test.each<[string, NetworkInterface, string | undefined]>([
  ["global IPv4", iface([addr("192.168.100.10")]), "192.168.100.10"],
  ["IPv4 preferred over IPv6", iface([addr("2001:db8::10"), addr("192.168.100.10")]), "192.168.100.10"],
  [
    "primary IPv4 over secondary",
    iface([addr("10.0.0.2", { secondary: true }), addr("10.0.0.1")]),
    "10.0.0.1",
  ],
  [
    "global IPv6 when there is no IPv4",
    iface([addr("fe80::1", { scope: "link" }), addr("2001:db8::10")]),
    "2001:db8::10",
  ],
  ["link-local only", iface([addr("fe80::1", { scope: "link" })]), undefined],
  ["link-local with global scope is still link-local", iface([addr("fe80::1")]), undefined],
  ["tentative IPv6", iface([addr("2001:db8::10", { tentative: true })]), undefined],
  ["duplicate address detected", iface([addr("2001:db8::10", { dadFailed: true })]), undefined],
  ["deprecated IPv6", iface([addr("2001:db8::10", { deprecated: true })]), undefined],
  ["IPv4-mapped IPv6 is not accepted by the API", iface([addr("::ffff:10.0.0.1")]), undefined],
  ["loopback and APIPA", iface([addr("127.0.0.1"), addr("169.254.1.1")]), undefined],
  ["host scope", iface([addr("10.0.0.1", { scope: "host" })]), undefined],
  ["interface down", iface([addr("192.168.100.10")], "DOWN"), undefined],
  [
    "operstate UNKNOWN (virtual links) is usable",
    iface([addr("192.168.100.10")], "UNKNOWN"),
    "192.168.100.10",
  ],
  ["no addresses", iface([]), undefined],
])("pickAddress: %s", (_name, i, want) => {
  expect(pickAddress(i)).toBe(want);
});

const port = (device: string, p: number, extra: Partial<RdmaPort> = {}): RdmaPort => ({
  device,
  port: p,
  state: "ACTIVE",
  rateMbps: 100_000,
  linkLayer: "Ethernet",
  netdevs: [`${device}-net`],
  ...extra,
});

test("rankPorts: active ports with a netdev, fastest first, then by device and port", () => {
  const ranked = rankPorts([
    port("mlx5_1", 1),
    port("mlx5_0", 2),
    port("mlx5_0", 1),
    port("mlx5_2", 1, { rateMbps: 200_000 }),
    port("mlx5_3", 1, { state: "DOWN", rateMbps: 400_000 }),
    port("mlx5_4", 1, { netdevs: [] }),
    port("rxe0", 1, { rateMbps: undefined }),
  ]);
  expect(ranked.map((p) => `${p.device}/${p.port}`)).toEqual([
    "mlx5_2/1",
    "mlx5_0/1",
    "mlx5_0/2",
    "mlx5_1/1",
    "rxe0/1",
  ]);
});

let root: ScratchRoot;
let sim: SimSysfs;
beforeAll(async () => {
  root = await scratchRoot("distort-rdma");
  sim = await buildSysfs(root.path, {});
});
afterAll(async () => {
  await root.remove();
});

interface Row {
  name: string;
  rdma: SimRdmaPort[];
  want: { ip: string; netdev: string; device: string; linkSpeedMbps: number } | { reason: string };
}

const rows: Row[] = [
  {
    name: "one RoCE port",
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0", address: "192.168.100.10/24" },
    ],
    want: { ip: "192.168.100.10", netdev: "ens1f0", device: "mlx5_0", linkSpeedMbps: 100_000 },
  },
  {
    name: "the faster of two active ports",
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 25, netdev: "ens1f0", address: "192.168.100.10/24" },
      { device: "mlx5_1", state: "ACTIVE", rateGbps: 200, netdev: "ens2f0", address: "192.168.200.10/24" },
    ],
    want: { ip: "192.168.200.10", netdev: "ens2f0", device: "mlx5_1", linkSpeedMbps: 200_000 },
  },
  {
    name: "a down port is passed over",
    rdma: [
      { device: "mlx5_0", state: "DOWN", rateGbps: 200, netdev: "ens1f0", address: "192.168.100.10/24" },
      { device: "mlx5_1", state: "ACTIVE", rateGbps: 100, netdev: "ens2f0", address: "192.168.200.10/24" },
    ],
    want: { ip: "192.168.200.10", netdev: "ens2f0", device: "mlx5_1", linkSpeedMbps: 100_000 },
  },
  {
    name: "InfiniBand port: IPoIB netdev found through the PCI function",
    rdma: [
      {
        device: "mlx5_0",
        state: "ACTIVE",
        rateGbps: 56,
        linkLayer: "InfiniBand",
        netdev: "ib0",
        address: "10.10.0.5/16",
      },
    ],
    want: { ip: "10.10.0.5", netdev: "ib0", device: "mlx5_0", linkSpeedMbps: 56_000 },
  },
  {
    name: "IPv6-only port",
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0", address: "2001:db8::10/64" },
    ],
    want: { ip: "2001:db8::10", netdev: "ens1f0", device: "mlx5_0", linkSpeedMbps: 100_000 },
  },
  {
    name: "an active port without an address falls through to the next",
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 200, netdev: "ens1f0" },
      { device: "mlx5_1", state: "ACTIVE", rateGbps: 100, netdev: "ens2f0", address: "192.168.200.10/24" },
    ],
    want: { ip: "192.168.200.10", netdev: "ens2f0", device: "mlx5_1", linkSpeedMbps: 100_000 },
  },
  { name: "no RDMA hardware", rdma: [], want: { reason: "NoRdmaDevice" } },
  {
    name: "every port down",
    rdma: [
      { device: "mlx5_0", state: "DOWN", rateGbps: 100, netdev: "ens1f0", address: "192.168.100.10/24" },
    ],
    want: { reason: "NoActiveRdmaPort" },
  },
  {
    name: "active port with only a link-local address",
    rdma: [{ device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0" }],
    want: { reason: "NoUsableAddress" },
  },
];

test.each(rows)("hostNetworkSource on a simulated host: $name", async (row) => {
  await sim.rebuild({ rdma: row.rdma });
  const r = await findRdmaEndpoint(hostNetworkSource(sim.fs, sim.exec));
  if ("reason" in row.want) {
    expect(r.ok).toBe(false);
    expect(!r.ok && r.reason).toBe(row.want.reason);
  } else {
    expect(r.ok).toBe(true);
    expect(r.ok && r.endpoint).toMatchObject({ ...row.want, transport: "rdma" });
  }
});

test("the production source reads state, rate, link layer and netdevs from sysfs", async () => {
  await sim.rebuild({
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0", address: "192.168.100.10/24" },
      { device: "mlx5_1", port: 2, state: "INIT", rateGbps: 2.5, linkLayer: "InfiniBand", netdev: "ib1" },
    ],
  });
  const src = hostNetworkSource(sim.fs, sim.exec);
  expect(await src.rdmaPorts()).toEqual([
    {
      device: "mlx5_0",
      port: 1,
      state: "ACTIVE",
      rateMbps: 100_000,
      linkLayer: "Ethernet",
      netdevs: ["ens1f0"],
    },
    { device: "mlx5_1", port: 2, state: "INIT", rateMbps: 2_500, linkLayer: "InfiniBand", netdevs: ["ib1"] },
  ]);
  expect(await src.interfaceAddresses("nosuch0")).toBeUndefined();
  expect((await src.interfaceAddresses("ens1f0"))?.addresses.map((a) => a.address)).toEqual([
    "192.168.100.10",
    "fe80::bace:f6ff:fe00:1",
  ]);
});

test.each<[string, NetworkSource, string]>([
  [
    "sysfs unreadable",
    { rdmaPorts: () => Promise.reject(new Error("EIO")), interfaceAddresses: async () => undefined },
    "NetworkDiscoveryFailed",
  ],
  [
    "ip fails for every candidate",
    {
      rdmaPorts: async () => [port("mlx5_0", 1)],
      interfaceAddresses: () => Promise.reject(new Error("ip: timed out")),
    },
    "NoUsableAddress",
  ],
  [
    "netdev vanished",
    { rdmaPorts: async () => [port("mlx5_0", 1)], interfaceAddresses: async () => undefined },
    "NoUsableAddress",
  ],
])("failures become reasons: %s", async (_name, src, reason) => {
  const r = await findRdmaEndpoint(src);
  expect(r).toMatchObject({ ok: false, reason });
});

test("ip failing with another error is reported, not mistaken for a missing interface", async () => {
  const src = hostNetworkSource(sim.fs, {
    run: async () => ({ code: 255, stdout: "", stderr: "RTNETLINK answers: Operation not permitted" }),
  });
  await expect(src.interfaceAddresses("ens1f0")).rejects.toThrow(/Operation not permitted/);
});
