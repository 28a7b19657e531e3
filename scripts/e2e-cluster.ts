// `bun scripts/e2e-cluster.ts`: the e2e suites of the real-cluster lab (e2e-cluster/). Each suite
// file starts its own real-cluster lab and stops it; around them this script records the host's
// footprint (processes, mounts, loop devices, netns, links, routes, iptables, cgroups, sysctls)
// and fails when anything differs afterwards.
import { join } from "node:path";
import {
  diffFootprints,
  isLabProcess,
  type ProcessInfo,
  snapshotHost,
} from "../lab/cluster/host-footprint.ts";

const root = join(import.meta.dir, "..");
const say = (s: string) => process.stdout.write(`${s}\n`);
const only = process.argv.slice(2);
/**
 * The lab's processes: everything in a node's cgroups or of the node daemons, and the control plane
 * of a real-cluster lab (its state directory is a distort-cluster-* one); another control plane on
 * the machine (an integration test's) is not the lab's.
 */
const CONTROL_PLANE = new Set(["etcd", "kube-apiserver", "kube-controller", "kube-scheduler"]);
const labProcess = (p: ProcessInfo) =>
  isLabProcess(p) && (!CONTROL_PLANE.has(p.comm) || p.cmdline.includes("distort-cluster-"));
const before = snapshotHost({ processFilter: labProcess });
const p = Bun.spawn(
  [process.execPath, "test", "--timeout", "1800000", ...(only.length ? only : ["e2e-cluster/"])],
  {
    cwd: root,
    stdout: "inherit",
    stderr: "inherit",
  },
);
let code = await p.exited;
const after = snapshotHost({ processFilter: labProcess });
const diff = diffFootprints(before, after);
if (diff.length > 0) {
  say("LEFT BEHIND by the real-cluster lab:");
  for (const d of diff) say(`  ${d}`);
  code = code || 1;
} else {
  say(
    "the host is as the real-cluster lab found it (processes, mounts, loops, netns, links, routes, iptables, cgroups, sysctls)",
  );
}
process.exit(code);
