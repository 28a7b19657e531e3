// Locates helm in the version-keyed tool cache and builds it when missing by running
// lab/cluster/build-helm.sh, the one recipe shared with CI. Used by the chart's tests.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { cacheRoot, KUBE_VERSION } from "./tools.ts";

/** Newest helm v3 the Go module proxy serves (`go list -m -versions helm.sh/helm/v3`). */
export const HELM_VERSION = "v3.22.0";

export function helmPath(root = cacheRoot()): string {
  return join(root, "helm", HELM_VERSION, "helm");
}

/**
 * Returns the helm binary's path, building it first when the cache lacks it (minutes when cold;
 * progress goes to stderr). Throws when the build fails.
 */
export async function ensureHelm(root = cacheRoot()): Promise<string> {
  const path = helmPath(root);
  if (existsSync(path)) return path;
  const proc = Bun.spawn(["bash", join(import.meta.dir, "build-helm.sh")], {
    env: { ...process.env, DISTORT_CACHE: root, HELM_VERSION, KUBE_VERSION },
    stdout: "inherit",
    stderr: "inherit",
  });
  const code = await proc.exited;
  if (code !== 0)
    throw new Error(`building helm ${HELM_VERSION} failed (exit ${code}); see the output above`);
  if (!existsSync(path)) throw new Error(`helm build finished but ${path} is missing`);
  return path;
}
