// Picks the node's NVMe-oF portal: an ACTIVE RDMA port whose interface holds a routable address
// (IPv4 preferred, then global IPv6; never link-local, tentative or deprecated). The fastest port
// wins, ties broken by device name and port number, so the choice is stable across scans.
import { isIP } from "node:net";
import { errorMessage } from "../../lib/errors.ts";
import type { NetworkSource, RdmaPort } from "./network-source.ts";
import type { InterfaceAddress, NetworkInterface } from "./rdma-attributes.ts";

/** Where initiators reach this node. */
export interface RdmaEndpoint {
  readonly ip: string;
  /** "rdma" for a discovered RDMA port; absent for a configured address, whose transports are
   * whatever the exported partitions ask for (status.servedTransports). */
  readonly transport?: "rdma";
  readonly linkSpeedMbps?: number;
  readonly device: string;
  readonly port: number;
  readonly netdev: string;
}

/** The endpoint, or a CamelCase reason (for the Ready condition) why there is none. */
export type EndpointResult =
  | { readonly ok: true; readonly endpoint: RdmaEndpoint }
  | { readonly ok: false; readonly reason: string; readonly message: string };

/** An address a portal may listen on: global, settled, not loopback or link-local. */
export function usableAddress(a: InterfaceAddress): boolean {
  if (a.tentative || a.dadFailed || a.deprecated) return false;
  if (a.scope !== "global") return false;
  if (isIP(a.address) === 0 || a.address.includes("%")) return false;
  const lower = a.address.toLowerCase();
  // IPv4-mapped IPv6 is not an address the status schema (CEL isIP) accepts.
  if (a.family === "inet6" && (/^fe[89ab]/.test(lower) || lower.startsWith("::ffff:") || lower === "::1")) {
    return false;
  }
  return !(a.family === "inet" && (lower.startsWith("127.") || lower.startsWith("169.254.")));
}

/** The address initiators should use on `iface`, or undefined. Pure. */
export function pickAddress(iface: NetworkInterface): string | undefined {
  if (iface.operstate === "DOWN") return undefined;
  const rank = (a: InterfaceAddress) => (a.family === "inet" ? 0 : 2) + (a.secondary ? 1 : 0);
  const best = iface.addresses.filter(usableAddress).sort((a, b) => rank(a) - rank(b))[0];
  return best?.address;
}

/** Ports worth trying, best first. Pure. */
export function rankPorts(ports: readonly RdmaPort[]): RdmaPort[] {
  return ports
    .filter((p) => p.state === "ACTIVE" && p.netdevs.length > 0)
    .sort(
      (a, b) => (b.rateMbps ?? 0) - (a.rateMbps ?? 0) || a.device.localeCompare(b.device) || a.port - b.port,
    );
}

/**
 * Finds the endpoint through `source`. Never rejects: failures become { ok: false } with reason
 * NetworkDiscoveryFailed, NoRdmaDevice, NoActiveRdmaPort or NoUsableAddress.
 */
export async function findRdmaEndpoint(source: NetworkSource): Promise<EndpointResult> {
  let ports: RdmaPort[];
  try {
    ports = await source.rdmaPorts();
  } catch (err) {
    return {
      ok: false,
      reason: "NetworkDiscoveryFailed",
      message: `reading RDMA ports: ${errorMessage(err)}`,
    };
  }
  if (ports.length === 0)
    return { ok: false, reason: "NoRdmaDevice", message: "no RDMA device on this node" };
  const candidates = rankPorts(ports);
  if (candidates.length === 0) {
    const states = ports.map((p) => `${p.device}/${p.port} ${p.state}`).join(", ");
    return {
      ok: false,
      reason: "NoActiveRdmaPort",
      message: `no ACTIVE RDMA port with a network interface (${states})`,
    };
  }
  const tried: string[] = [];
  for (const p of candidates) {
    for (const netdev of p.netdevs) {
      let iface: NetworkInterface | undefined;
      try {
        iface = await source.interfaceAddresses(netdev);
      } catch (err) {
        tried.push(`${netdev}: ${errorMessage(err)}`);
        continue;
      }
      const ip = iface ? pickAddress(iface) : undefined;
      if (ip === undefined) {
        tried.push(`${netdev}: ${iface ? "no routable address" : "no such interface"}`);
        continue;
      }
      return {
        ok: true,
        endpoint: {
          ip,
          transport: "rdma",
          ...(p.rateMbps === undefined ? {} : { linkSpeedMbps: p.rateMbps }),
          device: p.device,
          port: p.port,
          netdev,
        },
      };
    }
  }
  return {
    ok: false,
    reason: "NoUsableAddress",
    message: `active RDMA ports have no usable address (${tried.join("; ")})`,
  };
}
