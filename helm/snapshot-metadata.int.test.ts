// The chart's changed-block tracking: with snapshots on, csi-snapshot-metadata beside distort-csi,
// its Service, a TLS pair whose certificate names the Service and chains to the CA the
// SnapshotMetadataService publishes, an ingress rule when network policies are on; an existing
// Secret survives a render against the cluster (lookup), so upgrades never rotate the CA; and the
// storage agent's block-metadata scratch directory in both target layouts.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { X509Certificate } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { installSnapshotCrds, installSnapshotMetadataCrd } from "../lab/cluster/snapshot-crds.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { CHART_DIR, type KubeDoc, type Profile, render, runHelm } from "./chart-support.ts";

type Container = k8s.V1Container;
type PodSpec = k8s.V1PodSpec;

let helm: string;
const RELEASE = "smd";
const NS = "distort-system";
const SVC = "smd-distort-csi-snapshot-metadata";
const SECRET = "smd-distort-csi-snapshot-metadata-tls";

beforeAll(async () => {
  helm = await ensureHelm();
}, 600_000);

const profile = (set: string[], files: string[] = []): Profile => ({ name: set.join(","), files, set });
const rendered = async (set: string[], files: string[] = []) =>
  (await render(helm, profile(set, files), RELEASE, NS)).objects;
const find = (objs: KubeDoc[], kind: string, suffix: string) => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name.endsWith(suffix));
  if (!o) throw new Error(`no ${kind} *${suffix}`);
  return o;
};
const podSpec = (o: KubeDoc) => (o.spec as { template: { spec: PodSpec } }).template.spec;
const container = (spec: PodSpec, name: string) => spec.containers.find((c) => c.name === name) as Container;
const b64 = (s: unknown) => Buffer.from(String(s), "base64").toString("utf8");

describe("rendered", () => {
  test("off without snapshots, and when turned off", async () => {
    for (const set of [[], ["snapshots.enabled=true", "csi.controller.snapshotMetadata.enabled=false"]]) {
      const objs = await rendered(set);
      const ctl = podSpec(find(objs, "Deployment", "-csi-controller"));
      expect(ctl.containers.map((c) => c.name)).not.toContain("csi-snapshot-metadata");
      expect(objs.filter((o) => o.kind === "SnapshotMetadataService" || o.metadata.name === SVC)).toEqual([]);
    }
  });

  test("the sidecar, its Service, a certificate for the Service's names under the published CA", async () => {
    const objs = await rendered(["snapshots.enabled=true"]);
    const ctl = podSpec(find(objs, "Deployment", "-csi-controller"));
    const c = container(ctl, "csi-snapshot-metadata");
    expect(c.image).toBe("registry.k8s.io/sig-storage/csi-snapshot-metadata:v1.0.0");
    expect(c.args).toEqual(
      expect.arrayContaining([
        "--csi-address=/csi/csi.sock",
        "--tls-cert=/tls/tls.crt",
        "--tls-key=/tls/tls.key",
        "--port=50051",
        "--http-endpoint=:9815",
        "--audience=storage.distort.io",
      ]),
    );
    expect(c.readinessProbe?.httpGet?.path).toBe("/health");
    const tlsVolume = ctl.volumes?.find((v) => v.name === "snapshot-metadata-tls");
    expect(tlsVolume?.secret?.secretName).toBe(SECRET);

    const svc = find(objs, "Service", "-csi-snapshot-metadata") as unknown as k8s.V1Service;
    expect(svc.spec?.ports).toEqual([
      { name: "snapshot-metadata", port: 50051, targetPort: "snapshot-meta", protocol: "TCP" },
    ]);
    expect(c.ports?.find((p) => p.name === "snapshot-meta")?.containerPort).toBe(50051);

    const secret = find(objs, "Secret", "-csi-snapshot-metadata-tls") as unknown as k8s.V1Secret;
    const sms = find(objs, "SnapshotMetadataService", "storage.distort.io") as unknown as {
      metadata: { namespace?: string };
      spec: { address: string; caCert: string; audience: string };
    };
    expect(sms.metadata.namespace).toBeUndefined();
    expect(sms.spec.address).toBe(`${SVC}.${NS}:50051`);
    expect(sms.spec.audience).toBe("storage.distort.io");
    expect(sms.spec.caCert).toBe(secret.data?.["ca.crt"] as string);
    const ca = new X509Certificate(b64(sms.spec.caCert));
    const cert = new X509Certificate(b64(secret.data?.["tls.crt"]));
    expect(cert.verify(ca.publicKey)).toBe(true);
    for (const name of [SVC, `${SVC}.${NS}`, `${SVC}.${NS}.svc`, `${SVC}.${NS}.svc.cluster.local`])
      expect(cert.checkHost(name)).toBe(name);
    expect(b64(secret.data?.["tls.key"])).toContain("PRIVATE KEY");
  });

  test("RBAC: token and access reviews, its own registration", async () => {
    const objs = await rendered(["snapshots.enabled=true"]);
    const role = find(objs, "ClusterRole", "-csi-controller") as unknown as k8s.V1ClusterRole;
    const has = (group: string, resource: string, verb: string) =>
      (role.rules ?? []).some(
        (r) => r.apiGroups?.includes(group) && r.resources?.includes(resource) && r.verbs.includes(verb),
      );
    expect(has("authentication.k8s.io", "tokenreviews", "create")).toBe(true);
    expect(has("authorization.k8s.io", "subjectaccessreviews", "create")).toBe(true);
    expect(has("cbt.storage.k8s.io", "snapshotmetadataservices", "get")).toBe(true);
    for (const r of ["volumesnapshots", "volumesnapshotcontents", "volumesnapshotclasses"]) {
      expect(has("snapshot.storage.k8s.io", r, "get")).toBe(true);
      expect(has("snapshot.storage.k8s.io", r, "list")).toBe(true);
    }
  });

  test("network policies open the port, to anyone or to snapshotMetadataFrom", async () => {
    const ingress = async (set: string[]) =>
      (
        find(
          await rendered(["snapshots.enabled=true", "networkPolicy.enabled=true", ...set]),
          "NetworkPolicy",
          "-csi-controller",
        ).spec as { ingress: unknown[] }
      ).ingress;
    expect(await ingress([])).toEqual([{ ports: [{ port: 50051, protocol: "TCP" }] }]);
    const limited = await ingress([
      "networkPolicy.snapshotMetadataFrom[0].namespaceSelector.matchLabels.backup=yes",
    ]);
    expect(limited).toEqual([
      {
        ports: [{ port: 50051, protocol: "TCP" }],
        from: [{ namespaceSelector: { matchLabels: { backup: "yes" } } }],
      },
    ]);
    // Without snapshots the controller's policy stays closed.
    const closed = find(await rendered(["networkPolicy.enabled=true"]), "NetworkPolicy", "-csi-controller");
    expect((closed.spec as { ingress: unknown[] }).ingress).toEqual([]);
  });

  test("the agent's block-metadata directory: an emptyDir beside its own target, the host's across Pods", async () => {
    const own = await rendered([]);
    const agent = podSpec(find(own, "DaemonSet", "-agent"));
    expect(agent.volumes?.find((v) => v.name === "block-metadata")).toEqual({
      name: "block-metadata",
      emptyDir: {},
    });
    const a = container(agent, "agent");
    expect(a.env?.find((e) => e.name === "DISTORT_BLOCK_METADATA_DIR")?.value).toBe(
      "/var/lib/distort/block-metadata",
    );
    expect(a.volumeMounts?.find((m) => m.name === "block-metadata")).toEqual({
      name: "block-metadata",
      mountPath: "/var/lib/distort/block-metadata",
    });

    const lab = await rendered([], ["examples/lab-cluster.yaml"]);
    const hostDir = { path: "/var/lib/distort/block-metadata", type: "DirectoryOrCreate" };
    const agentLab = podSpec(find(lab, "DaemonSet", "-agent"));
    const target = podSpec(find(lab, "DaemonSet", "-agent-nvmf-tgt"));
    for (const spec of [agentLab, target])
      expect(spec.volumes?.find((v) => v.name === "block-metadata")?.hostPath).toEqual(hostDir);
    const tgt = container(target, "nvmf-tgt");
    const m = tgt.volumeMounts?.find((x) => x.name === "block-metadata");
    expect(m).toEqual({ name: "block-metadata", mountPath: "/var/lib/distort/block-metadata" });
    // The kernel-backend variant runs no SPDK target: nothing to share.
    const kernel = podSpec(find(lab, "DaemonSet", "-agent-kernel"));
    expect(kernel.volumes?.some((v) => v.name === "block-metadata")).toBe(false);
  });
});

describe("against a cluster", () => {
  let tc: TestCluster;
  let ns: string;

  beforeAll(async () => {
    tc = await testCluster();
    await installSnapshotCrds(tc.conn);
    await installSnapshotMetadataCrd(tc.conn);
    ns = await tc.namespace("smd-chart");
  }, 600_000);

  afterAll(async () => {
    await tc?.stop();
  });

  const renderLive = async () => {
    const r = await runHelm(helm, [
      "template",
      RELEASE,
      CHART_DIR,
      "--namespace",
      ns,
      "--set",
      "snapshots.enabled=true",
      "--dry-run=server",
      "--kubeconfig",
      tc.kubeconfigPath,
    ]);
    if (r.code !== 0) throw new Error(`helm template --dry-run=server: ${r.stderr}`);
    return parseAllDocuments(r.stdout)
      .map((d) => d.toJS() as KubeDoc | null)
      .filter((o): o is KubeDoc => o !== null);
  };

  test("an existing TLS Secret is kept: the same pair and the same published CA", async () => {
    const list = await renderLive();
    const secret = list.find(
      (d) => d?.kind === "Secret" && d.metadata.name === SECRET,
    ) as unknown as k8s.V1Secret;
    expect(secret).toBeDefined();
    // What `helm install` would have created.
    await tc.conn.api(k8s.CoreV1Api).createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: SECRET }, type: "kubernetes.io/tls", data: secret.data },
    });
    for (let i = 0; i < 2; i++) {
      const again = await renderLive();
      const s = again.find(
        (d) => d?.kind === "Secret" && d.metadata.name === SECRET,
      ) as unknown as k8s.V1Secret;
      const sms = again.find((d) => d?.kind === "SnapshotMetadataService") as unknown as {
        spec: { caCert: string };
      };
      expect(s.data).toEqual(secret.data as Record<string, string>);
      expect(sms.spec.caCert).toBe(secret.data?.["ca.crt"] as string);
    }
  }, 120_000);

  test("without a Secret every render makes a new pair (what `helm template` alone prints)", async () => {
    const a = await rendered(["snapshots.enabled=true"]);
    const b = await rendered(["snapshots.enabled=true"]);
    const ca = (objs: KubeDoc[]) =>
      (find(objs, "Secret", "-tls") as unknown as k8s.V1Secret).data?.["ca.crt"];
    expect(ca(a)).not.toBe(ca(b));
  });
});
