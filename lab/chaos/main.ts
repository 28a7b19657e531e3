// `bun run chaos`: the seeded chaos run of replicated volumes on a control plane of its own.
// Options (flags or environment): --seed / DISTORT_CHAOS_SEED (default: random, printed),
// --faults / DISTORT_CHAOS_FAULTS (default 200), --volumes / DISTORT_CHAOS_VOLUMES (copies per
// volume, comma-separated; default 2,3), --without-drains / DISTORT_CHAOS_DRAINS=0 (no drains among
// the faults, and one storage node fewer: the plans seeds had before drains), --keep (keep the
// process logs). Exit 1 on any loss.
import { parseArgs } from "node:util";
import { testCluster } from "../cluster/test-support.ts";
import { runChaos } from "./run.ts";

function int(name: string, text: string | undefined, fallback: number): number {
  if (text === undefined || text === "") return fallback;
  const n = Number(text);
  if (!Number.isSafeInteger(n) || n < 0) {
    console.error(`chaos: ${name} must be a non-negative integer, got ${JSON.stringify(text)}`);
    process.exit(2);
  }
  return n;
}

const { values } = parseArgs({
  options: {
    seed: { type: "string" },
    faults: { type: "string" },
    volumes: { type: "string" },
    keep: { type: "boolean" },
    "without-drains": { type: "boolean" },
    help: { type: "boolean" },
  },
});
if (values.help) {
  console.log("usage: bun run chaos [--seed N] [--faults N] [--volumes 2,3] [--without-drains] [--keep]");
  process.exit(0);
}
const seed = int("seed", values.seed ?? process.env.DISTORT_CHAOS_SEED, Math.floor(Math.random() * 2 ** 31));
const faults = int("faults", values.faults ?? process.env.DISTORT_CHAOS_FAULTS, 200);
const volumesText = values.volumes ?? process.env.DISTORT_CHAOS_VOLUMES ?? "2,3";
const volumes = volumesText.split(",").map((s) => int("volumes", s.trim(), 0));
if (volumes.length === 0 || volumes.some((r) => r !== 2 && r !== 3)) {
  console.error(
    `chaos: volumes is a comma list of 2 and 3 (copies per volume), got ${JSON.stringify(volumesText)}`,
  );
  process.exit(2);
}

const drains = !(values["without-drains"] || process.env.DISTORT_CHAOS_DRAINS === "0");

const tc = await testCluster();
let code = 1;
try {
  const r = await runChaos({ tc, seed, faults, volumes, drains, keepDir: values.keep });
  code = r.lost === 0 && r.volumes.every((v) => !v.notConverged) ? 0 : 1;
} catch {
  code = 1;
} finally {
  await tc.stop();
}
process.exit(code);
