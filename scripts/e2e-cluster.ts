// `bun scripts/e2e-cluster.ts`: the e2e suites on the real-cluster lab: the e2e/ suites moved
// there (e2e/suite-tiers.ts), then e2e-cluster/ (last: it uninstalls), all in one `bun test` run
// against one lab that e2e/cluster-preload.ts starts and stops; or the files named on the command
// line. Around them this script records the host's footprint (processes, mounts, loop devices,
// netns, links, routes, iptables, cgroups, sysctls) and fails when anything differs afterwards.
import { join } from "node:path";
import { CLUSTER_SUITES } from "../e2e/suite-tiers.ts";
import { diffFootprints, labProcessOf, snapshotHost } from "../lab/cluster/host-footprint.ts";

const root = join(import.meta.dir, "..");
const say = (s: string) => process.stdout.write(`${s}\n`);
const only = process.argv.slice(2);
/**
 * The lab's processes: everything in a node's cgroups or of the node daemons, and the control plane
 * of a real-cluster lab (its state directory is a distort-cluster-* one); another control plane on
 * the machine (an integration test's) is not the lab's.
 */
const labProcess = labProcessOf("distort-cluster-");
/** A distort-e2e-* scratch directory (a suite's own, or another lab's on the machine): not this lab's footprint. */
const otherLab = (path: string) => /\/distort-e2e-[^/]+\//.test(path);
const before = snapshotHost({ processFilter: labProcess, otherLab });
const p = Bun.spawn(
  [
    process.execPath,
    "test",
    "--timeout",
    "1800000",
    "--preload",
    "./e2e/cluster-preload.ts",
    // Paths ("./"), not filters: bun keeps their order, and e2e-cluster/ must come last.
    ...(only.length ? only : [...CLUSTER_SUITES, "e2e-cluster/cluster.e2e.test.ts"]).map((f) =>
      f.startsWith("./") ? f : `./${f}`,
    ),
  ],
  {
    cwd: root,
    stdout: "inherit",
    stderr: "inherit",
  },
);
// Stopped ourselves (a CI limit, ^C): the child stops its lab on the signal (e2e/cluster-preload.ts),
// so pass it on once and wait for it, then still compare the host's footprint.
let signalled = false;
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const)
  process.on(signal, () => {
    if (signalled) return;
    signalled = true;
    say(`${signal}: waiting for the suites to stop their lab`);
    p.kill(signal);
  });
let code = await p.exited;
const after = snapshotHost({ processFilter: labProcess, otherLab });
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
