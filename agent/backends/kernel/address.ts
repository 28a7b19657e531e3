// Portal addresses for nvmet ports: the address family nvmet needs (addr_adrfam) follows from the
// address itself, and the service port becomes addr_trsvcid.
import { isIPv4, isIPv6 } from "node:net";
import { StorageError } from "../../../lib/errors.ts";

export type AddressFamily = "ipv4" | "ipv6";

/** nvmet keeps traddr in a 256-byte field (NVMF_TRADDR_SIZE). */
const TRADDR_MAX = 255;

/**
 * The nvmet address family of an IPv4 or IPv6 literal (an IPv6 zone such as "%eth0" is allowed,
 * the kernel resolves it). Anything else, host names included, is StorageError("invalid"): the
 * kernel parses traddr with inet_pton and never resolves names. Pure.
 */
export function addressFamily(address: string): AddressFamily {
  if (typeof address === "string" && address.length <= TRADDR_MAX) {
    if (isIPv4(address)) return "ipv4";
    if (isIPv6(address)) return "ipv6";
  }
  throw new StorageError(
    "invalid",
    `portal address ${JSON.stringify(address)} is not an IPv4 or IPv6 address`,
    {
      details: { address },
    },
  );
}

/** The service port as nvmet's addr_trsvcid string; StorageError("invalid") outside 1-65535. Pure. */
export function serviceId(port: number): string {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new StorageError("invalid", `portal port ${port} is not an integer in 1-65535`, {
      details: { port },
    });
  }
  return String(port);
}
