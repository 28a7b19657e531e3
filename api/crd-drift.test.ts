// Fails when helm/distort/crds/ no longer matches what api/ renders (edited by hand, or `bun run gen`
// not rerun), naming each differing, missing and extra file. Also exercises scripts/gen-crds.ts.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { genCrds } from "../scripts/gen-crds.ts";
import { renderCrds } from "./crd.ts";

const CRD_DIR = join(import.meta.dir, "..", "helm", "distort", "crds");

/** Differences between rendered files and a directory's *.yaml files. */
function drift(dir: string): { differing: string[]; missing: string[]; extra: string[] } {
  const rendered = renderCrds();
  const present = new Set(readdirSync(dir).filter((f) => f.endsWith(".yaml")));
  const differing: string[] = [];
  const missing: string[] = [];
  for (const [file, yaml] of rendered) {
    if (!present.has(file)) missing.push(file);
    else if (readFileSync(join(dir, file), "utf8") !== yaml) differing.push(file);
  }
  const extra = [...present].filter((f) => !rendered.has(f));
  return { differing, missing, extra };
}

describe("helm/distort/crds", () => {
  test("matches api/ (run `bun run gen` after changing a schema)", () => {
    expect(drift(CRD_DIR)).toEqual({ differing: [], missing: [], extra: [] });
  });
});

describe("genCrds", () => {
  test("writes every file, is idempotent, repairs edits and removes stale files", () => {
    const dir = mkdtempSync(join(tmpdir(), "distort-crds-"));
    try {
      const first = genCrds(dir);
      expect(first.written.length).toBe(renderCrds().size);
      expect(genCrds(dir)).toEqual({ written: [], deleted: [] });

      const [one] = first.written;
      writeFileSync(join(dir, one!), "# hand edit\n");
      writeFileSync(join(dir, "storage.distort.io_gone.yaml"), "stale\n");
      expect(drift(dir)).toEqual({ differing: [one!], missing: [], extra: ["storage.distort.io_gone.yaml"] });

      expect(genCrds(dir)).toEqual({ written: [one!], deleted: ["storage.distort.io_gone.yaml"] });
      expect(drift(dir)).toEqual({ differing: [], missing: [], extra: [] });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
