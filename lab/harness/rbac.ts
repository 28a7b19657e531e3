// The chart's own identities in the lab: renders the chart's RBAC (ServiceAccounts, Roles,
// ClusterRoles and their bindings) with helm, applies it with the admin connection, mints a token
// per component ServiceAccount (TokenRequest) and writes one kubeconfig per component.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Discovery, type KubeDoc, render } from "../../helm/chart-support.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { renderKubeconfig } from "../cluster/control-plane.ts";
import { ensureHelm } from "../cluster/helm-tool.ts";

/** The chart's components, each with its own ServiceAccount (label app.kubernetes.io/component). */
export type ChartComponent = "manager" | "agent" | "csi-controller" | "csi-node" | "dpu";

/** The RBAC kinds the chart renders, in the order they are applied (subjects before bindings). */
export const RBAC_KINDS = ["ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"];

/** One hour: longer than a conformance run (csi-sanity's own timeout is 20 minutes). */
export const TOKEN_SECONDS = 3600;

const COMPONENT_LABEL = "app.kubernetes.io/component";

export interface ChartRbac {
  release: string;
  namespace: string;
  /** The applied objects, in application order. */
  objects: KubeDoc[];
  /** ServiceAccount name per component the rendered chart has. */
  serviceAccounts: Partial<Record<ChartComponent, string>>;
  /** Deletes the cluster-scoped objects (namespaced ones go with their namespace). Idempotent. */
  removeClusterScoped(): Promise<void>;
}

/**
 * Renders the chart's RBAC objects for `namespace` (`helm template`, default values plus `set`)
 * and creates or replaces each through `admin`. Idempotent: a second call converges the same
 * objects (a binding whose roleRef changed is deleted and recreated, roleRef being immutable).
 * ClusterRoles and ClusterRoleBindings are named after the release, so two namespaces on one
 * cluster need two release names. Throws on any refusal by the API server.
 */
export async function applyChartRbac(
  admin: KubeConnection,
  opts: { namespace: string; release?: string; set?: string[]; helm?: string },
): Promise<ChartRbac> {
  const release = opts.release ?? "distort";
  const helm = opts.helm ?? (await ensureHelm());
  const { objects } = await render(
    helm,
    { name: "lab-rbac", files: [], set: opts.set ?? [] },
    release,
    opts.namespace,
  );
  const rbac = RBAC_KINDS.flatMap((k) => objects.filter((o) => o.kind === k));
  const discovery = new Discovery(admin);
  const clusterPaths: string[] = [];
  for (const o of rbac) {
    const { path, namespaced } = await discovery.collectionPath(o);
    await createOrReplace(admin, path, o);
    if (!namespaced) clusterPaths.push(`${path}/${o.metadata.name}`);
  }
  const serviceAccounts: Partial<Record<ChartComponent, string>> = {};
  for (const sa of rbac.filter((o) => o.kind === "ServiceAccount")) {
    const component = sa.metadata.labels?.[COMPONENT_LABEL];
    if (component) serviceAccounts[component as ChartComponent] = sa.metadata.name;
  }
  return {
    release,
    namespace: opts.namespace,
    objects: rbac,
    serviceAccounts,
    async removeClusterScoped() {
      for (const p of [...clusterPaths].reverse()) {
        const res = await admin.request(p, { method: "DELETE" });
        if (!res.ok && res.status !== 404)
          throw new Error(`DELETE ${p}: HTTP ${res.status} ${await res.text()}`);
      }
    },
  };
}

async function createOrReplace(conn: KubeConnection, collection: string, o: KubeDoc): Promise<void> {
  const body = (x: object) => ({ body: JSON.stringify(x), contentType: "application/json" });
  const what = `${o.kind} ${o.metadata.name}`;
  const created = await conn.request(collection, { method: "POST", ...body(o) });
  if (created.ok) return;
  if (created.status !== 409)
    throw new Error(`create ${what}: HTTP ${created.status} ${await created.text()}`);
  const path = `${collection}/${o.metadata.name}`;
  const current = await conn.request(path);
  if (!current.ok) throw new Error(`get ${what}: HTTP ${current.status} ${await current.text()}`);
  const existing = (await current.json()) as { metadata: { resourceVersion: string }; secrets?: unknown };
  // A ServiceAccount keeps what the token controller may have added; everything else is replaced.
  const replacement = {
    ...o,
    ...(existing.secrets === undefined ? {} : { secrets: existing.secrets }),
    metadata: { ...o.metadata, resourceVersion: existing.metadata.resourceVersion },
  };
  const replaced = await conn.request(path, { method: "PUT", ...body(replacement) });
  if (replaced.ok) return;
  const text = await replaced.text();
  // roleRef of a binding cannot change in place.
  if (replaced.status === 422 && o.kind.endsWith("Binding")) {
    const del = await conn.request(path, { method: "DELETE" });
    if (!del.ok && del.status !== 404) throw new Error(`delete ${what}: HTTP ${del.status}`);
    const again = await conn.request(collection, { method: "POST", ...body(o) });
    if (again.ok) return;
    throw new Error(`recreate ${what}: HTTP ${again.status} ${await again.text()}`);
  }
  throw new Error(`replace ${what}: HTTP ${replaced.status} ${text}`);
}

/** Server URL and CA (PEM) of the admin connection's current cluster. */
export function clusterOf(admin: KubeConnection): { server: string; caPem: string } {
  const cluster = admin.kc.getCurrentCluster();
  if (!cluster) throw new Error("the admin kubeconfig has no current cluster");
  const caPem = cluster.caData
    ? Buffer.from(cluster.caData, "base64").toString("utf8")
    : cluster.caFile
      ? readFileSync(cluster.caFile, "utf8")
      : "";
  return { server: admin.server, caPem };
}

/**
 * Mints a token for ServiceAccount `name` in `namespace` (TokenRequest through `admin`, bound to
 * nothing, `expirationSeconds` long; the API server may shorten it) and returns it. Each call
 * mints a fresh token; earlier ones stay valid until they expire.
 */
export async function mintToken(
  admin: KubeConnection,
  namespace: string,
  name: string,
  expirationSeconds = TOKEN_SECONDS,
): Promise<string> {
  const res = await admin.request(`/api/v1/namespaces/${namespace}/serviceaccounts/${name}/token`, {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify({
      apiVersion: "authentication.k8s.io/v1",
      kind: "TokenRequest",
      spec: { expirationSeconds },
    }),
  });
  if (res.status !== 201)
    throw new Error(`TokenRequest for ${namespace}/${name}: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { status: { token: string } }).status.token;
}

export interface ComponentIdentity {
  component: ChartComponent;
  serviceAccount: string;
  /** system:serviceaccount:<namespace>:<name>, as the API server authenticates the token. */
  username: string;
  /** A kubeconfig (0600) with the admin kubeconfig's server and CA and this token as its user. */
  kubeconfigPath: string;
}

/**
 * Writes `<dir>/<component>.kubeconfig` for each component the applied chart has a ServiceAccount
 * for (or only those in `components`), each with a freshly minted token. Throws when a requested
 * component has no ServiceAccount in the chart. Tokens last `expirationSeconds` (the API server
 * may shorten them).
 */
export async function writeComponentKubeconfigs(
  admin: KubeConnection,
  rbac: ChartRbac,
  dir: string,
  components?: ChartComponent[],
  expirationSeconds = TOKEN_SECONDS,
): Promise<Map<ChartComponent, ComponentIdentity>> {
  const { server, caPem } = clusterOf(admin);
  const wanted = components ?? (Object.keys(rbac.serviceAccounts) as ChartComponent[]);
  const out = new Map<ChartComponent, ComponentIdentity>();
  for (const component of wanted) {
    const sa = rbac.serviceAccounts[component];
    if (!sa) throw new Error(`the chart renders no ServiceAccount for ${component}`);
    const token = await mintToken(admin, rbac.namespace, sa, expirationSeconds);
    const kubeconfigPath = join(dir, `${component}.kubeconfig`);
    writeFileSync(kubeconfigPath, renderKubeconfig(server, caPem, token, sa), { mode: 0o600 });
    out.set(component, {
      component,
      serviceAccount: sa,
      username: `system:serviceaccount:${rbac.namespace}:${sa}`,
      kubeconfigPath,
    });
  }
  return out;
}
