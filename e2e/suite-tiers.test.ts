import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { CLUSTER_SUITES, unlistedSuites } from "./suite-tiers.ts";

const ROOT = join(import.meta.dir, "..");

test("every e2e suite runs on the real cluster: none is left out of CLUSTER_SUITES", () => {
  expect(unlistedSuites(ROOT)).toEqual([]);
});

test("CLUSTER_SUITES names existing files, each once", () => {
  for (const f of CLUSTER_SUITES) expect(existsSync(join(ROOT, f))).toBe(true);
  expect(new Set(CLUSTER_SUITES).size).toBe(CLUSTER_SUITES.length);
});
