// The portal boundary of the chart (networkPolicy.portal) against real tools: the real
// ClusterNetworkPolicy CRD (network-policy-api, from the Go module proxy) installed in a real
// kube-apiserver accepts what the chart renders, the Deny rules cover exactly the ports the
// rendered agent and StorageClasses make the targets listen on, and helm refuses the switch when
// the cluster does not serve the kind or the values name no network.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse, stringify } from "yaml";
import { parseAgentConfig } from "../agent/config.ts";
import { parseParameters } from "../csi/controller/parameters.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { ensureClusterNetworkPolicyCrd } from "../lab/cluster/tools.ts";
import { CHART_DIR, Discovery, ensure, type KubeDoc, runHelm, submit } from "./chart-support.ts";

const CNP_API = "policy.networking.k8s.io/v1beta1";
const SERVED = ["--api-versions", `${CNP_API}/ClusterNetworkPolicy`];
/** A class with a listener port of its own besides the agent's, so the rule must carry both. */
const WITH_POLICY = [
  "--set",
  "networkPolicy.portal.enabled=true",
  "--set",
  "networkPolicy.portal.networks={192.0.2.0/24,2001:db8::/64}",
  "--set",
  "networkPolicy.portal.exemptNamespaces={monitoring}",
  "--set",
  "agent.portal.port=4430",
  "-f",
  classesWithPort(4431),
];

/** A values file holding the chart's default StorageClasses, the second with a listener port of its own. */
function classesWithPort(port: number): string {
  const values = parse(readFileSync(join(CHART_DIR, "values.yaml"), "utf8")) as {
    storageClasses: Record<string, unknown>[];
  };
  const classes = values.storageClasses.map((c, i) => (i === 1 ? { ...c, portalPort: port } : c));
  const file = join(mkdtempSync(join(tmpdir(), "distort-portal-policy-")), "classes.yaml");
  writeFileSync(file, stringify({ storageClasses: classes }));
  return file;
}

let helm: string;
let tc: TestCluster;
let discovery: Discovery;

interface Egress {
  name: string;
  action: string;
  to: { networks: string[] }[];
  protocols: { tcp: { destinationPort: { number: number } } }[];
}
interface Cnp extends KubeDoc {
  spec: {
    tier: string;
    priority: number;
    subject: { namespaces: Record<string, unknown> };
    egress: Egress[];
  };
}

async function template(args: string[]): Promise<KubeDoc[]> {
  const r = await runHelm(helm, ["template", "rel", CHART_DIR, "--namespace", "distort-system", ...args]);
  if (r.code !== 0) throw new Error(`helm template failed: ${r.stderr}`);
  return r.stdout
    .split(/^---$/m)
    .map((d) => parse(d) as KubeDoc | null)
    .filter((o): o is KubeDoc => o !== null);
}

beforeAll(async () => {
  helm = await ensureHelm();
  const crdFile = await ensureClusterNetworkPolicyCrd();
  tc = await testCluster();
  discovery = new Discovery(tc.conn);
  await ensure(
    tc.conn,
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    parse(readFileSync(crdFile, "utf8")),
  );
  const deadline = Date.now() + 30_000;
  while (!(await tc.conn.request(`/apis/${CNP_API}/clusternetworkpolicies?limit=1`)).ok) {
    if (Date.now() > deadline) throw new Error("ClusterNetworkPolicy not served");
    await Bun.sleep(50);
  }
}, 600_000);

afterAll(async () => {
  await tc?.stop();
});

describe("networkPolicy.portal", () => {
  test("the real CRD accepts both policies, and their Deny rules name exactly the ports the targets listen on", async () => {
    const objects = await template([...SERVED, ...WITH_POLICY]);
    const cnps = objects.filter((o): o is Cnp => o.kind === "ClusterNetworkPolicy");
    expect(cnps.map((c) => c.metadata.name).sort()).toEqual([
      "rel-distort-agent-health",
      "rel-distort-portals",
    ]);
    for (const c of cnps) {
      const created = await submit(tc.conn, discovery, c, { dryRun: false });
      expect(`${created.status} ${created.body}`).toMatch(/^201 /);
    }
    // What the binaries will really do: the agent's portal port through its own config parser,
    // each StorageClass's through the CSI controller's parameter parser.
    const agent = objects.find(
      (o) => o.kind === "DaemonSet" && o.metadata.name.endsWith("-agent"),
    ) as KubeDoc;
    const container = (
      agent.spec as {
        template: {
          spec: {
            containers: { env: { name: string; value?: string }[]; ports: { containerPort: number }[] }[];
          };
        };
      }
    ).template.spec.containers[0];
    if (!container) throw new Error("the agent DaemonSet has no container");
    const env = Object.fromEntries(container.env.map((e) => [e.name, e.value ?? ""]));
    const cfg = parseAgentConfig({ ...env, NODE_NAME: "node-a", DISTORT_PORTAL_ADDRESS: "192.0.2.10" });
    const listening = new Set<number>([cfg.portalPort]);
    for (const sc of objects.filter((o) => o.kind === "StorageClass")) {
      const port = parseParameters(
        (sc as unknown as { parameters: Record<string, string> }).parameters,
        "distort-system",
      ).params.portalPort;
      if (port !== undefined) listening.add(port);
    }
    expect([...listening].sort()).toEqual([4430, 4431]);
    const portals = cnps.find((c) => c.metadata.name.endsWith("-portals")) as Cnp;
    expect(portals.spec.tier).toBe("Admin");
    expect(portals.spec.subject.namespaces).toEqual({});
    const [deny] = portals.spec.egress;
    expect(deny?.action).toBe("Deny");
    expect(deny?.to).toEqual([{ networks: ["192.0.2.0/24", "2001:db8::/64"] }]);
    expect(deny?.protocols.map((p) => p.tcp.destinationPort.number).sort()).toEqual([...listening].sort());
    // The health port: the one the agent container exposes, denied to all but the scrapers.
    const health = cnps.find((c) => c.metadata.name.endsWith("-agent-health")) as Cnp;
    expect(health.spec.egress[0]?.protocols.map((p) => p.tcp.destinationPort.number)).toEqual(
      container.ports.map((p) => p.containerPort),
    );
    expect(health.spec.subject.namespaces).toEqual({
      matchExpressions: [{ key: "kubernetes.io/metadata.name", operator: "NotIn", values: ["monitoring"] }],
    });
  });

  test("the API server's schema refuses a policy without networks, so the chart cannot render one", async () => {
    const [portals] = (await template([...SERVED, ...WITH_POLICY])).filter(
      (o): o is Cnp => o.kind === "ClusterNetworkPolicy",
    );
    if (!portals) throw new Error("no policy rendered");
    const broken = structuredClone(portals);
    broken.metadata.name = "broken";
    (broken.spec.egress[0] as Egress).to = [{ networks: [] }];
    const r = await submit(tc.conn, discovery, broken, { dryRun: true });
    expect(r.status).toBe(422);
    const chart = await runHelm(helm, [
      "template",
      "rel",
      CHART_DIR,
      ...SERVED,
      "--set",
      "networkPolicy.portal.enabled=true",
    ]);
    expect(chart.code).not.toBe(0);
    expect(chart.stderr).toContain("/networkPolicy/portal/networks");
  });

  test("refused with a clear reason on a cluster that does not serve ClusterNetworkPolicy", async () => {
    const r = await runHelm(helm, ["template", "rel", CHART_DIR, ...WITH_POLICY]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("does not serve");
  });

  test("a CIDR that is not one is refused by the values schema", async () => {
    const r = await runHelm(helm, [
      "template",
      "rel",
      CHART_DIR,
      ...SERVED,
      "--set",
      "networkPolicy.portal.enabled=true",
      "--set",
      "networkPolicy.portal.networks={10.0.0.300/24}",
    ]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("/networkPolicy/portal/networks/0");
  });

  test("off by default: nothing rendered", async () => {
    const objects = await template([]);
    expect(objects.filter((o) => o.kind === "ClusterNetworkPolicy")).toEqual([]);
  });
});
