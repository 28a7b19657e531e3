// The TypeScript files below a folder, for the repository-wide checks in scripts/*.test.ts.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

/** Every .ts file below `dir` (absolute paths), skipping node_modules and dot folders; [] if `dir` is absent. */
export function sourceFiles(dir: string): string[] {
  let out: string[] = [];
  let entries: string[] = [];
  try {
    entries = readdirSync(dir);
  } catch {
    return out;
  }
  for (const e of entries) {
    if (e === "node_modules" || e.startsWith(".")) continue;
    const p = join(dir, e);
    if (statSync(p).isDirectory()) out = out.concat(sourceFiles(p));
    else if (p.endsWith(".ts")) out.push(p);
  }
  return out;
}
