// Least privilege, checked two ways. The listing test enumerates every verb on every resource the
// rendered Roles and ClusterRoles grant, per component, fails on a rule without a justification
// comment, and compares the listing with GRANTS (the contract derived from each binary's code).
// The access test installs the RBAC for real, mints a token per ServiceAccount (TokenRequest) and
// asks the API server (SelfSubjectAccessReview with that token) about every verb on every resource
// of a wide universe: allowed exactly where GRANTS says, denied everywhere else.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { isMap, isSeq, type YAMLMap } from "yaml";
import { renderKubeconfig } from "../lab/cluster/control-plane.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { Discovery, type KubeDoc, type Profile, profiles, render, submit } from "./chart-support.ts";

type Component = "manager" | "agent" | "csi-controller" | "csi-node" | "dpu";
type Scope = "cluster" | "namespace";

interface Grant {
  group: string;
  /** resource or resource/subresource */
  resource: string;
  verbs: string[];
  scope: Scope;
  /** resourceNames, when the grant is narrowed to them. */
  names?: string[];
}

const D = "storage.distort.io";
const LEASE = "distort-manager";

/** What each component's code needs (see the comments in templates/rbac-*.yaml for why). */
function grants(p: { snapshots: boolean; dpuCluster: boolean; dpu: boolean }): Record<Component, Grant[]> {
  const g = (group: string, resource: string, verbs: string[], scope: Scope, names?: string[]): Grant => ({
    group,
    resource,
    verbs,
    scope,
    ...(names ? { names } : {}),
  });
  const svva = "storage.dpu.nvidia.com";
  return {
    manager: [
      g(D, "nvmedevices", ["get", "list", "watch"], "cluster"),
      g(D, "nvmedevices/status", ["update"], "cluster"),
      g(D, "nvmedeviceclaims", ["get", "list", "watch", "update"], "cluster"),
      g(D, "nvmedeviceclaims/status", ["update"], "cluster"),
      g(D, "nvmepartitions", ["get", "list", "watch", "patch", "create", "update", "delete"], "cluster"),
      g(D, "nvmepartitions/status", ["update"], "cluster"),
      g(D, "nvmesnapshots", ["get"], "cluster"),
      g(D, "nvmevolumeattachments", ["get", "create", "update", "delete"], "namespace"),
      g("events.k8s.io", "events", ["create", "patch"], "cluster"),
      g(D, "rdmastoragenodes", ["get", "list", "watch"], "namespace"),
      g(D, "rdmastoragenodes/status", ["update"], "namespace"),
      g("coordination.k8s.io", "leases", ["create"], "namespace"),
      g("coordination.k8s.io", "leases", ["get", "update"], "namespace", [LEASE]),
    ],
    agent: [
      g(D, "nvmedevices", ["get", "list", "watch", "create", "patch"], "cluster"),
      g(D, "nvmedevices/status", ["update"], "cluster"),
      g("events.k8s.io", "events", ["create", "patch"], "cluster"),
      // Partitions, attachments and snapshots of the release namespace only (agent/caches.ts).
      g(D, "nvmepartitions", ["get", "list", "watch", "update", "patch"], "namespace"),
      g(D, "nvmepartitions/status", ["update"], "namespace"),
      g(D, "nvmevolumeattachments", ["get", "list", "watch", "update"], "namespace"),
      g(D, "nvmevolumeattachments/status", ["update"], "namespace"),
      g(D, "nvmesnapshots", ["get", "list", "watch", "update"], "namespace"),
      g(D, "nvmesnapshots/status", ["update"], "namespace"),
      g(D, "rdmastoragenodes", ["get", "create"], "namespace"),
      g(D, "rdmastoragenodes/status", ["update"], "namespace"),
      g("", "secrets", ["get"], "namespace"),
    ],
    "csi-controller": [
      g(D, "nvmedevices", ["get", "list", "watch"], "cluster"),
      g(D, "nvmedevices/status", ["update"], "cluster"),
      g(D, "rdmastoragenodes", ["list", "watch"], "cluster"),
      g("", "nodes", ["get", "list", "watch"], "cluster"),
      g("", "persistentvolumes", ["get", "list", "watch", "create", "patch", "delete"], "cluster"),
      g("", "persistentvolumeclaims", ["get", "list", "watch", "update"], "cluster"),
      g("", "persistentvolumeclaims/status", ["patch"], "cluster"),
      g("", "pods", ["get", "list", "watch"], "cluster"),
      g("storage.k8s.io", "storageclasses", ["get", "list", "watch"], "cluster"),
      g("storage.k8s.io", "volumeattributesclasses", ["get", "list", "watch"], "cluster"),
      g("storage.k8s.io", "csinodes", ["get", "list", "watch"], "cluster"),
      g("storage.k8s.io", "volumeattachments", ["get", "list", "watch", "patch"], "cluster"),
      g("storage.k8s.io", "volumeattachments/status", ["patch"], "cluster"),
      g("", "events", ["create", "update", "patch"], "cluster"),
      ...(p.snapshots
        ? [
            g("snapshot.storage.k8s.io", "volumesnapshots", ["get", "list", "watch", "update"], "cluster"),
            g("snapshot.storage.k8s.io", "volumesnapshotclasses", ["get", "list", "watch"], "cluster"),
            g(
              "snapshot.storage.k8s.io",
              "volumesnapshotcontents",
              ["get", "list", "watch", "update", "patch"],
              "cluster",
            ),
            g("snapshot.storage.k8s.io", "volumesnapshotcontents/status", ["update", "patch"], "cluster"),
            g(
              "groupsnapshot.storage.k8s.io",
              "volumegroupsnapshotclasses",
              ["get", "list", "watch"],
              "cluster",
            ),
            g(
              "groupsnapshot.storage.k8s.io",
              "volumegroupsnapshotcontents",
              ["get", "list", "watch", "update", "patch"],
              "cluster",
            ),
            g(
              "groupsnapshot.storage.k8s.io",
              "volumegroupsnapshotcontents/status",
              ["update", "patch"],
              "cluster",
            ),
            // csi-snapshot-metadata (csi.controller.snapshotMetadata, on by default with
            // snapshots): TokenReview and SubjectAccessReview per call, its own registration.
            g("authentication.k8s.io", "tokenreviews", ["create"], "cluster"),
            g("authorization.k8s.io", "subjectaccessreviews", ["create"], "cluster"),
            g("cbt.storage.k8s.io", "snapshotmetadataservices", ["get"], "cluster"),
          ]
        : []),
      ...(p.dpuCluster
        ? [
            g(svva, "svvolumeattachments", ["get", "list", "watch", "patch"], "cluster"),
            g(svva, "svvolumeattachments/status", ["patch"], "cluster"),
          ]
        : []),
      g(D, "nvmepartitions", ["get", "list", "watch", "create", "update", "patch", "delete"], "namespace"),
      g(D, "nvmevolumeattachments", ["get", "list", "watch", "create", "update", "delete"], "namespace"),
      g(D, "nvmesnapshots", ["get", "list", "watch", "create", "delete"], "namespace"),
      // DH-HMAC-CHAP: each volume's key Secret, written at ControllerPublish.
      g("", "secrets", ["get", "create", "update"], "namespace"),
      g("events.k8s.io", "events", ["create", "patch"], "namespace"),
      g("coordination.k8s.io", "leases", ["get", "create", "update"], "namespace"),
      // csi-provisioner --enable-capacity: its CSIStorageCapacity objects and the owner lookup.
      g(
        "storage.k8s.io",
        "csistoragecapacities",
        ["list", "watch", "create", "update", "delete"],
        "namespace",
      ),
      g("apps", "replicasets", ["get"], "namespace"),
    ],
    // No verb on Nodes beyond get: the host NQN travels in the CSI node ID (CSINode), not on the Node.
    // Events: the staging sweep's word on a partition whose staging kubelet forgot.
    "csi-node": [
      g("", "nodes", ["get"], "cluster"),
      g("events.k8s.io", "events", ["create", "patch"], "namespace"),
    ],
    // Nothing on Nodes at all: the DPU's host NQN travels in its CSI node ID (NodeGetInfo, which
    // kubelet stores in CSINode); the plugin reads only the DH-HMAC-CHAP Secrets it is given.
    dpu: p.dpu ? [g("", "secrets", ["get"], "namespace")] : [],
  };
}

/** One line per (component, scope, group, resource, names, verb), sorted: the listing. */
function lines(all: Record<string, Grant[]>): string[] {
  const out = new Set<string>();
  for (const [c, gs] of Object.entries(all))
    for (const gr of gs)
      for (const verb of gr.verbs)
        out.add(
          `${c} ${gr.scope} ${gr.group || "core"}/${gr.resource}${gr.names ? `[${gr.names.join(",")}]` : ""} ${verb}`,
        );
  return [...out].sort();
}

const flags = (p: Profile) => ({
  // The lab profiles turn snapshots on in their values files.
  snapshots: p.set.includes("snapshots.enabled=true") || p.name === "examples/lab-cluster.yaml",
  dpuCluster: p.name.includes("dpu-cluster"),
  // The real-cluster lab runs the DPU plugin on its DPU node.
  dpu:
    p.name.includes("dpu-cluster") ||
    p.name === "examples/lab-cluster.yaml" ||
    p.set.includes("dpu.enabled=true"),
});

let helm: string;
let tc: TestCluster;

beforeAll(async () => {
  helm = await ensureHelm();
  tc = await testCluster();
}, 600_000);

afterAll(async () => {
  await tc?.stop();
});

test("the csi-node and dpu ServiceAccounts hold no verb on Nodes beyond get", () => {
  for (const dpuCluster of [false, true]) {
    const all = grants({ snapshots: true, dpuCluster, dpu: true });
    for (const c of ["csi-node", "dpu"] as const) {
      const onNodes = all[c].filter(
        (gr) => gr.group === "" && (gr.resource === "nodes" || gr.resource === "*"),
      );
      expect({
        c,
        verbs: [...new Set(onNodes.flatMap((gr) => gr.verbs))].filter((v) => v !== "get"),
      }).toEqual({
        c,
        verbs: [],
      });
    }
  }
  // The access reviews below then prove the rendered chart grants exactly this contract.
});

describe("RBAC listing", () => {
  for (const p of profiles()) {
    test(`${p.name}: every rule justified, grants exactly the contract`, async () => {
      const { docs } = await render(helm, p, "rel", "distort-system");
      const listed: Record<string, Grant[]> = {};
      const unjustified: string[] = [];
      for (const doc of docs) {
        const o = doc.toJS() as KubeDoc | null;
        if (!o || (o.kind !== "Role" && o.kind !== "ClusterRole")) continue;
        const component = o.metadata.labels?.["app.kubernetes.io/component"] as string;
        const rules = (doc.contents as YAMLMap).get("rules", true);
        if (!isSeq(rules)) continue;
        for (const [i, item] of rules.items.entries()) {
          if (!isMap(item)) throw new Error(`${o.kind} ${o.metadata.name}: rule ${i} is not a map`);
          // The yaml parser hangs the first item's comment on the sequence itself.
          const comment = item.commentBefore ?? (i === 0 ? rules.commentBefore : undefined);
          if (!comment?.trim()) unjustified.push(`${o.kind} ${o.metadata.name} rule ${i}`);
          const r = item.toJSON() as {
            apiGroups: string[];
            resources: string[];
            verbs: string[];
            resourceNames?: string[];
          };
          listed[component] ??= [];
          for (const group of r.apiGroups)
            for (const resource of r.resources)
              listed[component].push({
                group,
                resource,
                verbs: r.verbs,
                scope: o.kind === "ClusterRole" ? "cluster" : "namespace",
                ...(r.resourceNames ? { names: r.resourceNames } : {}),
              });
        }
      }
      const listing = lines(listed);
      // The enumeration, for a reviewer reading the test log.
      console.log(`RBAC grants (${p.name}):\n  ${listing.join("\n  ")}`);
      expect(unjustified).toEqual([]);
      expect(listing).toEqual(lines(grants(flags(p))));
    });
  }
});

/** Resources asked about: everything granted anywhere, plus what no component may touch. */
const UNIVERSE: { group: string; resource: string; cluster: boolean }[] = [
  ...["nvmedevices", "nvmedevices/status"].map((resource) => ({ group: D, resource, cluster: true })),
  ...[
    "nvmedeviceclaims",
    "nvmedeviceclaims/status",
    "nvmepartitions",
    "nvmepartitions/status",
    "nvmevolumeattachments",
    "nvmevolumeattachments/status",
    "nvmesnapshots",
    "nvmesnapshots/status",
    "rdmastoragenodes",
    "rdmastoragenodes/status",
  ].map((resource) => ({ group: D, resource, cluster: false })),
  ...[
    "secrets",
    "configmaps",
    "pods",
    "persistentvolumeclaims",
    "persistentvolumeclaims/status",
    "events",
  ].map((resource) => ({ group: "", resource, cluster: false })),
  { group: "", resource: "serviceaccounts/token", cluster: false },
  ...["nodes", "persistentvolumes"].map((resource) => ({ group: "", resource, cluster: true })),
  { group: "events.k8s.io", resource: "events", cluster: false },
  { group: "coordination.k8s.io", resource: "leases", cluster: false },
  ...[
    "storageclasses",
    "csinodes",
    "csidrivers",
    "volumeattachments",
    "volumeattachments/status",
    "volumeattributesclasses",
  ].map((resource) => ({ group: "storage.k8s.io", resource, cluster: true })),
  { group: "apps", resource: "daemonsets", cluster: false },
  { group: "apps", resource: "replicasets", cluster: false },
  { group: "storage.k8s.io", resource: "csistoragecapacities", cluster: false },
  { group: "rbac.authorization.k8s.io", resource: "clusterroles", cluster: true },
  { group: "rbac.authorization.k8s.io", resource: "rolebindings", cluster: false },
];
const VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];

describe("access of each ServiceAccount, asked of the API server with its own token", () => {
  const release = `r${Math.random().toString(16).slice(2, 8)}`;
  const cleanup: string[] = [];
  let ns = "";
  let tmp = "";

  afterAll(async () => {
    for (const path of cleanup) await tc.conn.request(path, { method: "DELETE" });
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  test("every component can do exactly what its code needs and nothing more", async () => {
    ns = await tc.namespace("rbac");
    const other = await tc.namespace("elsewhere");
    tmp = mkdtempSync(join(tmpdir(), "distort-rbac-"));
    const profile: Profile = { name: "rbac", files: [], set: ["dpu.enabled=true"] };
    const { objects } = await render(helm, profile, release, ns);
    const discovery = new Discovery(tc.conn);
    const rbacKinds = ["ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"];
    for (const o of objects.filter((x) => rbacKinds.includes(x.kind))) {
      const r = await submit(tc.conn, discovery, o, { dryRun: false });
      expect({ o: `${o.kind}/${o.metadata.name}`, status: r.status }).toEqual({
        o: `${o.kind}/${o.metadata.name}`,
        status: 201,
      });
      if (o.kind.startsWith("Cluster"))
        cleanup.push(`/apis/rbac.authorization.k8s.io/v1/${o.kind.toLowerCase()}s/${o.metadata.name}`);
    }

    const kc = new k8s.KubeConfig();
    kc.loadFromFile(tc.kubeconfigPath);
    const caPem = Buffer.from(kc.getCurrentCluster()?.caData ?? "", "base64").toString("utf8");
    const contract = grants({ snapshots: false, dpuCluster: false, dpu: true });
    const components = Object.keys(contract) as Component[];
    const problems: string[] = [];

    for (const component of components) {
      const sa = `${release}-distort-${component}`;
      const tr = await tc.conn.request(`/api/v1/namespaces/${ns}/serviceaccounts/${sa}/token`, {
        method: "POST",
        contentType: "application/json",
        body: JSON.stringify({
          apiVersion: "authentication.k8s.io/v1",
          kind: "TokenRequest",
          spec: { expirationSeconds: 600 },
        }),
      });
      expect(tr.status).toBe(201);
      const token = ((await tr.json()) as { status: { token: string } }).status.token;
      const path = join(tmp, `${component}.kubeconfig`);
      writeFileSync(path, renderKubeconfig(tc.conn.server, caPem, token, sa), { mode: 0o600 });
      const as = connect(path);

      // The token authenticates as the chart's ServiceAccount, nothing else.
      const who = await as.request("/apis/authentication.k8s.io/v1/selfsubjectreviews", {
        method: "POST",
        contentType: "application/json",
        body: JSON.stringify({ apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" }),
      });
      const user = ((await who.json()) as { status: { userInfo: { username: string } } }).status.userInfo
        .username;
      expect(user).toBe(`system:serviceaccount:${ns}:${sa}`);

      const mine = contract[component];
      const expected = (group: string, resource: string, verb: string, where: "own" | "other" | "cluster") =>
        mine.some(
          (gr) =>
            !gr.names &&
            gr.group === group &&
            gr.resource === resource &&
            gr.verbs.includes(verb) &&
            (gr.scope === "cluster" || where === "own"),
        );
      const asks: {
        group: string;
        resource: string;
        verb: string;
        namespace: string;
        name?: string;
        want: boolean;
      }[] = [];
      for (const u of UNIVERSE)
        for (const verb of VERBS) {
          if (u.cluster)
            asks.push({ ...u, verb, namespace: "", want: expected(u.group, u.resource, verb, "cluster") });
          else
            for (const [where, namespace] of [
              ["own", ns],
              ["other", other],
            ] as const)
              asks.push({ ...u, verb, namespace, want: expected(u.group, u.resource, verb, where) });
        }
      // Name-narrowed grants: allowed on the named object only, in the release namespace only.
      for (const gr of mine.filter((x) => x.names))
        for (const verb of gr.verbs)
          for (const name of gr.names ?? []) {
            asks.push({ group: gr.group, resource: gr.resource, verb, namespace: ns, name, want: true });
            asks.push({
              group: gr.group,
              resource: gr.resource,
              verb,
              namespace: ns,
              name: `${name}-x`,
              want: false,
            });
            asks.push({ group: gr.group, resource: gr.resource, verb, namespace: other, name, want: false });
          }
      await inBatches(asks, 16, async (a) => {
        const allowed = await ask(as, a);
        if (allowed !== a.want)
          problems.push(
            `${component} ${a.verb} ${a.group || "core"}/${a.resource}${a.name ? `/${a.name}` : ""} in ${a.namespace || "(cluster)"}: ${allowed ? "ALLOWED, not needed" : "DENIED, needed"}`,
          );
      });
    }
    expect(problems).toEqual([]);
  }, 120_000);

  test("spot checks through real requests: the manager cannot read Secrets, the agent cannot delete claims", async () => {
    // Tokens from the test above are not kept; the reviews there are authoritative. These requests
    // go through the full handler chain once more with a fresh token each.
    const tokenFor = async (component: Component) => {
      const sa = `${release}-distort-${component}`;
      const tr = await tc.conn.request(`/api/v1/namespaces/${ns}/serviceaccounts/${sa}/token`, {
        method: "POST",
        contentType: "application/json",
        body: JSON.stringify({ apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: {} }),
      });
      return ((await tr.json()) as { status: { token: string } }).status.token;
    };
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(tc.kubeconfigPath);
    const caPem = Buffer.from(kc.getCurrentCluster()?.caData ?? "", "base64").toString("utf8");
    const as = async (component: Component) => {
      const path = join(tmp, `${component}-spot.kubeconfig`);
      writeFileSync(path, renderKubeconfig(tc.conn.server, caPem, await tokenFor(component), component), {
        mode: 0o600,
      });
      return connect(path);
    };
    const manager = await as("manager");
    expect((await manager.request(`/api/v1/namespaces/${ns}/secrets`)).status).toBe(403);
    expect((await manager.request(`/api/v1/namespaces/${ns}/secrets/any`)).status).toBe(403);
    const agent = await as("agent");
    const claims = `/apis/${D}/v1alpha1/namespaces/${ns}/nvmedeviceclaims`;
    expect((await agent.request(`${claims}/some-claim`, { method: "DELETE" })).status).toBe(403);
    expect((await agent.request(claims)).status).toBe(403);
    // What the agent does need works: a missing Secret is 404 (allowed to look), not 403.
    expect((await agent.request(`/api/v1/namespaces/${ns}/secrets/absent`)).status).toBe(404);
    expect((await agent.request(`/api/v1/namespaces/${ns}/secrets`)).status).toBe(403);
    const node = await as("csi-node");
    expect((await node.request("/api/v1/nodes")).status).toBe(403);
    expect(
      (
        await node.request("/api/v1/nodes/any", {
          method: "PATCH",
          contentType: "application/merge-patch+json",
          body: JSON.stringify({ metadata: { annotations: { "storage.distort.io/host-nqn": "nqn.x:y" } } }),
        })
      ).status,
    ).toBe(403);
    expect((await node.request(`/api/v1/namespaces/${ns}/secrets/absent`)).status).toBe(403);
  });
});

async function ask(
  conn: KubeConnection,
  a: { group: string; resource: string; verb: string; namespace: string; name?: string },
): Promise<boolean> {
  const [resource, subresource] = a.resource.split("/");
  const res = await conn.request("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify({
      apiVersion: "authorization.k8s.io/v1",
      kind: "SelfSubjectAccessReview",
      spec: {
        resourceAttributes: {
          group: a.group,
          resource,
          ...(subresource ? { subresource } : {}),
          verb: a.verb,
          ...(a.namespace ? { namespace: a.namespace } : {}),
          ...(a.name ? { name: a.name } : {}),
        },
      },
    }),
  });
  if (res.status !== 201) throw new Error(`SelfSubjectAccessReview: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { status: { allowed: boolean } }).status.allowed;
}

async function inBatches<T>(items: T[], size: number, fn: (x: T) => Promise<void>): Promise<void> {
  for (let i = 0; i < items.length; i += size) await Promise.all(items.slice(i, i + size).map(fn));
}
