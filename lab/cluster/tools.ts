// Locates the Go-built control-plane tools in the version-keyed cache and builds missing ones by
// running lab/cluster/build-tools.sh (the one build recipe, shared with CI and the lab command).
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

export const KUBE_VERSION = "v1.36.1";
export const ETCD_VERSION = "v3.6.16";

export interface ToolPaths {
  etcd: string;
  kubeApiserver: string;
  kubeControllerManager: string;
  kubectl: string;
}

/** The cache root; DISTORT_CACHE overrides it so CI or a developer can relocate the cache. */
export function cacheRoot(env: Record<string, string | undefined> = process.env): string {
  return env.DISTORT_CACHE ?? join(homedir(), ".cache", "distort");
}

export function toolPaths(root = cacheRoot()): ToolPaths {
  const kube = join(root, "kube", KUBE_VERSION);
  return {
    etcd: join(root, "etcd", ETCD_VERSION, "etcd"),
    kubeApiserver: join(kube, "kube-apiserver"),
    kubeControllerManager: join(kube, "kube-controller-manager"),
    kubectl: join(kube, "kubectl"),
  };
}

/**
 * Returns the tool paths, building whatever is missing first. The build streams its progress to
 * stderr; a cold build takes minutes, a warm call returns at once. Throws if the build fails.
 */
export async function ensureTools(root = cacheRoot()): Promise<ToolPaths> {
  const paths = toolPaths(root);
  if (Object.values(paths).every((p) => existsSync(p))) return paths;
  const script = join(import.meta.dir, "build-tools.sh");
  const proc = Bun.spawn(["bash", script, "all"], {
    env: { ...process.env, DISTORT_CACHE: root, KUBE_VERSION, ETCD_VERSION },
    stdout: "inherit",
    stderr: "inherit",
  });
  const code = await proc.exited;
  if (code !== 0) throw new Error(`building control-plane tools failed (exit ${code}); see the output above`);
  for (const [name, p] of Object.entries(paths)) {
    if (!existsSync(p)) throw new Error(`build finished but ${name} is missing at ${p}`);
  }
  return paths;
}
