// `bun run test`: every tier, in order of cost — type check, lint, unit tests, integration tests
// against one shared real control plane, csi-sanity, then the e2e suites on the real-cluster lab. Ends with one
// summary line "N passed, N failed" across all tiers; exits non-zero if anything failed.
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { ensurePromtool } from "../lab/cluster/promtool-tool.ts";
import { ensureSidecars, ensureTools } from "../lab/cluster/tools.ts";

const root = `${import.meta.dir}/..`;
const bin = (name: string) => `${root}/node_modules/.bin/${name}`;
let passed = 0;
let failed = 0;
const say = (s: string) => process.stdout.write(`${s}\n`);

/** Runs a command with inherited output, capturing it too so bun test's counts can be read. */
async function step(name: string, cmd: string[], env: Record<string, string> = {}): Promise<string> {
  say(`\n== ${name}: ${cmd.join(" ")}`);
  const t0 = performance.now();
  const p = Bun.spawn(cmd, { cwd: root, env: { ...process.env, ...env }, stdout: "pipe", stderr: "pipe" });
  const out: string[] = [];
  const pump = async (s: ReadableStream<Uint8Array>, w: NodeJS.WriteStream) => {
    const dec = new TextDecoder();
    for await (const c of s) {
      const t = dec.decode(c);
      out.push(t);
      w.write(t);
    }
  };
  await Promise.all([pump(p.stdout, process.stdout), pump(p.stderr, process.stderr)]);
  const code = await p.exited;
  const text = out.join("");
  const sanity = /^csi-sanity: (\d+) passed, (\d+) failed/m.exec(text);
  const pass = Number(sanity?.[1] ?? /^\s*(\d+) pass$/m.exec(text)?.[1] ?? 0);
  const fail = Number(sanity?.[2] ?? /^\s*(\d+) fail$/m.exec(text)?.[1] ?? 0);
  if (pass + fail > 0) {
    passed += pass;
    failed += fail;
    if (code !== 0 && fail === 0) failed++; // e.g. an error outside any test
  } else {
    // A check that is not a test runner counts as one test.
    if (code === 0) passed++;
    else failed++;
  }
  say(
    `== ${name}: ${code === 0 ? "ok" : `FAILED (exit ${code})`} in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
  return text;
}

// Host packages first: some unit tests run real tools too (parted on a scratch file, busybox for
// the images' applets), and a fresh machine has neither.
await step("host packages", ["bash", "scripts/host-deps.sh"]);

// `--only-integration` (the test:int script) runs the integration tier alone: no static checks,
// unit tests, csi-sanity or e2e.
const onlyIntegration = process.argv.includes("--only-integration");
if (!onlyIntegration) {
  await step("typecheck", [bin("tsc"), "--noEmit", "-p", "tsconfig.json"]);
  await step("lint", [bin("biome"), "check", "."]);
  await step("buf lint", [bin("buf"), "lint"]);
  await step("unit", [bin("bun"), "run", "test:unit"]);
}

say("\n== control plane for integration tests");
const t0 = performance.now();
await ensureTools();
// promtool checks the chart's alert rules in helm/monitoring.int.test.ts, the CSI sidecars run in
// csi/ and lab/ tests, helm renders the chart in helm/ tests: a cold build of each takes minutes
// (the sidecars about 10 on two cores), so they happen here rather than inside a test's timeout.
await ensurePromtool();
await ensureSidecars();
await ensureHelm();
const cp = await startControlPlane({ controllerManager: true, progress: (l) => say(`  ${l}`) });
say(`  started in ${Math.round(performance.now() - t0)} ms`);
try {
  await step("integration", [bin("bun"), "test", "--timeout", "120000", ".int.test.ts"], {
    DISTORT_TEST_KUBECONFIG: cp.kubeconfigPath,
  });
} finally {
  await cp.stop();
}

if (!onlyIntegration) {
  // Conformance: csi-sanity against the whole stack, on its own control plane.
  await step("csi-sanity", [bin("bun"), "scripts/sanity.ts"]);

  // End to end on the real cluster: real kubelets, DISTORT installed by helm from images built here.
  await step("e2e (real cluster)", [bin("bun"), "scripts/e2e-cluster.ts"]);
}

say(`\n${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
