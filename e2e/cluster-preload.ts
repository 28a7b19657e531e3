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
