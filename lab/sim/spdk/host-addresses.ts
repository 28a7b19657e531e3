// Which IP addresses the emulated target's host has, so a listener on an address the host does
// not have fails the way bind() does for nvmf_tgt (EADDRNOTAVAIL, which nvmf_subsystem_add_listener
// reports as -32602 "Invalid parameters" in v25.05.1).
import { isIP } from "node:net";

/** True when a socket could be bound to `traddr` on this host. */
export type HasAddress = (traddr: string) => boolean;

/** Normalises an IP address for comparison (IPv6 lowercased, IPv4-mapped IPv6 as IPv4). */
function norm(a: string): string {
  const s = a
    .trim()
    .toLowerCase()
    .replace(/^\[|\]$/g, "");
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  return mapped?.[1] ?? s;
}

/**
 * The check for a host with `addresses` (a lab node gets its portal): those and the wildcards
 * (0.0.0.0, ::) can be bound, any other IP address is refused, as the real node would refuse a
 * listener on another node's address. Without a list every address counts as the host's: tests
 * that stand one emulator in for a remote node pick its address freely. Names that are not IP
 * addresses are not checked here (the transport refuses them).
 */
export function hostAddressCheck(addresses?: readonly string[]): HasAddress {
  if (addresses === undefined) return () => true;
  const mine = new Set<string>(["0.0.0.0", "::", ...addresses.map(norm)]);
  return (traddr) => {
    const a = norm(traddr);
    return isIP(a) === 0 || mine.has(a);
  };
}
