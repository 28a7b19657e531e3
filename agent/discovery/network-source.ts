// Where the node's RDMA endpoint facts come from, as a port: RDMA ports from
// /sys/class/infiniband/<dev>/ports/<n>/ and interface addresses from `ip -j addr show dev <if>`.
// hostNetworkSource is the production implementation over HostFs and Exec.
import { StorageError } from "../../lib/errors.ts";
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import {
  type NetworkInterface,
  type PortState,
  parseIpAddrJson,
  parseIpAddrJsonAll,
  parsePortState,
  parseRateMbps,
} from "./rdma-attributes.ts";

export const SYS_CLASS_INFINIBAND = "/sys/class/infiniband";

/** One port of one RDMA device. */
export interface RdmaPort {
  /** mlx5_0, rxe0... */
  readonly device: string;
  readonly port: number;
  readonly state: PortState;
  /** Undefined when the kernel printed no rate. */
  readonly rateMbps?: number;
  /** "Ethernet" (RoCE) or "InfiniBand"; empty when unreadable. */
  readonly linkLayer: string;
  /** Network interfaces carrying this port (RoCE netdev or IPoIB interface), in GID-table order. */
  readonly netdevs: readonly string[];
}

/** The node's network facts the reporter needs. Both methods are read-only. */
export interface NetworkSource {
  /** Every port of every RDMA device; [] when the host has none. Rejects when the class cannot be read. */
  rdmaPorts(): Promise<RdmaPort[]>;
  /** The interface with its addresses, or undefined when no such interface exists. */
  interfaceAddresses(ifname: string): Promise<NetworkInterface | undefined>;
}

function isEnoent(err: unknown): boolean {
  return (err as { code?: unknown })?.code === "ENOENT";
}

async function readdirOrEmpty(fs: HostFs, path: string): Promise<string[]> {
  try {
    return await fs.readdir(path);
  } catch (err) {
    if (isEnoent(err)) return [];
    throw err;
  }
}

async function readOr(fs: HostFs, path: string, fallback: string): Promise<string> {
  try {
    return (await fs.readFile(path)).trim();
  } catch {
    return fallback;
  }
}

/**
 * Netdevs of a port. RoCE ports name theirs per GID in gid_attrs/ndevs/<index>; reading an unused
 * index fails (EINVAL), so failures are skipped. InfiniBand ports have no GID netdev: the PCI
 * function's net/ directory lists the IPoIB interface instead.
 */
async function portNetdevs(fs: HostFs, devDir: string, portDir: string): Promise<string[]> {
  const indexes = (await readdirOrEmpty(fs, `${portDir}/gid_attrs/ndevs`))
    .filter((i) => /^\d+$/.test(i))
    .sort((a, b) => Number(a) - Number(b));
  const seen: string[] = [];
  for (const i of indexes) {
    const name = await readOr(fs, `${portDir}/gid_attrs/ndevs/${i}`, "");
    if (name && !seen.includes(name)) seen.push(name);
  }
  if (seen.length > 0) return seen;
  return (await readdirOrEmpty(fs, `${devDir}/device/net`)).sort();
}

/** The production NetworkSource: sysfs through `fs`, `ip` through `exec`. */
export function hostNetworkSource(
  fs: HostFs,
  exec: Exec,
  opts: { ipTimeoutMs?: number } = {},
): NetworkSource {
  return {
    async rdmaPorts() {
      const devices = (await readdirOrEmpty(fs, SYS_CLASS_INFINIBAND)).sort();
      const ports: RdmaPort[] = [];
      for (const device of devices) {
        const devDir = `${SYS_CLASS_INFINIBAND}/${device}`;
        const numbers = (await readdirOrEmpty(fs, `${devDir}/ports`))
          .filter((p) => /^\d+$/.test(p))
          .sort((a, b) => Number(a) - Number(b));
        for (const n of numbers) {
          const portDir = `${devDir}/ports/${n}`;
          const [state, rate, linkLayer, netdevs] = await Promise.all([
            readOr(fs, `${portDir}/state`, ""),
            readOr(fs, `${portDir}/rate`, ""),
            readOr(fs, `${portDir}/link_layer`, ""),
            portNetdevs(fs, devDir, portDir),
          ]);
          const rateMbps = parseRateMbps(rate);
          ports.push({
            device,
            port: Number(n),
            state: parsePortState(state),
            ...(rateMbps === undefined ? {} : { rateMbps }),
            linkLayer,
            netdevs,
          });
        }
      }
      return ports;
    },
    async interfaceAddresses(ifname) {
      const argv = ["ip", "-j", "addr", "show", "dev", ifname];
      const r = await exec.run(argv, { timeoutMs: opts.ipTimeoutMs ?? 10_000 });
      if (r.code !== 0) {
        if (/does not exist/i.test(r.stderr)) return undefined;
        throw new StorageError(
          "internal",
          `${argv.join(" ")} exited ${r.code}: ${r.stderr.trim().slice(0, 500)}`,
        );
      }
      return parseIpAddrJson(r.stdout);
    },
  };
}

/** Every interface of the host (`ip -j addr show`), for portal selection by network. */
export async function hostInterfaces(exec: Exec, timeoutMs = 10_000): Promise<NetworkInterface[]> {
  const argv = ["ip", "-j", "addr", "show"];
  const r = await exec.run(argv, { timeoutMs });
  if (r.code !== 0) {
    throw new StorageError(
      "internal",
      `${argv.join(" ")} exited ${r.code}: ${r.stderr.trim().slice(0, 500)}`,
    );
  }
  return parseIpAddrJsonAll(r.stdout);
}
