// Helpers for the table-driven schema tests in api/*.test.ts: mutate one dotted path of a valid
// example and report where valibot put its issues.
import * as v from "valibot";

/** Deep copy of `obj` with each dotted path set (undefined deletes the key). Array indexes are numbers in the path. */
export function withPaths(obj: unknown, changes: Readonly<Record<string, unknown>>): unknown {
  const copy = structuredClone(obj) as Record<string, unknown>;
  for (const [path, value] of Object.entries(changes)) {
    const keys = path.split(".");
    let node = copy;
    for (const key of keys.slice(0, -1)) {
      node[key] ??= {};
      node = node[key] as Record<string, unknown>;
    }
    const last = keys.at(-1)!;
    if (value === undefined) delete node[last];
    else node[last] = value;
  }
  return copy;
}

/** Dotted paths of every issue valibot reports (empty when the value parses). */
export function issuePaths(schema: v.GenericSchema, value: unknown): string[] {
  const r = v.safeParse(schema, value);
  return r.success ? [] : r.issues.map((i) => v.getDotPath(i) ?? "<root>");
}

/** One row of a rejection table: set these paths, expect an issue at `at`. */
export interface RejectCase {
  readonly name: string;
  readonly set: Readonly<Record<string, unknown>>;
  readonly at: string;
}
