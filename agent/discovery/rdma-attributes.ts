// Parsers for what the host says about RDMA ports and network interfaces: the infiniband sysfs
// attributes (state "4: ACTIVE", rate "100 Gb/sec (4X EDR)") and `ip -j addr show` JSON. Pure.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";

/** Port states the kernel prints (ib_port_state): "<number>: <NAME>". */
export type PortState = "NOP" | "DOWN" | "INIT" | "ARMED" | "ACTIVE" | "ACTIVE_DEFER" | "UNKNOWN";
const STATES: readonly PortState[] = ["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"];

/** "4: ACTIVE" -> ACTIVE; anything unrecognised -> UNKNOWN. */
export function parsePortState(text: string): PortState {
  const m = /^\s*\d+:\s*([A-Z_]+)\s*$/.exec(text);
  const name = m?.[1] as PortState | undefined;
  return name !== undefined && STATES.includes(name) ? name : "UNKNOWN";
}

/**
 * "100 Gb/sec (4X EDR)" -> 100000 Mb/s; "2.5 Gb/sec (1X SDR)" -> 2500. Undefined when the text has
 * no rate (the kernel refuses to print one for an invalid width).
 */
export function parseRateMbps(text: string): number | undefined {
  const m = /^\s*(\d+)(\.\d+)?\s*Gb\/sec/.exec(text);
  if (!m) return undefined;
  return Math.round(Number(`${m[1]}${m[2] ?? ""}`) * 1000);
}

/** One address of an interface, as `ip -j addr` reports it. */
export interface InterfaceAddress {
  readonly family: "inet" | "inet6";
  readonly address: string;
  readonly prefixLength: number;
  /** global, link, host, site... */
  readonly scope: string;
  /** IPv6 duplicate address detection not finished, failed, or address deprecated; IPv4 secondary. */
  readonly tentative: boolean;
  readonly dadFailed: boolean;
  readonly deprecated: boolean;
  readonly secondary: boolean;
}

export interface NetworkInterface {
  readonly name: string;
  /** UP, DOWN, UNKNOWN (virtual links report UNKNOWN while working). */
  readonly operstate: string;
  readonly addresses: readonly InterfaceAddress[];
}

const AddrInfoSchema = v.looseObject({
  family: v.string(),
  local: v.optional(v.string()),
  prefixlen: v.optional(v.number()),
  scope: v.optional(v.string()),
  tentative: v.optional(v.boolean()),
  dadfailed: v.optional(v.boolean()),
  deprecated: v.optional(v.boolean()),
  secondary: v.optional(v.boolean()),
});

const IpAddrSchema = v.array(
  v.looseObject({
    ifname: v.string(),
    operstate: v.optional(v.string()),
    addr_info: v.optional(v.array(AddrInfoSchema)),
  }),
);

/**
 * The interface in `ip -j addr show dev <if>` output (the first entry; the command names one).
 * Addresses of other families (e.g. none on a link without IP) are dropped. Throws
 * StorageError("internal") on output that is not ip's JSON.
 */
export function parseIpAddrJson(json: string): NetworkInterface | undefined {
  return parseIpAddrJsonAll(json)[0];
}

/** Every interface in `ip -j addr show` output, as parseIpAddrJson reads one. */
export function parseIpAddrJsonAll(json: string): NetworkInterface[] {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new StorageError("internal", "ip -j addr printed something that is not JSON", { cause: err });
  }
  const r = v.safeParse(IpAddrSchema, raw);
  if (!r.success) {
    const i = r.issues[0];
    throw new StorageError(
      "internal",
      `ip -j addr JSON has an unexpected shape at ${i ? (v.getDotPath(i) ?? "<root>") : "?"}: ${i?.message}`,
    );
  }
  return r.output.map((first) => {
    const addresses: InterfaceAddress[] = [];
    for (const a of first.addr_info ?? []) {
      if ((a.family !== "inet" && a.family !== "inet6") || a.local === undefined) continue;
      addresses.push({
        family: a.family,
        address: a.local,
        prefixLength: a.prefixlen ?? 0,
        scope: a.scope ?? "global",
        tentative: a.tentative === true,
        dadFailed: a.dadfailed === true,
        deprecated: a.deprecated === true,
        secondary: a.secondary === true,
      });
    }
    return { name: first.ifname, operstate: first.operstate ?? "UNKNOWN", addresses };
  });
}
