// Installs the chart's CRDs (helm/distort/crds/*.yaml) into a cluster and waits until each is
// Established, the way helm's crds/ directory would before any object of the kinds is created.
import * as k8s from "@kubernetes/client-node";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "yaml";
import { kubeError } from "../../lib/kube/resource.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";

export const CRD_DIR = join(import.meta.dir, "..", "..", "helm", "distort", "crds");

export function readCrds(dir = CRD_DIR): k8s.V1CustomResourceDefinition[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".yaml"))
    .sort()
    .map((f) => parse(readFileSync(join(dir, f), "utf8")) as k8s.V1CustomResourceDefinition);
}

function established(crd: k8s.V1CustomResourceDefinition): boolean {
  const conds = crd.status?.conditions ?? [];
  return ["Established", "NamesAccepted"].every((t) => conds.some((c) => c.type === t && c.status === "True"));
}

/** Creates or updates every CRD, then waits (up to timeoutMs) until all are Established. */
export async function installCrds(conn: KubeConnection, dir = CRD_DIR, timeoutMs = 30_000): Promise<string[]> {
  const api = conn.api(k8s.ApiextensionsV1Api);
  const names: string[] = [];
  for (const crd of readCrds(dir)) {
    const name = crd.metadata?.name as string;
    names.push(name);
    try {
      await api.createCustomResourceDefinition({ body: crd });
    } catch (err) {
      const e = kubeError(err, `create CRD ${name}`);
      if (e.kind !== "already-exists") throw e;
      const current = await api.readCustomResourceDefinition({ name });
      await api.replaceCustomResourceDefinition({
        name,
        body: { ...crd, metadata: { ...crd.metadata, resourceVersion: current.metadata?.resourceVersion } },
      });
    }
  }
  const deadline = Date.now() + timeoutMs;
  for (const name of names) {
    for (;;) {
      const crd = await api.readCustomResourceDefinition({ name });
      if (established(crd)) break;
      if (Date.now() > deadline) throw new Error(`CRD ${name} not Established after ${timeoutMs} ms`);
      await Bun.sleep(50);
    }
  }
  // Discovery lags Established by a moment; a list through the new endpoint proves it serves.
  for (const crd of readCrds(dir)) {
    const v = crd.spec.versions.find((x) => x.served)?.name;
    for (;;) {
      const r = await conn.request(`/apis/${crd.spec.group}/${v}/${crd.spec.names.plural}?limit=1`);
      if (r.ok) break;
      if (Date.now() > deadline) throw new Error(`${crd.spec.names.plural} not served: HTTP ${r.status}`);
      await Bun.sleep(50);
    }
  }
  return names;
}
