// Which lab each e2e suite runs on: the suites moved to the real-cluster lab (scripts/e2e-cluster.ts
// runs them, in this order, before e2e-cluster/) and the rest, which stay on the process lab
// (scripts/e2e.ts): capacity, whose check that kube-scheduler heeds CSIStorageCapacity at its
// first attempt failed once on the cluster (cause not found yet). multipath runs on the cluster, whose nodes have an address on each of
// two storage networks that the agents find by CIDR (DISTORT_PORTAL_NETWORKS); dpu on its DPU node
// node-d (the chart's DPU plugin, a SNAP stand-in: lab/cluster/dpu-node.ts).
import { readdirSync } from "node:fs";
import { join } from "node:path";

/** Suites run on the real cluster, in order (paths relative to the repository root). */
export const CLUSTER_SUITES: readonly string[] = [
  "e2e/provisioning.e2e.test.ts",
  "e2e/snapshots.e2e.test.ts",
  "e2e/expansion.e2e.test.ts",
  "e2e/identities.e2e.test.ts",
  "e2e/cleanup.e2e.test.ts",
  "e2e/placement.e2e.test.ts",
  "e2e/bad-input.e2e.test.ts",
  "e2e/host-auth.e2e.test.ts",
  "e2e/dhchap.e2e.test.ts",
  "e2e/tls-psk.e2e.test.ts",
  "e2e/dpu.e2e.test.ts",
  "e2e/io-path.e2e.test.ts",
  "e2e/single-writer.e2e.test.ts",
  "e2e/faults.e2e.test.ts",
  "e2e/multipath.e2e.test.ts",
  "e2e/replicated.e2e.test.ts",
];

/** Every e2e/*.e2e.test.ts not in CLUSTER_SUITES, sorted (paths relative to the repository root). */
export function processLabSuites(root: string): string[] {
  return readdirSync(join(root, "e2e"))
    .filter((f) => f.endsWith(".e2e.test.ts"))
    .map((f) => `e2e/${f}`)
    .filter((f) => !CLUSTER_SUITES.includes(f))
    .sort();
}
