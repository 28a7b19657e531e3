// `bun scripts/e2e-cluster.ts`: the e2e suites of the real-cluster lab (e2e-cluster/). Each suite
// file starts its own real-cluster lab and stops it; around them this script records the host's
// footprint (processes, mounts, loop devices, netns, links, routes, iptables, cgroups, sysctls)
// and fails when anything differs afterwards.
import { join } from "node:path";
import { diffFootprints, snapshotHost } from "../lab/cluster/host-footprint.ts";

const root = join(import.meta.dir, "..");
const say = (s: string) => process.stdout.write(`${s}\n`);
const only = process.argv.slice(2);
const before = snapshotHost();
const p = Bun.spawn(
  [process.execPath, "test", "--timeout", "1800000", ...(only.length ? only : ["e2e-cluster/"])],
  {
    cwd: root,
    stdout: "inherit",
    stderr: "inherit",
  },
);
let code = await p.exited;
const after = snapshotHost();
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
