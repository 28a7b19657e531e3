// Installs the chart's CRDs (helm/distort/crds/*.yaml) into a cluster and waits until each is
// Established, the way helm's crds/ directory would before any object of the kinds is created.

import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { parse } from "yaml";
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
  return ["Established", "NamesAccepted"].every((t) =>
    conds.some((c) => c.type === t && c.status === "True"),
  );
}

/**
 * Creates or updates every CRD, then waits (up to timeoutMs) until all are Established. Writes go
 * as raw JSON: client-node's typed model would drop schema keys it renames (enum, default,
 * x-kubernetes-validations), silently disabling validation.
 */
export async function installCrds(
  conn: KubeConnection,
  dir = CRD_DIR,
  timeoutMs = 30_000,
): Promise<string[]> {
  const api = conn.api(k8s.ApiextensionsV1Api);
  const base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
  const names: string[] = [];
  for (const crd of readCrds(dir)) {
    const name = crd.metadata?.name as string;
    names.push(name);
    const json = { contentType: "application/json" };
    let res = await conn.request(base, { ...json, method: "POST", body: JSON.stringify(crd) });
    if (res.status === 409) {
      const current = (await (
        await conn.request(`${base}/${name}`)
      ).json()) as k8s.V1CustomResourceDefinition;
      const body = {
        ...crd,
        metadata: { ...crd.metadata, resourceVersion: current.metadata?.resourceVersion },
      };
      res = await conn.request(`${base}/${name}`, { ...json, method: "PUT", body: JSON.stringify(body) });
    }
    if (!res.ok)
      throw new Error(`installing CRD ${name}: HTTP ${res.status} ${(await res.text()).slice(0, 500)}`);
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
