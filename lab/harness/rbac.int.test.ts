// The lab's chart identities against a real API server: the chart's RBAC applies (twice, as a
// restarted lab does), each component's kubeconfig authenticates as that component's
// ServiceAccount, and a component token is held to its grants where the admin is not.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type KubeConnection } from "../../lib/kube/connection.ts";
import { type TestCluster, testCluster } from "../cluster/test-support.ts";
import { applyChartRbac, type ChartComponent, type ChartRbac, writeComponentKubeconfigs } from "./rbac.ts";

let tc: TestCluster;
let rbac: ChartRbac;
let dir: string;

beforeAll(async () => {
  tc = await testCluster();
  dir = mkdtempSync(join(tmpdir(), "distort-lab-rbac-"));
}, 600_000);

afterAll(async () => {
  await rbac?.removeClusterScoped();
  if (dir) rmSync(dir, { recursive: true, force: true });
  await tc?.stop();
});

async function whoAmI(conn: KubeConnection): Promise<string> {
  const res = await conn.request("/apis/authentication.k8s.io/v1/selfsubjectreviews", {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify({ apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" }),
  });
  if (res.status !== 201) throw new Error(`SelfSubjectReview: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { status: { userInfo: { username: string } } }).status.userInfo.username;
}

describe("chart identities in the lab", () => {
  let ns = "";
  const release = `distort-${Math.random().toString(16).slice(2, 8)}`;
  const components: ChartComponent[] = ["manager", "agent", "csi-controller", "csi-node", "dpu"];

  test("the chart's RBAC applies, and applies again unchanged", async () => {
    ns = await tc.namespace("lab-rbac");
    rbac = await applyChartRbac(tc.conn, { namespace: ns, release, set: ["dpu.enabled=true"] });
    const again = await applyChartRbac(tc.conn, { namespace: ns, release, set: ["dpu.enabled=true"] });
    expect(again.objects.map((o) => `${o.kind}/${o.metadata.name}`)).toEqual(
      rbac.objects.map((o) => `${o.kind}/${o.metadata.name}`),
    );
    expect(Object.keys(rbac.serviceAccounts).sort()).toEqual([...components].sort());
    for (const kind of ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"])
      expect(rbac.objects.some((o) => o.kind === kind)).toBe(true);
  }, 120_000);

  test("each component's kubeconfig authenticates as its own ServiceAccount", async () => {
    const ids = await writeComponentKubeconfigs(tc.conn, rbac, dir, components);
    expect([...ids.keys()].sort()).toEqual([...components].sort());
    for (const [component, id] of ids) {
      expect(statSync(id.kubeconfigPath).mode & 0o777).toBe(0o600);
      expect(id.serviceAccount).toBe(`${release}-${component}`);
      expect(await whoAmI(connect(id.kubeconfigPath))).toBe(
        `system:serviceaccount:${ns}:${id.serviceAccount}`,
      );
    }
    expect(await whoAmI(tc.conn)).not.toContain("system:serviceaccount:");
  });

  test("the agent's token cannot list Secrets cluster-wide; the admin can", async () => {
    const ids = await writeComponentKubeconfigs(tc.conn, rbac, dir, ["agent"]);
    const agent = connect(ids.get("agent")?.kubeconfigPath);
    expect((await agent.request("/api/v1/secrets")).status).toBe(403);
    expect((await agent.request(`/api/v1/namespaces/${ns}/secrets`)).status).toBe(403);
    // What the agent is granted works: reading one Secret in its namespace (absent: 404, not 403).
    expect((await agent.request(`/api/v1/namespaces/${ns}/secrets/absent`)).status).toBe(404);
    expect((await tc.conn.request("/api/v1/secrets")).status).toBe(200);
  });

  test("removing the cluster-scoped objects is idempotent and revokes the cluster grants", async () => {
    const ids = await writeComponentKubeconfigs(tc.conn, rbac, dir, ["csi-node"]);
    const node = connect(ids.get("csi-node")?.kubeconfigPath);
    expect((await node.request("/api/v1/nodes/absent")).status).toBe(404);
    await rbac.removeClusterScoped();
    await rbac.removeClusterScoped();
    expect((await node.request("/api/v1/nodes/absent")).status).toBe(403);
  });
});
