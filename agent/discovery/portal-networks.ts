// Portal addresses chosen by network: DISTORT_PORTAL_NETWORKS names the storage networks (CIDRs) and
// the agent serves on every usable address the node has inside them, one portal per address, so a
// node with an address on each of two storage networks exports every volume on two paths without a
// per-node address list. The first network's address is the primary portal.
import { isIP } from "node:net";
import { StorageError } from "../../lib/errors.ts";
import type { Exec } from "../../lib/exec.ts";
import type { Logger } from "../../lib/log.ts";
import { hostInterfaces } from "./network-source.ts";
import type { NetworkInterface } from "./rdma-attributes.ts";
import { usableAddress } from "./rdma-endpoint.ts";

/** A parsed CIDR: family, the network's bits, the prefix length. */
export interface Cidr {
  readonly text: string;
  readonly family: 4 | 6;
  readonly bits: bigint;
  readonly prefix: number;
}

function ipv4Bits(a: string): bigint {
  return a.split(".").reduce((acc, o) => (acc << 8n) | BigInt(Number(o)), 0n);
}

function ipv6Bits(a: string): bigint {
  let s = a.toLowerCase();
  // An embedded IPv4 tail (::ffff:1.2.3.4) becomes two hex groups.
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (v4?.[1]) {
    const b = ipv4Bits(v4[1]);
    s = `${s.slice(0, -v4[1].length)}${(b >> 16n).toString(16)}:${(b & 0xffffn).toString(16)}`;
  }
  const [head, tail] = s.includes("::") ? (s.split("::") as [string, string]) : [s, undefined];
  const h = head ? head.split(":") : [];
  const t = tail === undefined ? [] : tail ? tail.split(":") : [];
  const groups = tail === undefined ? h : [...h, ...Array(8 - h.length - t.length).fill("0"), ...t];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(Number.parseInt(g || "0", 16)), 0n);
}

function bitsOf(address: string): { family: 4 | 6; bits: bigint } | undefined {
  const f = isIP(address);
  if (f === 4) return { family: 4, bits: ipv4Bits(address) };
  if (f === 6) return { family: 6, bits: ipv6Bits(address) };
  return undefined;
}

/** Parses "198.18.0.0/16" or "fd00:1::/64"; host bits set are refused (a typo more often than not). */
export function parseCidr(text: string): Cidr {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(text.trim());
  const addr = m?.[1] ? bitsOf(m[1]) : undefined;
  if (!m || !addr) throw new StorageError("invalid", `${text}: not a CIDR (address/prefix)`);
  const prefix = Number(m[2]);
  const width = addr.family === 4 ? 32 : 128;
  if (prefix > width)
    throw new StorageError("invalid", `${text}: prefix /${prefix} is longer than ${width} bits`);
  const hostBits = BigInt(width - prefix);
  if ((addr.bits & ((1n << hostBits) - 1n)) !== 0n) {
    throw new StorageError(
      "invalid",
      `${text}: has host bits set (the network is ${networkText(addr, prefix)})`,
    );
  }
  return { text: text.trim(), family: addr.family, bits: addr.bits, prefix };
}

function networkText(addr: { family: 4 | 6; bits: bigint }, prefix: number): string {
  const width = addr.family === 4 ? 32 : 128;
  const net = (addr.bits >> BigInt(width - prefix)) << BigInt(width - prefix);
  if (addr.family === 4) {
    return `${[24n, 16n, 8n, 0n].map((s) => String((net >> s) & 0xffn)).join(".")}/${prefix}`;
  }
  const groups: string[] = [];
  for (let i = 7; i >= 0; i--) groups.push(((net >> BigInt(i * 16)) & 0xffffn).toString(16));
  return `${groups.join(":")}/${prefix}`;
}

/** Is `address` inside `net`? */
export function inCidr(address: string, net: Cidr): boolean {
  const a = bitsOf(address);
  if (!a || a.family !== net.family) return false;
  const shift = BigInt((net.family === 4 ? 32 : 128) - net.prefix);
  return a.bits >> shift === net.bits >> shift;
}

/**
 * The node's portal addresses in `networks`, in the networks' order (within one network by
 * interface name, then address), each address once; interfaces that are DOWN and addresses that
 * are not usable (tentative, deprecated, link-local, loopback) are skipped. Pure.
 */
export function portalAddressesIn(ifaces: readonly NetworkInterface[], networks: readonly Cidr[]): string[] {
  const out: string[] = [];
  for (const net of networks) {
    const here = ifaces
      .filter((i) => i.operstate !== "DOWN")
      .flatMap((i) => i.addresses.filter(usableAddress).map((a) => ({ ifname: i.name, address: a.address })))
      .filter((a) => inCidr(a.address, net))
      .sort((x, y) => x.ifname.localeCompare(y.ifname) || x.address.localeCompare(y.address));
    for (const a of here) if (!out.includes(a.address)) out.push(a.address);
  }
  return out;
}

/**
 * The node's addresses in the storage networks (DISTORT_PORTAL_NETWORKS), read once at start-up:
 * an address still being configured gets 30 s to appear; none by then is an error naming what
 * the node has.
 */
export async function portalsInNetworks(
  networks: readonly Cidr[],
  exec: Exec,
  log: Logger,
): Promise<string[]> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const ifaces = await hostInterfaces(exec);
    const found = portalAddressesIn(ifaces, networks);
    if (found.length > 0) {
      log.info("portal addresses from the storage networks", {
        networks: networks.map((n) => n.text),
        portals: found,
      });
      return found;
    }
    if (Date.now() >= deadline) {
      const seen = ifaces.flatMap((i) => i.addresses.map((a) => `${i.name}:${a.address}/${a.prefixLength}`));
      throw new StorageError(
        "precondition",
        `no usable address of this node is in DISTORT_PORTAL_NETWORKS (${networks.map((n) => n.text).join(",")}); it has ${seen.join(" ") || "none"}`,
      );
    }
    await Bun.sleep(1000);
  }
}
