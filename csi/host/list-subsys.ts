// Parses `nvme list-subsys -o json` (nvme-cli 2.x: an array of hosts, each with its subsystems and
// their controller paths) into ConnectedSubsystems. Pure.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";
import type { ConnectedPath, ConnectedSubsystem } from "./nvme-initiator.ts";

const PathSchema = v.looseObject({
  Name: v.string(),
  Transport: v.string(),
  // "traddr=10.0.0.5,trsvcid=4420,src_addr=10.0.0.9" for fabrics, the PCI address for pcie.
  Address: v.optional(v.string(), ""),
  State: v.string(),
});

const SubsystemSchema = v.looseObject({
  Name: v.string(),
  NQN: v.string(),
  // Printed only when the subsystem has controllers in some versions; absent means none.
  Paths: v.optional(v.array(PathSchema), []),
});

const HostSchema = v.looseObject({
  HostNQN: v.string(),
  HostID: v.optional(v.string()),
  Subsystems: v.optional(v.array(SubsystemSchema), []),
});

// 2.x prints an array of hosts; some 2.x builds print a single host object instead.
const ListSubsysSchema = v.union([v.array(HostSchema), HostSchema]);

/**
 * Splits a controller address ("traddr=…,trsvcid=…[,host_traddr=…][,src_addr=…]"; older kernels
 * separate with spaces) into traddr and trsvcid. A PCI address has neither key.
 */
export function parseControllerAddress(address: string): { traddr?: string; trsvcid?: string } {
  const out: { traddr?: string; trsvcid?: string } = {};
  for (const part of address.split(/[,\s]+/)) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const key = part.slice(0, eq);
    const value = part.slice(eq + 1);
    if (key === "traddr") out.traddr = value;
    else if (key === "trsvcid") out.trsvcid = value;
  }
  return out;
}

/**
 * The subsystems in nvme-cli's JSON, one entry per (host, subsystem) with at least one path.
 * Empty output (nothing connected) is an empty list. Throws StorageError "internal" for text that
 * is not list-subsys JSON.
 */
export function parseListSubsys(text: string): ConnectedSubsystem[] {
  if (text.trim() === "") return [];
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new StorageError("internal", "nvme list-subsys printed something that is not JSON", { cause: err });
  }
  const r = v.safeParse(ListSubsysSchema, raw);
  if (!r.success) {
    const issue = r.issues[0];
    throw new StorageError(
      "internal",
      `nvme list-subsys JSON has an unexpected shape at ${issue ? (v.getDotPath(issue) ?? "<root>") : "?"}: ${issue?.message}`,
    );
  }
  const hosts = Array.isArray(r.output) ? r.output : [r.output];
  const out: ConnectedSubsystem[] = [];
  for (const host of hosts) {
    for (const s of host.Subsystems) {
      if (s.Paths.length === 0) continue;
      const paths: ConnectedPath[] = s.Paths.map((p) => {
        const addr = parseControllerAddress(p.Address);
        return {
          name: p.Name,
          transport: p.Transport,
          traddr: addr.traddr,
          trsvcid: addr.trsvcid,
          state: p.State,
        };
      });
      out.push({ nqn: s.NQN, hostNqn: host.HostNQN, name: s.Name, paths });
    }
  }
  return out;
}
