// Gives integration tests a real control plane: the one the suite runner started (its kubeconfig
// in DISTORT_TEST_KUBECONFIG) or, when a file runs alone, one of its own that afterAll stops.
// CRDs are installed either way. Tests isolate themselves with unique namespaces and names.

import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { connect, type KubeConnection } from "../../lib/kube/connection.ts";
import { type ControlPlane, startControlPlane } from "./control-plane.ts";
import { installCrds } from "./crds.ts";

export interface TestCluster {
  conn: KubeConnection;
  kubeconfigPath: string;
  /** Present only when this file started its own control plane. */
  own?: ControlPlane;
  /** Creates a namespace with a unique name for one test. */
  namespace(prefix?: string): Promise<string>;
  stop(): Promise<void>;
}

export async function testCluster(): Promise<TestCluster> {
  const shared = process.env.DISTORT_TEST_KUBECONFIG;
  const own = shared ? undefined : await startControlPlane({});
  const kubeconfigPath = shared ?? (own as ControlPlane).kubeconfigPath;
  const conn = connect(kubeconfigPath);
  await installCrds(conn);
  const core = conn.api(k8s.CoreV1Api);
  return {
    conn,
    kubeconfigPath,
    own,
    async namespace(prefix = "t") {
      const name = `${prefix}-${randomBytes(4).toString("hex")}`;
      await core.createNamespace({ body: { metadata: { name } } });
      return name;
    },
    async stop() {
      await own?.stop();
    },
  };
}

/** Polls `fn` until it returns a value other than undefined/false, or fails after timeoutMs. */
export async function eventually<T>(
  fn: () => T | Promise<T>,
  timeoutMs = 10_000,
  what = "condition",
): Promise<Exclude<T, undefined | false>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as Exclude<T, undefined | false>;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await Bun.sleep(25);
  }
}

/**
 * Polls `fn` until it reports done, for work whose speed depends on the machine's load: fails
 * only when `progress` has not grown for `stallMs` (the work is stuck, not slow), or after
 * `maxMs` in all. Returns the last value; a throw from `fn` counts as no progress.
 */
export async function untilDone<T>(
  fn: () => Promise<{ done: boolean; progress: number; value: T }>,
  opts: { stallMs: number; maxMs: number; what: string; describe?: (v: T) => string },
): Promise<T> {
  const start = Date.now();
  let best = Number.NEGATIVE_INFINITY;
  let movedAt = start;
  let last: { value: T } | undefined;
  let lastErr: unknown;
  for (;;) {
    try {
      const r = await fn();
      last = r;
      if (r.done) return r.value;
      if (r.progress > best) {
        best = r.progress;
        movedAt = Date.now();
      }
    } catch (err) {
      lastErr = err;
    }
    const now = Date.now();
    if (now - movedAt > opts.stallMs || now - start > opts.maxMs) {
      const why = now - start > opts.maxMs ? `after ${opts.maxMs} ms` : `no progress for ${opts.stallMs} ms`;
      const seen = last && opts.describe ? `; last: ${opts.describe(last.value)}` : "";
      throw new Error(`${opts.what}: ${why}${seen}${lastErr ? `; ${String(lastErr)}` : ""}`);
    }
    await Bun.sleep(100);
  }
}
