// The e2e suites, in the order scripts/e2e-cluster.ts runs them on the real-cluster lab (before
// e2e-cluster/): every e2e/*.e2e.test.ts is here (suite-tiers.test.ts checks it). multipath runs
// on nodes with an address on each of two storage networks that the agents find by CIDR
// (DISTORT_PORTAL_NETWORKS); dpu on the DPU node node-d (the chart's DPU plugin beside a SNAP
// stand-in: lab/cluster/dpu-node.ts).
import { readdirSync } from "node:fs";
import { join } from "node:path";

/** Suites run on the real cluster, in order (paths relative to the repository root). */
export const CLUSTER_SUITES: readonly string[] = [
  "e2e/provisioning.e2e.test.ts",
  "e2e/snapshots.e2e.test.ts",
  "e2e/changed-blocks.e2e.test.ts",
  "e2e/expansion.e2e.test.ts",
  "e2e/identities.e2e.test.ts",
  "e2e/cleanup.e2e.test.ts",
  "e2e/placement.e2e.test.ts",
  "e2e/capacity.e2e.test.ts",
  "e2e/bad-input.e2e.test.ts",
  "e2e/host-auth.e2e.test.ts",
  "e2e/dhchap.e2e.test.ts",
  "e2e/tls-psk.e2e.test.ts",
  "e2e/dpu.e2e.test.ts",
  "e2e/io-path.e2e.test.ts",
  "e2e/single-writer.e2e.test.ts",
  "e2e/shared-block.e2e.test.ts",
  "e2e/faults.e2e.test.ts",
  "e2e/multipath.e2e.test.ts",
  "e2e/replicated.e2e.test.ts",
  "e2e/drain.e2e.test.ts",
];

/** Every e2e/*.e2e.test.ts not in CLUSTER_SUITES, sorted (paths relative to the repository root). */
export function unlistedSuites(root: string): string[] {
  return readdirSync(join(root, "e2e"))
    .filter((f) => f.endsWith(".e2e.test.ts"))
    .map((f) => `e2e/${f}`)
    .filter((f) => !CLUSTER_SUITES.includes(f))
    .sort();
}
