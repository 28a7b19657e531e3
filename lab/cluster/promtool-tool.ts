// Locates promtool in the version-keyed tool cache and builds it when missing by running
// lab/cluster/build-promtool.sh, the one recipe shared with CI. Used by the alert-rule tests.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { cacheRoot } from "./tools.ts";

/** Prometheus 3.16.0 as the Go module proxy serves it (`go list -m -versions github.com/prometheus/prometheus`). */
export const PROMETHEUS_VERSION = "v0.316.0";

export function promtoolPath(root = cacheRoot()): string {
  return join(root, "promtool", PROMETHEUS_VERSION, "promtool");
}

/**
 * Returns the promtool binary's path, building it first when the cache lacks it (minutes when
 * cold; progress goes to stderr). Throws when the build fails.
 */
export async function ensurePromtool(root = cacheRoot()): Promise<string> {
  const path = promtoolPath(root);
  if (existsSync(path)) return path;
  const proc = Bun.spawn(["bash", join(import.meta.dir, "build-promtool.sh")], {
    env: { ...process.env, DISTORT_CACHE: root, PROMETHEUS_VERSION },
    stdout: "inherit",
    stderr: "inherit",
  });
  const code = await proc.exited;
  if (code !== 0)
    throw new Error(`building promtool ${PROMETHEUS_VERSION} failed (exit ${code}); see the output above`);
  if (!existsSync(path)) throw new Error(`promtool build finished but ${path} is missing`);
  return path;
}
