// The cluster side of the plugin: the kubeconfig kubectl would use, a connection, and raw JSON
// reads and patches of built-in objects (PVCs, PVs, Pods, logs, Events, Secrets) by API path.
import { homedir } from "node:os";
import { resolve } from "node:path";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { UsageError } from "./exit-codes.ts";
import { describeFailure, resolveKubeconfig } from "./status.ts";

/**
 * Connects with the kubeconfig status.ts's resolveKubeconfig picks (flag, $KUBECONFIG, the lab's,
 * ~/.kube/config). kubectl hands a plugin its environment, so $KUBECONFIG is what kubectl used.
 * Throws UsageError when none exists or it cannot be loaded.
 */
export function openCluster(
  flag: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
): KubeConnection {
  const path = resolveKubeconfig({
    flag,
    env: env.KUBECONFIG,
    repoRoot: resolve(import.meta.dir, ".."),
    home: env.HOME ?? homedir(),
  });
  try {
    return connect(path);
  } catch (err) {
    throw new UsageError(
      `cannot use kubeconfig ${path}: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}

/** GET `path` as JSON; undefined on 404; UsageError (exit 2) with describeFailure's sentence otherwise. */
export async function getJson<T = Record<string, unknown>>(
  conn: KubeConnection,
  path: string,
  what: string,
): Promise<T | undefined> {
  let res: Response;
  try {
    res = await conn.request(path);
  } catch (err) {
    throw new UsageError(describeFailure(err, conn.server, what));
  }
  if (res.status === 404) return undefined;
  if (!res.ok) throw new UsageError(`${what}: HTTP ${res.status} ${(await res.text()).slice(0, 300)}`);
  return (await res.json()) as T;
}

/** GET `path` as text (Pod logs); undefined on 404 or 400 (a container that never started). */
export async function getText(conn: KubeConnection, path: string, what: string): Promise<string | undefined> {
  let res: Response;
  try {
    res = await conn.request(path);
  } catch (err) {
    throw new UsageError(describeFailure(err, conn.server, what));
  }
  if (res.status === 404 || res.status === 400) return undefined;
  if (!res.ok) throw new UsageError(`${what}: HTTP ${res.status}`);
  return res.text();
}

/** The `items` of a list at `path`; [] when the resource is not served (404). */
export async function listJson<T = Record<string, unknown>>(
  conn: KubeConnection,
  path: string,
  what: string,
): Promise<T[]> {
  const list = await getJson<{ items?: T[] }>(conn, path, what);
  return list?.items ?? [];
}
