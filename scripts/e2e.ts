// `bun run e2e`: starts one lab in a temporary directory, runs the e2e suites of the process lab
// against it (every e2e/*.e2e.test.ts not moved to the real cluster, e2e/suite-tiers.ts; or the
// files named on the command line; DISTORT_E2E_LAB names the lab), then stops the lab and checks it left no process, mount or loop
// device behind. Prints bun test's counts; exits non-zero on any failure or leftover.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { processLabSuites } from "../e2e/suite-tiers.ts";
import { labInfo } from "../e2e/support.ts";
import { startLab } from "../lab/lab.ts";
import { loopDevices, mountPoints, processesUnder, sweepLab } from "../lab/sweep.ts";

const root = join(import.meta.dir, "..");
const say = (s: string) => process.stdout.write(`${s}\n`);
const only = process.argv.slice(2);
const suites = only.length ? only : processLabSuites(root).map((f) => `./${f}`);
// No file at all would make `bun test` run every test of the repository.
if (suites.length === 0) {
  say("no e2e suite runs on the process lab (every one is in e2e/suite-tiers.ts CLUSTER_SUITES)");
  process.exit(0);
}
const dir = mkdtempSync(join(tmpdir(), "distort-e2e-"));
const t0 = performance.now();
let code = 1;
const lab = await startLab({ dir, progress: (l) => say(`  [lab] ${l}`) });
try {
  writeFileSync(join(dir, "e2e.json"), JSON.stringify(labInfo(lab)));
  say(`lab ready in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  const p = Bun.spawn([process.execPath, "test", "--timeout", "600000", ...suites], {
    cwd: root,
    env: { ...process.env, DISTORT_E2E_LAB: dir },
    stdout: "inherit",
    stderr: "inherit",
  });
  code = await p.exited;
} finally {
  await lab.stop();
  const swept = await sweepLab(dir);
  const left = {
    processes: processesUnder(dir).length,
    mounts: mountPoints().filter((m) => m.startsWith(dir)).length,
    loops: loopDevices().filter((l) => l.backFile.startsWith(dir)).length,
  };
  say(
    `lab stopped; the sweep found ${swept.killed} processes, ${swept.unmounted} mounts and ${swept.detached} loop devices still there`,
  );
  rmSync(dir, { recursive: true, force: true });
  if (left.processes + left.mounts + left.loops > 0) {
    say(`LEFT BEHIND: ${JSON.stringify(left)}`);
    code = code || 1;
  }
}
process.exit(code);
