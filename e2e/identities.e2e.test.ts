// Proof for the chart's least-privilege RBAC: every DISTORT process of the lab (and the CSI
// sidecars) authenticates with its own chart ServiceAccount, never as the admin, and the only
// admin processes are the cluster's own pieces listed here, so a new component cannot slip in as one.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { basename } from "node:path";
import { type KubeDoc, render } from "../helm/chart-support.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { LAB_RELEASE, LAB_VALUES } from "../lab/lab.ts";
import { connect } from "../lib/kube/connection.ts";
import { type E2eLab, e2eLab } from "./support.ts";

const COMPONENT_LABEL = "app.kubernetes.io/component";

/** Lab process name -> the chart component (app.kubernetes.io/component) whose Pod it stands for. */
const DISTORT_PROCESSES: readonly [RegExp, string][] = [
  [/^manager-\d+$/, "manager"],
  [/^agent\/.+$/, "agent"],
  [/^csi-controller$/, "csi-controller"],
  [/^csi-node\/.+$/, "csi-node"],
  [/^dpu\/.+$/, "dpu"],
];
/** The CSI sidecars: containers of a chart workload, so they run with that workload's ServiceAccount. */
const SIDECARS = ["csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"];
/**
 * Cluster pieces that hold admin credentials by design: the snapshot-controller is a cluster
 * add-on outside the chart, and the kubelet stand-in plays the kubelet, which has node
 * credentials in a real cluster. The control plane's clients are listed apart (they are not in
 * pids.json). Anything else on the admin identity fails the test.
 */
const ADMIN_PROCESSES: readonly RegExp[] = [/^snapshot-controller$/, /^kubelet\/.+$/];
const ADMIN_CONTROL_PLANE = ["kube-controller-manager", "kube-scheduler"];
/**
 * Processes that are no Kubernetes client at all: the hardware stand-ins (targets, SNAP, each
 * node's NVMe host driver) and etcd/the API server itself.
 */
const NON_CLIENTS: readonly RegExp[] = [/^nvmf_tgt\/.+$/, /^snap\/.+$/, /^nvme-host\/.+$/];
const NON_CLIENT_CONTROL_PLANE = ["etcd", "kube-apiserver"];

interface UserInfo {
  username: string;
  groups?: string[];
}

let lab: E2eLab;
let chart: KubeDoc[];
let admin: UserInfo;

function argvOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean);
}

function environOf(pid: number): Map<string, string> {
  const out = new Map<string, string>();
  for (const kv of readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")) {
    const i = kv.indexOf("=");
    if (i > 0) out.set(kv.slice(0, i), kv.slice(i + 1));
  }
  return out;
}

/** The kubeconfig a process uses: its --kubeconfig flag wins over KUBECONFIG, as in client-go and our binaries. */
function kubeconfigOf(pid: number): string | undefined {
  const argv = argvOf(pid);
  for (const [i, a] of argv.entries()) {
    if (a.startsWith("--kubeconfig=")) return a.slice("--kubeconfig=".length);
    if (a === "--kubeconfig") return argv[i + 1];
  }
  return environOf(pid).get("KUBECONFIG") || undefined;
}

/** Who the API server says the holder of `kubeconfig` is (SelfSubjectReview). */
async function whoAmI(kubeconfig: string): Promise<UserInfo> {
  const res = await connect(kubeconfig).request("/apis/authentication.k8s.io/v1/selfsubjectreviews", {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify({ apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" }),
  });
  if (res.status !== 201)
    throw new Error(`SelfSubjectReview with ${kubeconfig}: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { status: { userInfo: UserInfo } }).status.userInfo;
}

/** Whether the holder of `kubeconfig` may do `attrs` (SelfSubjectAccessReview). */
async function mayDo(
  kubeconfig: string,
  attrs: { verb: string; resource: string; group?: string; namespace?: string },
): Promise<boolean> {
  const res = await connect(kubeconfig).request("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
    method: "POST",
    contentType: "application/json",
    body: JSON.stringify({
      apiVersion: "authorization.k8s.io/v1",
      kind: "SelfSubjectAccessReview",
      spec: { resourceAttributes: { group: "", ...attrs } },
    }),
  });
  if (res.status !== 201)
    throw new Error(`SelfSubjectAccessReview with ${kubeconfig}: HTTP ${res.status} ${await res.text()}`);
  return ((await res.json()) as { status: { allowed: boolean } }).status.allowed;
}

/**
 * Ways to more than the chart grants: everything, every Secret, granting roles, impersonating.
 * A ServiceAccount bound to cluster-admin would pass the username check; it fails these.
 */
const ESCALATIONS = [
  { verb: "*", resource: "*", group: "*" },
  { verb: "list", resource: "secrets" },
  { verb: "create", resource: "clusterrolebindings", group: "rbac.authorization.k8s.io" },
  { verb: "escalate", resource: "clusterroles", group: "rbac.authorization.k8s.io" },
  { verb: "impersonate", resource: "users" },
  { verb: "impersonate", resource: "serviceaccounts" },
];

function labPids(): Record<string, number> {
  return JSON.parse(readFileSync(`${lab.dir}/pids.json`, "utf8")) as Record<string, number>;
}

function parentOf(pid: number): number {
  // The command name in /proc/<pid>/stat may hold spaces and parentheses: fields follow the last ")".
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
}

/** The chart workload (Deployment/DaemonSet) that has a container `name`, or the label `component`. */
function workload(o: { component?: string; container?: string }): { name: string; serviceAccount: string } {
  for (const d of chart) {
    const spec = (
      d as {
        spec?: { template?: { spec?: { serviceAccountName?: string; containers?: { name: string }[] } } };
      }
    ).spec?.template?.spec;
    if (!spec?.containers || !["Deployment", "DaemonSet", "StatefulSet"].includes(d.kind)) continue;
    const hit =
      o.component !== undefined
        ? d.metadata.labels?.[COMPONENT_LABEL] === o.component
        : spec.containers.some((c) => c.name === o.container);
    if (hit) {
      if (!spec.serviceAccountName) throw new Error(`${d.kind} ${d.metadata.name} names no ServiceAccount`);
      return { name: `${d.kind} ${d.metadata.name}`, serviceAccount: spec.serviceAccountName };
    }
  }
  throw new Error(`the chart renders no workload for ${JSON.stringify(o)}`);
}

beforeAll(async () => {
  lab = await e2eLab();
  // The chart as the lab installs it (its DPU profile on, as lab.ts renders the RBAC).
  chart = (
    await render(
      await ensureHelm(),
      { name: "lab", files: [LAB_VALUES], set: ["dpu.enabled=true"] },
      LAB_RELEASE,
      lab.namespace,
    )
  ).objects;
  admin = await whoAmI(lab.kubeconfig);
}, 600_000);

afterAll(async () => {
  await lab?.stop();
}, 120_000);

test("each DISTORT process and CSI sidecar authenticates as its own chart ServiceAccount", async () => {
  const pids = labPids();
  const sas = await lab.core.listNamespacedServiceAccount({ namespace: lab.namespace });
  const seen = new Map<string, string>();
  let checked = 0;
  for (const [name, pid] of Object.entries(pids)) {
    const component = DISTORT_PROCESSES.find(([re]) => re.test(name))?.[1];
    if (component === undefined && !SIDECARS.includes(name)) continue;
    const w = component !== undefined ? workload({ component }) : workload({ container: name });
    // The ServiceAccount exists in the release namespace, labelled as the component's.
    const sa = sas.items.find((s) => s.metadata?.name === w.serviceAccount);
    expect(sa, `ServiceAccount ${w.serviceAccount} of ${w.name}`).toBeDefined();
    if (component !== undefined) expect(sa?.metadata?.labels?.[COMPONENT_LABEL]).toBe(component);

    expect(lab.pid(name), `${name} running`).toBe(pid);
    const kubeconfig = kubeconfigOf(pid);
    expect(kubeconfig, `${name} has a kubeconfig`).toBeDefined();
    const user = await whoAmI(kubeconfig as string);
    expect({ process: name, user: user.username }).toEqual({
      process: name,
      user: `system:serviceaccount:${lab.namespace}:${w.serviceAccount}`,
    });
    expect(user.groups ?? []).not.toContain("system:masters");
    const granted: string[] = [];
    for (const e of ESCALATIONS)
      if (await mayDo(kubeconfig as string, e)) granted.push(`${e.verb} ${e.group ?? ""}/${e.resource}`);
    expect({ process: name, granted }).toEqual({ process: name, granted: [] });
    seen.set(name, w.serviceAccount);
    checked++;
  }
  // Every kind of DISTORT process was there to check: two managers, the agents, the controller
  // with its four sidecars, the csi-node plugins and the DPU plugin.
  const kinds = new Set([...seen.keys()].map((n) => DISTORT_PROCESSES.find(([re]) => re.test(n))?.[1] ?? n));
  expect([...kinds].sort()).toEqual(
    ["agent", "csi-controller", "csi-node", "dpu", "manager", ...SIDECARS].sort(),
  );
  expect(checked).toBe(
    2 + lab.storage.length + 1 + SIDECARS.length + lab.consumers.length + (lab.dpu ? 1 : 0),
  );
  // Least privilege needs separate identities: no two components share a ServiceAccount.
  const perComponent = new Map<string, string>();
  for (const [name, sa] of seen) {
    const c = DISTORT_PROCESSES.find(([re]) => re.test(name))?.[1];
    if (c) perComponent.set(c, sa);
  }
  expect(new Set(perComponent.values()).size).toBe(perComponent.size);
}, 120_000);

test("only the listed cluster pieces run as the admin; the hardware stand-ins hold no lab credentials", async () => {
  expect(admin.groups ?? []).toContain("system:masters");
  const pids = labPids();
  const unclassified: string[] = [];
  for (const [name, pid] of Object.entries(pids)) {
    const kubeconfig = kubeconfigOf(pid);
    if (NON_CLIENTS.some((re) => re.test(name))) {
      // An inherited KUBECONFIG from outside the lab would be harmless; a lab credential would not.
      expect({ process: name, labCredential: kubeconfig?.startsWith(lab.dir) ?? false }).toEqual({
        process: name,
        labCredential: false,
      });
      continue;
    }
    if (kubeconfig === undefined) {
      unclassified.push(`${name} (no kubeconfig)`);
      continue;
    }
    const user = await whoAmI(kubeconfig);
    const isAdmin = user.username === admin.username || (user.groups ?? []).includes("system:masters");
    const listedAdmin = ADMIN_PROCESSES.some((re) => re.test(name));
    // Exactly the listed ones: an admin process not listed, or a listed one that is not admin,
    // means this list and the lab have drifted apart.
    expect({ process: name, admin: isAdmin }).toEqual({ process: name, admin: listedAdmin });
    if (!isAdmin && !user.username.startsWith(`system:serviceaccount:${lab.namespace}:`))
      unclassified.push(`${name} (${user.username})`);
  }
  expect(unclassified).toEqual([]);
  // The lab's listed admin processes were all present (a rename would otherwise hide here).
  for (const re of ADMIN_PROCESSES)
    expect(
      Object.keys(pids).some((n) => re.test(n)),
      String(re),
    ).toBe(true);
  for (const re of NON_CLIENTS)
    expect(
      Object.keys(pids).some((n) => re.test(n)),
      String(re),
    ).toBe(true);
}, 120_000);

test("the lab runs no process beside pids.json but the control plane, whose clients are admin", async () => {
  const pids = labPids();
  const known = new Set(Object.values(pids));
  const owners = new Set([...known].map(parentOf));
  // All lab processes are children of the one process that started the lab.
  expect(owners.size).toBe(1);
  const owner = [...owners][0] as number;
  const others: { pid: number; exe: string }[] = [];
  for (const e of readdirSync("/proc")) {
    const pid = Number(e);
    if (!Number.isInteger(pid) || known.has(pid)) continue;
    try {
      if (parentOf(pid) !== owner) continue;
      const argv = argvOf(pid);
      // The suites' own bun test run is a child too, but carries no lab path in its argv.
      if (!argv.some((a) => a.includes(lab.dir))) continue;
      others.push({ pid, exe: basename(argv[0] ?? "") });
    } catch {
      // Ended while we looked.
    }
  }
  expect(others.map((o) => o.exe).sort()).toEqual(
    [...ADMIN_CONTROL_PLANE, ...NON_CLIENT_CONTROL_PLANE].sort(),
  );
  for (const o of others) {
    const kubeconfig = kubeconfigOf(o.pid);
    if (NON_CLIENT_CONTROL_PLANE.includes(o.exe)) {
      expect({ exe: o.exe, labCredential: kubeconfig?.startsWith(lab.dir) ?? false }).toEqual({
        exe: o.exe,
        labCredential: false,
      });
      continue;
    }
    expect(kubeconfig, `${o.exe} kubeconfig`).toBeDefined();
    expect((await whoAmI(kubeconfig as string)).username).toBe(admin.username);
  }
}, 120_000);
