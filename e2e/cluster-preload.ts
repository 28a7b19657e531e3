// `bun test --preload ./e2e/cluster-preload.ts <files>` (scripts/e2e-cluster.ts): one real-cluster
// lab for the whole run, started before the first file and stopped after the last; every suite's
// e2eLab() and e2e-cluster/ use it instead of a lab of their own.
import { afterAll, beforeAll } from "bun:test";
import { startSharedRealLab, stopSharedRealLab } from "./cluster-backend.ts";

const say = (s: string) => process.stdout.write(`  [cluster] ${s}\n`);

beforeAll(async () => {
  const t0 = performance.now();
  await startSharedRealLab(say);
  say(`shared real-cluster lab ready in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}, 1_800_000);

afterAll(async () => {
  await stopSharedRealLab();
}, 300_000);

// afterAll does not run when the run is stopped (a CI time limit, ^C, the runner's own stop): the
// lab's nodes, control plane, namespaces and mounts would outlive it. Stop it here, once, and exit
// as the signal would have (a second signal meanwhile is ignored: the teardown is under way).
let stopping = false;
for (const [signal, code] of [
  ["SIGTERM", 143],
  ["SIGINT", 130],
  ["SIGHUP", 129],
] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    say(`${signal}: stopping the shared real-cluster lab`);
    stopSharedRealLab()
      .catch((err: unknown) => say(`stopping the lab after ${signal} failed: ${String(err)}`))
      .finally(() => process.exit(code));
  });
}
