// The chart's placement admission policy on a real kube-apiserver: a tenant with full rights over
// DISTORT's kinds in its own namespace cannot create a partition with placement set, nor set or
// change placement later, while the manager's own ServiceAccount (token from the chart's RBAC) can.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { renderKubeconfig } from "../lab/cluster/control-plane.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  applyChartRbac,
  type ChartRbac,
  clusterOf,
  mintToken,
  writeComponentKubeconfigs,
} from "../lab/harness/rbac.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { Discovery, type KubeDoc, render } from "./chart-support.ts";

const GROUP = "/apis/storage.distort.io/v1alpha1";
const MESSAGE = "are set by the DISTORT manager only";
/** Label on this file's namespaces: the binding is narrowed to them so other suites on a shared cluster are untouched. */
const SCOPE = "distort-test/admission-policy";

let tc: TestCluster;
let rbac: ChartRbac | undefined;
let dir: string;
const policyPaths: string[] = [];
const release = `distort-${Math.random().toString(16).slice(2, 8)}`;
let ns = "";
let tenantNs = "";
let tenant: KubeConnection;
let manager: KubeConnection;

async function labelNamespace(name: string) {
  const res = await tc.conn.request(`/api/v1/namespaces/${name}`, {
    method: "PATCH",
    contentType: "application/merge-patch+json",
    body: JSON.stringify({ metadata: { labels: { [SCOPE]: release } } }),
  });
  if (!res.ok) throw new Error(`label ${name}: HTTP ${res.status}`);
}

async function post(conn: KubeConnection, path: string, body: object) {
  const res = await conn.request(path, {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`POST ${path}: HTTP ${res.status} ${await res.text()}`);
}

/** A tenant: a ServiceAccount with every verb on every DISTORT kind in its own namespace. */
async function tenantConnection(namespace: string): Promise<KubeConnection> {
  await post(tc.conn, `/api/v1/namespaces/${namespace}/serviceaccounts`, { metadata: { name: "tenant" } });
  await post(tc.conn, `/apis/rbac.authorization.k8s.io/v1/namespaces/${namespace}/roles`, {
    metadata: { name: "tenant" },
    rules: [{ apiGroups: ["storage.distort.io"], resources: ["*"], verbs: ["*"] }],
  });
  await post(tc.conn, `/apis/rbac.authorization.k8s.io/v1/namespaces/${namespace}/rolebindings`, {
    metadata: { name: "tenant" },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "tenant" },
    subjects: [{ kind: "ServiceAccount", name: "tenant", namespace }],
  });
  const { server, caPem } = clusterOf(tc.conn);
  const path = join(dir, "tenant.kubeconfig");
  writeFileSync(
    path,
    renderKubeconfig(server, caPem, await mintToken(tc.conn, namespace, "tenant"), "tenant"),
    {
      mode: 0o600,
    },
  );
  return connect(path);
}

function partition(name: string, placed: boolean): object {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name },
    spec: {
      sizeBytes: 64 * 1024 * 1024,
      ...(placed
        ? {
            nodeName: "storage-a",
            deviceSerial: "VICTIM-DRIVE",
            claimRef: {
              namespace: "distort-system",
              name: "drive-1",
              uid: "6d1f7c1e-0000-4000-8000-000000000002",
            },
          }
        : {}),
    },
  };
}

interface Answer {
  status: number;
  message: string;
}

async function answer(res: Response): Promise<Answer> {
  const text = await res.text();
  let message = text;
  try {
    message = (JSON.parse(text) as { message?: string }).message ?? text;
  } catch {}
  return { status: res.status, message };
}

function create(conn: KubeConnection, namespace: string, body: object, dryRun = false): Promise<Answer> {
  return conn
    .request(`${GROUP}/namespaces/${namespace}/nvmepartitions${dryRun ? "?dryRun=All" : ""}`, {
      method: "POST",
      contentType: "application/json",
      body: JSON.stringify(body),
    })
    .then(answer);
}

function patch(conn: KubeConnection, namespace: string, name: string, body: object): Promise<Answer> {
  return conn
    .request(`${GROUP}/namespaces/${namespace}/nvmepartitions/${name}`, {
      method: "PATCH",
      contentType: "application/merge-patch+json",
      body: JSON.stringify(body),
    })
    .then(answer);
}

beforeAll(async () => {
  tc = await testCluster();
  dir = mkdtempSync(join(tmpdir(), "distort-admission-"));
  ns = await tc.namespace("vap-release");
  tenantNs = await tc.namespace("vap-tenant");
  for (const n of [ns, tenantNs]) await labelNamespace(n);
  rbac = await applyChartRbac(tc.conn, { namespace: ns, release });
  const ids = await writeComponentKubeconfigs(tc.conn, rbac, dir, ["manager"]);
  manager = connect((ids.get("manager") as { kubeconfigPath: string }).kubeconfigPath);
  tenant = await tenantConnection(tenantNs);

  const { objects } = await render(await ensureHelm(), { name: "default", files: [], set: [] }, release, ns);
  const policy = objects.filter((o) => o.kind === "ValidatingAdmissionPolicy");
  const binding = objects.filter((o) => o.kind === "ValidatingAdmissionPolicyBinding");
  expect(policy.length).toBe(1);
  expect(binding.length).toBe(1);
  const discovery = new Discovery(tc.conn);
  for (const o of [...policy, ...binding] as KubeDoc[]) {
    if (o.kind === "ValidatingAdmissionPolicyBinding") {
      // The shipped binding matches every namespace; here only this file's.
      (o.spec as Record<string, unknown>).matchResources = {
        namespaceSelector: { matchLabels: { [SCOPE]: release } },
      };
    }
    const { path } = await discovery.collectionPath(o);
    await post(tc.conn, path, o);
    policyPaths.push(`${path}/${o.metadata.name}`);
  }
  // The API server compiles and starts enforcing a new policy asynchronously.
  await eventually(
    async () => {
      const a = await create(tenant, tenantNs, partition("probe", true), true);
      return a.status === 403 && a.message.includes(MESSAGE);
    },
    30_000,
    "the placement policy enforced",
  );
}, 600_000);

afterAll(async () => {
  for (const p of policyPaths.reverse()) await tc.conn.request(p, { method: "DELETE" });
  await rbac?.removeClusterScoped();
  if (dir) rmSync(dir, { recursive: true, force: true });
  await tc?.stop();
});

describe("placement is the manager's (ValidatingAdmissionPolicy)", () => {
  test("the chart renders the policy by default and not when admissionPolicy.enabled=false", async () => {
    const off = await render(
      await ensureHelm(),
      { name: "off", files: [], set: ["admissionPolicy.enabled=false"] },
      release,
      ns,
    );
    expect(off.objects.some((o) => o.kind.startsWith("ValidatingAdmissionPolicy"))).toBe(false);
  });

  test("a tenant cannot create a partition with placement set, and nothing is stored", async () => {
    const a = await create(tenant, tenantNs, partition("placed-by-tenant", true));
    expect(a.status).toBe(403);
    expect(a.message).toContain(MESSAGE);
    expect(a.message).toContain(`${release}-placement`);
    const got = await tc.conn.request(`${GROUP}/namespaces/${tenantNs}/nvmepartitions/placed-by-tenant`);
    expect(got.status).toBe(404);
  });

  test("a tenant cannot pass a partition of its own off as a copy of a replicated volume", async () => {
    const fake = partition("fake-copy", false) as { spec: Record<string, unknown> };
    fake.spec.replicaOf = { name: "victim", uid: "6d1f7c1e-0000-4000-8000-0000000000aa" };
    const a = await create(tenant, tenantNs, fake);
    expect(a.status).toBe(403);
    expect(a.message).toContain("spec.replicaOf are set by the DISTORT manager only");
  });

  test("a tenant may create and resize an unplaced partition, but not place it or move its claim", async () => {
    expect((await create(tenant, tenantNs, partition("p1", false))).status).toBe(201);
    expect((await patch(tenant, tenantNs, "p1", { spec: { sizeBytes: 128 * 1024 * 1024 } })).status).toBe(
      200,
    );
    const place = await patch(tenant, tenantNs, "p1", {
      spec: { nodeName: "storage-a", deviceSerial: "VICTIM-DRIVE" },
    });
    expect(place.status).toBe(403);
    expect(place.message).toContain(MESSAGE);
    const claimOnly = await patch(tenant, tenantNs, "p1", {
      spec: { claimRef: { namespace: "distort-system", name: "drive-1", uid: "u-1" } },
    });
    expect(claimOnly.status).toBe(403);
  });

  test("the manager's ServiceAccount places the partition; afterwards the tenant cannot change the claim", async () => {
    const placed = await patch(manager, tenantNs, "p1", {
      spec: {
        nodeName: "storage-a",
        deviceSerial: "DRIVE-A",
        claimRef: { namespace: ns, name: "drive-a", uid: "claim-uid-a" },
      },
    });
    expect(placed.status).toBe(200);
    // spec.claimRef is not immutable in the CRD: only the policy stands between a tenant and it.
    const moved = await patch(tenant, tenantNs, "p1", {
      spec: { claimRef: { namespace: ns, name: "drive-b", uid: "claim-uid-b" } },
    });
    expect(moved.status).toBe(403);
    expect(moved.message).toContain(MESSAGE);
    // Writes that leave placement as it is still pass (the CSI controller grows volumes this way).
    expect((await patch(tenant, tenantNs, "p1", { spec: { sizeBytes: 256 * 1024 * 1024 } })).status).toBe(
      200,
    );
  });

  test("even the cluster admin cannot place a partition by hand", async () => {
    const a = await create(tc.conn, tenantNs, partition("placed-by-admin", true));
    expect(a.status).toBe(403);
    expect(a.message).toContain(MESSAGE);
  });
});
