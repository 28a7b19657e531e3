// Proof for the chart's least-privilege RBAC on the real cluster: every container of every DISTORT
// Pod (the DISTORT binaries and the CSI sidecars) authenticates with the projected token of its own
// chart ServiceAccount, never as the admin and with no kubeconfig of the lab, and no two components
// share an identity, so a new component cannot slip in on another one's rights.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type * as k8s from "@kubernetes/client-node";
import { type KubeDoc, render } from "../helm/chart-support.ts";
import { containerPids } from "../lab/cluster/containers.ts";
import { renderKubeconfig } from "../lab/cluster/control-plane.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { clusterOf } from "../lab/harness/rbac.ts";
import { connect } from "../lib/kube/connection.ts";
import { type E2eLab, e2eLab } from "./support.ts";

const COMPONENT_LABEL = "app.kubernetes.io/component";
/** Where kubelet mounts a Pod's projected ServiceAccount token in every container (under /var/run or /run). */
const TOKEN_DIR = "/secrets/kubernetes.io/serviceaccount";
/** The CSI sidecars: containers of a chart workload, so they run with that workload's ServiceAccount. */
const SIDECARS = [
  "csi-provisioner",
  "csi-attacher",
  "csi-resizer",
  "csi-snapshotter",
  "csi-snapshot-metadata",
];

interface UserInfo {
  username: string;
  groups?: string[];
}

let lab: E2eLab;
let chart: KubeDoc[];
let admin: UserInfo;
let dir: string;

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

/** One running container of a DISTORT Pod, with its main process. */
interface Running {
  pod: k8s.V1Pod;
  component: string;
  container: string;
  pid: number;
}

/** Every running container of the release's Pods, each with its first process. */
async function runningContainers(): Promise<Running[]> {
  const pods = (await lab.core.listNamespacedPod({ namespace: lab.namespace })).items.filter(
    (p) => p.metadata?.deletionTimestamp === undefined && p.status?.phase === "Running",
  );
  const out: Running[] = [];
  for (const pod of pods)
    for (const c of pod.status?.containerStatuses ?? []) {
      if (!c.containerID || !c.state?.running) continue;
      const [pid] = containerPids(c.containerID);
      if (pid === undefined) throw new Error(`no process of container ${pod.metadata?.name}/${c.name}`);
      out.push({ pod, component: pod.metadata?.labels?.[COMPONENT_LABEL] ?? "", container: c.name, pid });
    }
  return out;
}

/** Whether a ServiceAccount token is mounted in the container. */
function hasToken(r: Running): boolean {
  return readFileSync(`/proc/${r.pid}/mountinfo`, "utf8")
    .split("\n")
    .some((l) => (l.split(" ")[4] ?? "").endsWith(TOKEN_DIR));
}

/**
 * A kubeconfig holding the token a container was given, as the container itself would use it.
 * The token's mount point comes from the container's mount table: /var/run may be a symlink to
 * /run in the image, and an absolute symlink under /proc/<pid>/root resolves on the host.
 */
function tokenKubeconfig(r: Running): string {
  const point = readFileSync(`/proc/${r.pid}/mountinfo`, "utf8")
    .split("\n")
    .map((l) => l.split(" ")[4] ?? "")
    .find((m) => m.endsWith(TOKEN_DIR));
  if (!point) throw new Error(`${r.pod.metadata?.name}/${r.container} has no ServiceAccount token mounted`);
  const token = readFileSync(`/proc/${r.pid}/root${point}/token`, "utf8").trim();
  const { server, caPem } = clusterOf(lab.conn);
  const path = join(dir, `${r.pod.metadata?.name}-${r.container}.kubeconfig`);
  writeFileSync(path, renderKubeconfig(server, caPem, token, r.container), { mode: 0o600 });
  return path;
}

beforeAll(async () => {
  lab = await e2eLab();
  dir = mkdtempSync(join(tmpdir(), "distort-e2e-identities-"));
  chart = (
    await render(
      await ensureHelm(),
      { name: "lab", files: [lab.values], set: [] },
      lab.release,
      lab.namespace,
    )
  ).objects;
  admin = await whoAmI(lab.kubeconfig);
}, 600_000);

afterAll(async () => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  await lab?.stop();
}, 120_000);

test("each DISTORT container and CSI sidecar authenticates with its own chart ServiceAccount's token", async () => {
  const sas = await lab.core.listNamespacedServiceAccount({ namespace: lab.namespace });
  const running = await runningContainers();
  const perComponent = new Map<string, string>();
  const seen: string[] = [];
  for (const r of running) {
    const w = workload({ component: r.component });
    // The Pod runs as the chart's ServiceAccount for its component, which is labelled as its own.
    expect({ pod: r.pod.metadata?.name, sa: r.pod.spec?.serviceAccountName }).toEqual({
      pod: r.pod.metadata?.name,
      sa: w.serviceAccount,
    });
    const sa = sas.items.find((s) => s.metadata?.name === w.serviceAccount);
    expect(sa, `ServiceAccount ${w.serviceAccount} of ${w.name}`).toBeDefined();
    expect(sa?.metadata?.labels?.[COMPONENT_LABEL]).toBe(r.component);
    if (r.pod.spec?.automountServiceAccountToken === false) {
      // A component that never calls the API server (nvmf_tgt in its own Pod) holds no token at all.
      expect({ container: `${r.pod.metadata?.name}/${r.container}`, token: hasToken(r) }).toEqual({
        container: `${r.pod.metadata?.name}/${r.container}`,
        token: false,
      });
      perComponent.set(r.component, w.serviceAccount);
      seen.push(r.component);
      continue;
    }
    const kubeconfig = tokenKubeconfig(r);
    const user = await whoAmI(kubeconfig);
    const who = `${r.pod.metadata?.name}/${r.container}`;
    expect({ container: who, user: user.username }).toEqual({
      container: who,
      user: `system:serviceaccount:${lab.namespace}:${w.serviceAccount}`,
    });
    expect(user.groups ?? []).not.toContain("system:masters");
    const granted: string[] = [];
    for (const e of ESCALATIONS)
      if (await mayDo(kubeconfig, e)) granted.push(`${e.verb} ${e.group ?? ""}/${e.resource}`);
    expect({ container: who, granted }).toEqual({ container: who, granted: [] });
    perComponent.set(r.component, w.serviceAccount);
    seen.push(SIDECARS.includes(r.container) ? r.container : r.component);
  }
  // Every kind was there to check: two managers, an agent per storage node, the controller with its
  // five sidecars, a csi-node plugin per consumer node.
  const count = (k: string) => seen.filter((x) => x === k).length;
  expect(count("manager")).toBeGreaterThanOrEqual(2);
  expect(count("agent")).toBeGreaterThanOrEqual(lab.storage.length);
  expect(count("csi-controller")).toBeGreaterThanOrEqual(1);
  expect(count("csi-node")).toBeGreaterThanOrEqual(lab.consumers.length);
  // The lab runs nvmf_tgt in a DaemonSet of its own on the SPDK storage nodes.
  expect(count("nvmf-tgt")).toBeGreaterThanOrEqual(1);
  // The DPU plugin (and its registrar) on the DPU node, where the lab has one.
  if (lab.dpu) expect(count("dpu")).toBeGreaterThanOrEqual(1);
  for (const s of SIDECARS) expect(count(s), s).toBe(1);
  // Least privilege needs separate identities: no two components share a ServiceAccount.
  expect(new Set(perComponent.values()).size).toBe(perComponent.size);
}, 300_000);

test("no DISTORT container holds a kubeconfig: each is an in-cluster client, never the admin", async () => {
  expect(admin.groups ?? []).toContain("system:masters");
  const running = await runningContainers();
  expect(running.length).toBeGreaterThan(0);
  for (const r of running) {
    const who = `${r.pod.metadata?.name}/${r.container}`;
    for (const pid of containerPids(
      r.pod.status?.containerStatuses?.find((c) => c.name === r.container)?.containerID ?? "",
    )) {
      let argv: string[];
      let env: Map<string, string>;
      try {
        argv = argvOf(pid);
        env = environOf(pid);
      } catch {
        continue; // Ended while we looked.
      }
      const flag = argv.find((a) => a.startsWith("--kubeconfig"));
      expect({ container: who, pid, kubeconfig: flag ?? env.get("KUBECONFIG") }).toEqual({
        container: who,
        pid,
        kubeconfig: undefined,
      });
    }
    // The API server is reached as an in-cluster client: through the kubernetes Service.
    expect({ container: who, host: environOf(r.pid).get("KUBERNETES_SERVICE_HOST") !== undefined }).toEqual({
      container: who,
      host: true,
    });
  }
}, 300_000);
