// `bun run bench`: runs every bench/*.bench.ts in turn. Each one measures DISTORT's way against a
// yardstick in the same run and prints the ratio; nothing here asserts timings.
import { readdirSync } from "node:fs";
import { join } from "node:path";

const only = process.argv.slice(2);
const files = readdirSync(import.meta.dir)
  .filter((f) => f.endsWith(".bench.ts") && (only.length === 0 || only.some((o) => f.includes(o))))
  .sort();
let failed = 0;
for (const f of files) {
  process.stdout.write(`\n## ${f}\n`);
  const p = Bun.spawn([process.execPath, join(import.meta.dir, f)], { stdout: "inherit", stderr: "inherit" });
  if ((await p.exited) !== 0) failed++;
}
process.exit(failed > 0 ? 1 : 0);
