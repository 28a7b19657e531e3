// Imports run one way: product code (manager, agent, csi, dpu, lib, api, gen) never imports the
// lab, end-to-end suites or benchmarks; only tests may. Also: nothing reads ../shared.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { sourceFiles } from "./source-files.ts";

const root = join(import.meta.dir, "..");
const PRODUCT = ["manager", "agent", "csi", "dpu", "cli", "lib", "api", "gen"];
const FORBIDDEN = ["lab", "e2e", "bench"];

const IMPORT =
  /(?:^|\n)\s*(?:import|export)\s[^;]*?from\s+["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;

test("product code does not import lab, e2e or bench", () => {
  const offenders: string[] = [];
  for (const top of PRODUCT) {
    for (const f of sourceFiles(join(root, top))) {
      if (f.endsWith(".test.ts") || f.includes("/testdata/")) continue;
      const src = readFileSync(f, "utf8");
      for (const m of src.matchAll(IMPORT)) {
        const spec = m[1] ?? m[2] ?? "";
        if (!spec.startsWith(".")) continue;
        const target = relative(root, join(f, "..", spec)).split("/")[0] ?? "";
        if (FORBIDDEN.includes(target)) offenders.push(`${relative(root, f)} -> ${spec}`);
      }
    }
  }
  expect(offenders).toEqual([]);
});

test("the four binaries share code only through lib, api and gen", () => {
  const BINARIES = ["manager", "agent", "csi", "dpu"];
  const offenders: string[] = [];
  for (const top of BINARIES) {
    for (const f of sourceFiles(join(root, top))) {
      if (f.endsWith(".test.ts") || f.includes("/testdata/")) continue;
      for (const m of readFileSync(f, "utf8").matchAll(IMPORT)) {
        const spec = m[1] ?? m[2] ?? "";
        if (!spec.startsWith(".")) continue;
        const target = relative(root, join(f, "..", spec)).split("/")[0] ?? "";
        if (BINARIES.includes(target) && target !== top) offenders.push(`${relative(root, f)} -> ${spec}`);
      }
    }
  }
  expect(offenders).toEqual([]);
});

test("nothing in the project reads the ../shared folder at run or test time", () => {
  const offenders = ["api", "lib", "lab", "scripts", "gen", "bench", "manager", "agent", "csi", "dpu", "e2e"]
    .flatMap((d) => sourceFiles(join(root, d)))
    .filter((f) => f !== import.meta.path && /\.\.\/shared\b|\/work\/shared/.test(readFileSync(f, "utf8")))
    .map((f) => relative(root, f));
  expect(offenders).toEqual([]);
});
