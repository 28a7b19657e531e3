// Test support for the chart: runs the cached helm, renders a profile (default values, an example
// values file, extra --set flags) into parsed documents, and maps each object to its API path via
// the API server's discovery, for dry-run and real creation through conn.request.
import { readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";
import type { KubeConnection } from "../lib/kube/connection.ts";

export const CHART_DIR = join(import.meta.dir, "distort");
const HELM_HOME = join(tmpdir(), "distort-helm-home");

/** --set flags that swap upstream's registrar and liveness probe for DISTORT's equivalents. */
export const DISTORT_SIDECARS: readonly string[] = ["nodeDriverRegistrar", "livenessProbe"].flatMap((s) => [
  `sidecars.${s}.image=`,
  `sidecars.${s}.resources.requests.cpu=5m`,
  `sidecars.${s}.resources.requests.memory=64Mi`,
  `sidecars.${s}.resources.limits.cpu=500m`,
  `sidecars.${s}.resources.limits.memory=192Mi`,
]);

export interface Profile {
  name: string;
  /** Values files relative to the chart directory. */
  files: string[];
  set: readonly string[];
  /** --set-string flags (image tags, which --set would turn into numbers when all digits). */
  setString?: readonly string[];
}

/** The default values, every examples/*.yaml, and the switches the examples leave off. */
export function profiles(): Profile[] {
  const examples = readdirSync(join(CHART_DIR, "examples"))
    .filter((f) => f.endsWith(".yaml"))
    .sort()
    .map((f) => ({ name: `examples/${f}`, files: [`examples/${f}`], set: [] }));
  return [
    { name: "default", files: [], set: [] },
    ...examples,
    // VolumeSnapshotClass and csi-snapshotter render only when asked for.
    { name: "snapshots", files: [], set: ["snapshots.enabled=true"] },
    // DISTORT's own node-driver-registrar and livenessprobe (csi/sidecar/) in place of upstream's.
    { name: "distort-sidecars", files: [], set: DISTORT_SIDECARS },
    // The PrometheusRule, the dashboard ConfigMap and the ServiceMonitor are off by default.
    {
      name: "monitoring",
      files: [],
      set: [
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "metrics.serviceMonitor.enabled=true",
      ],
    },
  ];
}

export interface HelmResult {
  code: number;
  stdout: string;
  stderr: string;
}

export async function runHelm(helm: string, args: string[]): Promise<HelmResult> {
  const p = Bun.spawn([helm, ...args], {
    stdout: "pipe",
    stderr: "pipe",
    // Keep helm away from any user configuration and repositories.
    env: {
      PATH: process.env.PATH ?? "",
      HOME: HELM_HOME,
      HELM_CACHE_HOME: join(HELM_HOME, "cache"),
      HELM_CONFIG_HOME: join(HELM_HOME, "config"),
      HELM_DATA_HOME: join(HELM_HOME, "data"),
    },
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, stdout, stderr };
}

export function valueArgs(p: Profile): string[] {
  return [
    ...p.files.flatMap((f) => ["-f", join(CHART_DIR, f)]),
    ...p.set.flatMap((s) => ["--set", s]),
    ...(p.setString ?? []).flatMap((s) => ["--set-string", s]),
  ];
}

export interface KubeDoc {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [key: string]: unknown;
}

export interface Rendered {
  objects: KubeDoc[];
  /** The same documents with their comments, for the RBAC justification check. */
  docs: ReturnType<typeof parseAllDocuments>;
}

/** `helm template` of the profile; throws with helm's stderr when rendering fails. */
export async function render(
  helm: string,
  p: Profile,
  release: string,
  namespace: string,
): Promise<Rendered> {
  const r = await runHelm(helm, ["template", release, CHART_DIR, "--namespace", namespace, ...valueArgs(p)]);
  if (r.code !== 0) throw new Error(`helm template (${p.name}) failed: ${r.stderr}`);
  const docs = parseAllDocuments(r.stdout);
  const list = Array.isArray(docs) ? docs : [docs];
  const objects = list.map((d) => d.toJS() as KubeDoc | null).filter((o): o is KubeDoc => o !== null);
  return { objects, docs: list as ReturnType<typeof parseAllDocuments> };
}

interface ApiResource {
  name: string;
  kind: string;
  namespaced: boolean;
}

/** Resolves kinds to REST paths through discovery (cached per group/version). */
export class Discovery {
  readonly #cache = new Map<string, ApiResource[]>();
  constructor(private readonly conn: KubeConnection) {}

  async #resources(apiVersion: string): Promise<ApiResource[]> {
    const cached = this.#cache.get(apiVersion);
    if (cached) return cached;
    const path = apiVersion === "v1" ? "/api/v1" : `/apis/${apiVersion}`;
    const res = await this.conn.request(path);
    if (!res.ok) throw new Error(`discovery ${path}: HTTP ${res.status}`);
    const list = ((await res.json()) as { resources: ApiResource[] }).resources.filter(
      (r) => !r.name.includes("/"),
    );
    this.#cache.set(apiVersion, list);
    return list;
  }

  forget(apiVersion: string): void {
    this.#cache.delete(apiVersion);
  }

  /** The collection path an object of this kind is created under. */
  async collectionPath(o: KubeDoc): Promise<{ path: string; namespaced: boolean }> {
    const r = (await this.#resources(o.apiVersion)).find((x) => x.kind === o.kind);
    if (!r) throw new Error(`the API server serves no ${o.kind} in ${o.apiVersion}`);
    const base = o.apiVersion === "v1" ? "/api/v1" : `/apis/${o.apiVersion}`;
    if (!r.namespaced) return { path: `${base}/${r.name}`, namespaced: false };
    const ns = o.metadata.namespace;
    if (!ns) throw new Error(`${o.kind} ${o.metadata.name} is namespaced but rendered without a namespace`);
    return { path: `${base}/namespaces/${ns}/${r.name}`, namespaced: true };
  }
}

/** POSTs one object (dry run unless told otherwise) with strict field validation. */
export async function submit(
  conn: KubeConnection,
  discovery: Discovery,
  o: KubeDoc,
  opts: { dryRun: boolean },
): Promise<{ status: number; body: string }> {
  const { path } = await discovery.collectionPath(o);
  const q = `fieldValidation=Strict${opts.dryRun ? "&dryRun=All" : ""}`;
  const res = await conn.request(`${path}?${q}`, {
    method: "POST",
    body: JSON.stringify(o),
    contentType: "application/json",
  });
  return { status: res.status, body: await res.text() };
}

/** Creates an object, treating "already exists" as done. */
export async function ensure(conn: KubeConnection, path: string, body: object): Promise<void> {
  const res = await conn.request(path, {
    method: "POST",
    body: JSON.stringify(body),
    contentType: "application/json",
  });
  if (!res.ok && res.status !== 409) throw new Error(`POST ${path}: HTTP ${res.status} ${await res.text()}`);
}
