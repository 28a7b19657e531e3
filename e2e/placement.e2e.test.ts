// Placement is the manager's, on the lab: a tenant with every right over DISTORT's kinds in its own
// namespace cannot create a partition placed on a real claimed drive (the chart's admission
// policy, applied by the API server); and with the policy's binding removed, the agent still
// refuses it (no ledger entry), exports nothing for it, the manager does not adopt it into the
// drive's ledger, and the tenant can delete it at once.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { externalIdFor, nqnFor } from "../agent/partitions/identity.ts";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { Discovery, type KubeDoc, render } from "../helm/chart-support.ts";
import { renderKubeconfig } from "../lab/cluster/control-plane.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { clusterOf, mintToken } from "../lab/harness/rbac.ts";
import { call } from "../lab/sim/spdk/raw-rpc-client.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { type E2eLab, e2eLab, until } from "./support.ts";

const GROUP = "/apis/storage.distort.io/v1alpha1";
const MESSAGE = "are set by the DISTORT manager only";

let lab: E2eLab;
let dir: string;
let tenant: KubeConnection;
let tenantNs: string;
let binding: KubeDoc;
let bindingPath = "";

async function post(
  conn: KubeConnection,
  path: string,
  body: object,
): Promise<{ status: number; text: string }> {
  const res = await conn.request(path, {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

beforeAll(async () => {
  lab = await e2eLab();
  dir = mkdtempSync(join(tmpdir(), "distort-e2e-placement-"));
  tenantNs = await lab.newNamespace("tenant");
  for (const [path, body] of [
    [`/api/v1/namespaces/${tenantNs}/serviceaccounts`, { metadata: { name: "tenant" } }],
    [
      `/apis/rbac.authorization.k8s.io/v1/namespaces/${tenantNs}/roles`,
      {
        metadata: { name: "tenant" },
        rules: [{ apiGroups: ["storage.distort.io"], resources: ["*"], verbs: ["*"] }],
      },
    ],
    [
      `/apis/rbac.authorization.k8s.io/v1/namespaces/${tenantNs}/rolebindings`,
      {
        metadata: { name: "tenant" },
        roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "tenant" },
        subjects: [{ kind: "ServiceAccount", name: "tenant", namespace: tenantNs }],
      },
    ],
  ] as const) {
    const r = await post(lab.conn, path, body);
    if (r.status !== 201) throw new Error(`POST ${path}: ${r.status} ${r.text}`);
  }
  const { server, caPem } = clusterOf(lab.conn);
  const kubeconfig = join(dir, "tenant.kubeconfig");
  writeFileSync(
    kubeconfig,
    renderKubeconfig(server, caPem, await mintToken(lab.conn, tenantNs, "tenant"), "tenant"),
    {
      mode: 0o600,
    },
  );
  tenant = connect(kubeconfig);
  const chart = await render(
    await ensureHelm(),
    { name: "lab", files: [lab.values], set: [] },
    lab.release,
    lab.namespace,
  );
  binding = chart.objects.find((o) => o.kind === "ValidatingAdmissionPolicyBinding") as KubeDoc;
  expect(binding).toBeDefined();
  bindingPath = `${(await new Discovery(lab.conn).collectionPath(binding)).path}/${binding.metadata.name}`;
}, 600_000);

afterAll(async () => {
  // Whatever happened, the lab keeps its policy for the suites after this one.
  if (bindingPath && (await lab.conn.request(bindingPath)).status === 404) {
    await post(lab.conn, bindingPath.slice(0, bindingPath.lastIndexOf("/")), binding);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
  await lab?.stop();
}, 120_000);

/** A claimed drive of the lab, and a partition placed on it as the manager would write it. */
async function victimDrive(): Promise<NVMeDevice> {
  const devices = (await new ResourceClient(lab.conn, kinds.NVMeDevice).list()).items;
  const d = devices.find(
    (x) => x.status?.claimRef && x.status.phase === "Claimed" && x.status.activeBackend !== "kernel",
  );
  if (!d) throw new Error("the lab has no claimed drive");
  return d;
}

function placedOn(name: string, d: NVMeDevice): object {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name },
    spec: {
      sizeBytes: 64 * 1024 * 1024,
      nodeName: d.spec.nodeName,
      deviceSerial: d.spec.serial,
      claimRef: d.status?.claimRef,
      targetOptions: { transport: "tcp" },
    },
  };
}

test("a tenant cannot create a partition placed on another tenant's drive", async () => {
  const d = await victimDrive();
  const r = await post(tenant, `${GROUP}/namespaces/${tenantNs}/nvmepartitions`, placedOn("placed", d));
  expect(r.status).toBe(403);
  expect(r.text).toContain(MESSAGE);
});

test("with the policy unbound, a tenant's placement is never served (the agent watches only its namespace) and the ledger does not adopt it", async () => {
  const d = await victimDrive();
  const del = await lab.conn.request(bindingPath, { method: "DELETE" });
  expect(del.status).toBe(200);
  try {
    // The API server stops enforcing the unbound policy asynchronously.
    const created = await until(
      "the policy no longer enforced",
      async () => {
        const r = await post(tenant, `${GROUP}/namespaces/${tenantNs}/nvmepartitions`, placedOn("bypass", d));
        return r.status === 201 ? (JSON.parse(r.text) as NVMePartition) : undefined;
      },
      30_000,
    );
    const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
    // The capacity reconciler has seen it (it counts against free bytes) but wrote no entry for it.
    const devices = new ResourceClient(lab.conn, kinds.NVMeDevice);
    const after = await until(
      "the drive's free bytes to count the partition",
      async () => {
        const x = await devices.get(d.metadata.name);
        return x && (x.status?.freeBytes ?? 0) <= (d.status?.freeBytes ?? 0) - 64 * 1024 * 1024
          ? x
          : undefined;
      },
      30_000,
    );
    expect((after.status?.reservations ?? []).some((r) => r.uid === created.metadata.uid)).toBe(false);
    // The agent serves only its own (release) namespace: the tenant's placement is never taken up.
    const seen = await parts.get("bypass", tenantNs);
    expect(seen?.metadata.finalizers ?? []).toEqual([]);
    expect(seen?.status?.state === "Exported" || seen?.status?.state === "Provisioning").toBe(false);
    const node = lab.storage.find((s) => s.name === d.spec.nodeName);
    if (!node) throw new Error(`no lab storage node ${d.spec.nodeName}`);
    const nqn = nqnFor(externalIdFor(created.metadata.uid as string));
    const subsystems = (await call(node.spdkSocket, "nvmf_get_subsystems")) as { nqn: string }[];
    expect(subsystems.map((s) => s.nqn)).not.toContain(nqn);
    // Nothing of ours holds it: the tenant's delete is immediate.
    await new ResourceClient(tenant, kinds.NVMePartition).delete("bypass", tenantNs);
    await until("deleted", async () => !(await parts.get("bypass", tenantNs)), 15_000);
  } finally {
    await post(lab.conn, bindingPath.slice(0, bindingPath.lastIndexOf("/")), binding);
  }
}, 120_000);
