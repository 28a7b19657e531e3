// CSI accessibility requirements against storage-node labels. A partition's spec.topology carries
// requisite and preferred segment maps as CreateVolume received them; a node's topology is the
// labels on its RDMAStorageNode object. Pure.
import type { Topology, TopologyRequirement } from "../../api/index.ts";

/** True when every segment equals the node label of the same key. An empty map matches any node. */
export function matchesTopology(t: Topology, labels: Readonly<Record<string, string>>): boolean {
  return Object.entries(t.segments).every(([k, v]) => labels[k] === v);
}

/**
 * Rank of a node for `req`: undefined when it fails the requisite list (when one is given), else
 * the index of the first preferred topology it matches, or preferred.length when it matches none
 * (lower is better). No requirement at all ranks every node 0.
 */
export function topologyRank(
  req: TopologyRequirement | undefined,
  labels: Readonly<Record<string, string>>,
): number | undefined {
  if (!req) return 0;
  const requisite = req.requisite ?? [];
  if (requisite.length > 0 && !requisite.some((t) => matchesTopology(t, labels))) return undefined;
  const preferred = req.preferred ?? [];
  const i = preferred.findIndex((t) => matchesTopology(t, labels));
  return i < 0 ? preferred.length : i;
}
