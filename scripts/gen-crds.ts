// Writes the CRDs rendered from api/ into helm/distort/crds/ (one file per kind) and removes stale ones.
// Run directly (`bun scripts/gen-crds.ts`) or through `bun run gen`; api/crd-drift.test.ts fails when the output is stale.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { renderCrds } from "../api/crd.ts";

/**
 * Writes every CRD into outDir, rewriting only files whose content changed and deleting *.yaml files
 * no kind renders any more. Idempotent. Returns the file names written or deleted.
 */
export function genCrds(outDir: string): { written: string[]; deleted: string[] } {
  mkdirSync(outDir, { recursive: true });
  const rendered = renderCrds();
  const written: string[] = [];
  const deleted: string[] = [];
  for (const [file, yaml] of rendered) {
    const path = join(outDir, file);
    let current: string | undefined;
    try {
      current = readFileSync(path, "utf8");
    } catch {
      current = undefined;
    }
    if (current !== yaml) {
      writeFileSync(path, yaml);
      written.push(file);
    }
  }
  for (const file of readdirSync(outDir)) {
    if (file.endsWith(".yaml") && !rendered.has(file)) {
      rmSync(join(outDir, file));
      deleted.push(file);
    }
  }
  return { written, deleted };
}

if (import.meta.main) {
  const outDir = resolve(import.meta.dir, "..", "helm", "distort", "crds");
  const { written, deleted } = genCrds(outDir);
  console.log(`crds: ${written.length} written, ${deleted.length} deleted in ${outDir}`);
}
