// CSI topology <-> DISTORT: accessibility requirements become NVMePartition spec.topology (placement
// matches them against RDMAStorageNode labels), and a placed volume is reported accessible from its
// storage node's values of the requested keys. Pure.
import type { Topology, TopologyRequirement } from "../../api/index.ts";
import type { TopologyRequirement as CsiTopologyRequirement } from "../../gen/csi/v1/csi_pb.ts";
import { invalidArgument } from "../errors.ts";

// Label syntax (apimachinery validation): segment keys and values are label keys and values.
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;
/** Bounds of spec.topology (api/nvme-partition.ts). */
const MAX_SEGMENTS = 16;
const MAX_TOPOLOGIES = 32;

function keyProblem(key: string): string | undefined {
  const slash = key.indexOf("/");
  const prefix = slash >= 0 ? key.slice(0, slash) : undefined;
  const name = slash >= 0 ? key.slice(slash + 1) : key;
  if (prefix !== undefined && (prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix)))
    return "its prefix is not a DNS subdomain";
  if (!LABEL_NAME.test(name)) return "it is not a label key";
  return undefined;
}

function convert(list: readonly { segments: { [k: string]: string } }[], field: string): Topology[] {
  if (list.length > MAX_TOPOLOGIES) throw invalidArgument(`${field}: at most ${MAX_TOPOLOGIES} topologies`);
  return list.map((t, i) => {
    const entries = Object.entries(t.segments);
    if (entries.length === 0) throw invalidArgument(`${field}[${i}]: a topology needs at least one segment`);
    if (entries.length > MAX_SEGMENTS)
      throw invalidArgument(`${field}[${i}]: at most ${MAX_SEGMENTS} segments`);
    for (const [k, val] of entries) {
      const p = keyProblem(k);
      if (p) throw invalidArgument(`${field}[${i}]: segment key ${JSON.stringify(k)} is invalid: ${p}`);
      if (!LABEL_VALUE.test(val))
        throw invalidArgument(
          `${field}[${i}]: segment ${k} has value ${JSON.stringify(val)}, not a label value`,
        );
    }
    return { segments: Object.fromEntries(entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) };
  });
}

/**
 * The spec.topology for CreateVolume's accessibility_requirements, or undefined when there are
 * none. Throws INVALID_ARGUMENT for segments that could never equal a node label, or lists larger
 * than the API holds.
 */
export function toPartitionTopology(
  req: CsiTopologyRequirement | undefined,
): TopologyRequirement | undefined {
  if (!req || (req.requisite.length === 0 && req.preferred.length === 0)) return undefined;
  const requisite = convert(req.requisite, "accessibility_requirements.requisite");
  const preferred = convert(req.preferred, "accessibility_requirements.preferred");
  return {
    ...(requisite.length ? { requisite } : {}),
    ...(preferred.length ? { preferred } : {}),
  };
}

/** True when every segment equals the node label of the same key (placement's rule). */
export function matchesSegments(
  segments: Readonly<Record<string, string>>,
  labels: Readonly<Record<string, string>>,
): boolean {
  return Object.entries(segments).every(([k, val]) => labels[k] === val);
}

/**
 * Where a placed volume is accessible from: its storage node's values of the keys the request
 * used. No requirement (or a node carrying none of the keys) yields [], which CSI reads as "from
 * everywhere" — true of a fabric-attached volume when the CO asked nothing.
 */
export function accessibleTopology(
  req: TopologyRequirement | undefined,
  nodeLabels: Readonly<Record<string, string>>,
): { segments: Record<string, string> }[] {
  const keys = new Set<string>();
  for (const t of [...(req?.requisite ?? []), ...(req?.preferred ?? [])])
    for (const k of Object.keys(t.segments)) keys.add(k);
  const segments: Record<string, string> = {};
  for (const k of [...keys].sort()) {
    const val = nodeLabels[k];
    if (val !== undefined) segments[k] = val;
  }
  return Object.keys(segments).length ? [{ segments }] : [];
}
