// The chart against real tools: helm lint is clean for the default values and every example,
// helm refuses values the schema forbids, every rendered object of every profile passes the real
// kube-apiserver's server-side dry run (strict field validation), and the env/args the templates
// render are accepted by the binaries' own configuration parsers.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { parseAgentConfig } from "../agent/config.ts";
import { parseWatchdogConfig, TARGET_WATCHDOG_MODE } from "../agent/watchdog/main.ts";
import { parseCsiConfig } from "../csi/config.ts";
import { parseParameters } from "../csi/controller/parameters.ts";
import { parseLivenessConfig, parseRegistrarConfig, sidecarModeOf } from "../csi/sidecar/config.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { installSnapshotMetadataCrd } from "../lab/cluster/snapshot-crds.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { splitSimArgs } from "../lab/csi-node.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { parseConfig as parseManagerConfig } from "../manager/config.ts";
import {
  CHART_DIR,
  Discovery,
  ensure,
  type KubeDoc,
  type Profile,
  profiles,
  render,
  runHelm,
  submit,
  valueArgs,
} from "./chart-support.ts";

let helm: string;
let tc: TestCluster;
let discovery: Discovery;

/**
 * Kinds the test cluster does not serve get a CRD carrying the fields the chart writes, so their
 * objects are validated too (strict field validation rejects any field these schemas omit).
 */
const FOREIGN_CRDS = [
  {
    group: "storage.dpu.nvidia.com",
    kind: "StorageVendor",
    plural: "storagevendors",
    scope: "Namespaced",
    spec: {
      type: "object",
      required: ["storageClassName", "pluginName"],
      properties: { storageClassName: { type: "string" }, pluginName: { type: "string" } },
    },
  },
  {
    group: "monitoring.coreos.com",
    kind: "ServiceMonitor",
    plural: "servicemonitors",
    scope: "Namespaced",
    spec: {
      type: "object",
      required: ["selector", "endpoints"],
      properties: {
        selector: { type: "object", "x-kubernetes-preserve-unknown-fields": true },
        namespaceSelector: {
          type: "object",
          properties: { matchNames: { type: "array", items: { type: "string" } } },
        },
        endpoints: {
          type: "array",
          items: {
            type: "object",
            properties: { port: { type: "string" }, path: { type: "string" }, interval: { type: "string" } },
          },
        },
      },
    },
  },
  {
    group: "monitoring.coreos.com",
    kind: "PrometheusRule",
    plural: "prometheusrules",
    scope: "Namespaced",
    spec: {
      type: "object",
      required: ["groups"],
      properties: {
        groups: {
          type: "array",
          items: {
            type: "object",
            required: ["name", "rules"],
            properties: {
              name: { type: "string" },
              rules: {
                type: "array",
                items: {
                  type: "object",
                  required: ["expr"],
                  properties: {
                    alert: { type: "string" },
                    expr: { type: "string" },
                    for: { type: "string" },
                    labels: { type: "object", additionalProperties: { type: "string" } },
                    annotations: { type: "object", additionalProperties: { type: "string" } },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
  {
    group: "snapshot.storage.k8s.io",
    kind: "VolumeSnapshotClass",
    plural: "volumesnapshotclasses",
    scope: "Cluster",
    // VolumeSnapshotClass keeps its fields at the top level, not under spec.
    top: {
      driver: { type: "string" },
      deletionPolicy: { type: "string", enum: ["Delete", "Retain"] },
      parameters: { type: "object", additionalProperties: { type: "string" } },
    },
  },
] as const;

async function installForeignCrds(): Promise<void> {
  for (const c of FOREIGN_CRDS) {
    const version =
      c.group === "monitoring.coreos.com" ? "v1" : c.group.startsWith("snapshot") ? "v1" : "v1alpha1";
    const props: Record<string, unknown> = {
      apiVersion: { type: "string" },
      kind: { type: "string" },
      metadata: { type: "object" },
      ...("spec" in c ? { spec: c.spec } : {}),
      ...("top" in c ? c.top : {}),
    };
    const name = `${c.plural}.${c.group}`;
    // An installation of the real CRD (a cluster that has it) is left alone.
    const existing = await tc.conn.request(`/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${name}`);
    if (existing.ok) continue;
    await ensure(tc.conn, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
      apiVersion: "apiextensions.k8s.io/v1",
      kind: "CustomResourceDefinition",
      // *.k8s.io groups are protected: the apiserver wants an approval note (an "unapproved"
      // one is accepted).
      metadata: {
        name,
        annotations: { "api-approved.kubernetes.io": "unapproved, stand-in for a chart test" },
      },
      spec: {
        group: c.group,
        scope: c.scope,
        names: { kind: c.kind, plural: c.plural, singular: c.kind.toLowerCase(), listKind: `${c.kind}List` },
        versions: [
          {
            name: version,
            served: true,
            storage: true,
            schema: { openAPIV3Schema: { type: "object", properties: props } },
          },
        ],
      },
    });
    const deadline = Date.now() + 30_000;
    for (;;) {
      const r = await tc.conn.request(`/apis/${c.group}/${version}/${c.plural}?limit=1`);
      if (r.ok) break;
      if (Date.now() > deadline) throw new Error(`${name} not served`);
      await Bun.sleep(50);
    }
  }
}

beforeAll(async () => {
  helm = await ensureHelm();
  tc = await testCluster();
  discovery = new Discovery(tc.conn);
  await installForeignCrds();
  // The real SnapshotMetadataService CRD (external-snapshot-metadata's, with its CEL rules): the
  // snapshot profiles render one.
  await installSnapshotMetadataCrd(tc.conn);
  // The DPU-cluster example puts the StorageVendor in DPF's namespace.
  await ensure(tc.conn, "/api/v1/namespaces", { metadata: { name: "dpf-operator-system" } });
}, 600_000);

afterAll(async () => {
  await tc?.stop();
});

describe("helm lint", () => {
  for (const p of profiles()) {
    test(`${p.name}: no warning, no error (--strict)`, async () => {
      const r = await runHelm(helm, ["lint", "--strict", CHART_DIR, ...valueArgs(p)]);
      expect(`${r.stdout}${r.stderr}`).not.toMatch(/\[(WARNING|ERROR)\]/);
      expect(r.code).toBe(0);
    });
  }

  test.each([
    ["agent.spdk.coreMask=0x0", "/agent/spdk/coreMask"],
    ["agent.portal.address=999.1.1.1", "/agent/portal/address"],
    ["manager.workers=0", "/manager/workers"],
    ["csi.defaultVolumeBytes=5000000", "/csi/defaultVolumeBytes"],
    ["manager.logLevl=debug", "logLevl"],
    ["agent.rebuild.perNode=65", "/agent/rebuild/perNode"],
    ["agent.rebuild.perNode=-1", "/agent/rebuild/perNode"],
    ["agent.rebuild.perNode=1.5", "/agent/rebuild/perNode"],
    ["agent.rebuild.maxBandwidthMBps=-1", "/agent/rebuild/maxBandwidthMBps"],
    ["agent.rebuild.maxBandwidthMBps=1000001", "/agent/rebuild/maxBandwidthMBps"],
    // Bounds of nested pipes (port(), ms(), the QoS limits), which the schema once dropped.
    ["agent.portal.port=65536", "/agent/portal/port"],
    ["agent.portal.port=0", "/agent/portal/port"],
    ["agent.reportPeriodMs=999", "/agent/reportPeriodMs"],
    [
      "volumeAttributesClasses[0].name=x,volumeAttributesClasses[0].qos.rwMBps=-1",
      "/volumeAttributesClasses/0/qos/rwMBps",
    ],
  ])("refuses %s", async (set, where) => {
    const r = await runHelm(helm, ["lint", CHART_DIR, "--set", set]);
    expect(r.code).not.toBe(0);
    expect(`${r.stdout}${r.stderr}`).toContain(where);
  });

  test("refuses a volume manager of the other backend, and a DPF class that does not delete", async () => {
    const r1 = await runHelm(helm, [
      "template",
      "x",
      CHART_DIR,
      "--set",
      "storageClasses[0].name=x,storageClasses[0].isDefault=false,storageClasses[0].backend=kernel,storageClasses[0].volumeManager=spdk-lvol,storageClasses[0].transport=tcp,storageClasses[0].fsType=ext4,storageClasses[0].reclaimPolicy=Delete,storageClasses[0].volumeBindingMode=Immediate,storageClasses[0].allowVolumeExpansion=false",
    ]);
    expect(r1.code).not.toBe(0);
    expect(r1.stderr).toContain("/storageClasses/0");
    const r2 = await runHelm(helm, [
      "template",
      "x",
      CHART_DIR,
      "-f",
      join(CHART_DIR, "examples", "dpu-cluster.yaml"),
      "--set",
      "storageClasses[0].reclaimPolicy=Retain,storageClasses[0].name=distort-dpf,storageClasses[0].isDefault=false,storageClasses[0].backend=spdk,storageClasses[0].volumeManager=spdk-lvol,storageClasses[0].transport=rdma,storageClasses[0].fsType=ext4,storageClasses[0].volumeBindingMode=Immediate,storageClasses[0].allowVolumeExpansion=true",
    ]);
    expect(r2.code).not.toBe(0);
    expect(r2.stderr).toContain("reclaimPolicy Delete");
  });
});

describe("server-side dry run of every rendered object", () => {
  for (const p of profiles()) {
    test(p.name, async () => {
      const ns = await tc.namespace("chart");
      const { objects } = await render(helm, p, "rel", ns);
      expect(objects.length).toBeGreaterThan(10);
      const failures: string[] = [];
      for (const o of objects) {
        const r = await submit(tc.conn, discovery, o, { dryRun: true });
        if (r.status !== 201 && r.status !== 200)
          failures.push(`${o.kind}/${o.metadata.name}: HTTP ${r.status} ${r.body.slice(0, 400)}`);
      }
      expect(failures).toEqual([]);
    });
  }
});

/** The rendered objects of one profile, grouped for the checks below. */
async function objectsOf(p: Profile): Promise<KubeDoc[]> {
  return (await render(helm, p, "rel", "distort-system")).objects;
}
const byKind = (objs: KubeDoc[], kind: string) => objs.filter((o) => o.kind === kind);
const named = (objs: KubeDoc[], kind: string, suffix: string) =>
  objs.find((o) => o.kind === kind && o.metadata.name.endsWith(suffix)) as KubeDoc;

interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: unknown }[];
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
}
const podSpec = (o: KubeDoc) =>
  (o.spec as { template: { spec: Record<string, unknown> } }).template.spec as {
    containers: Container[];
    volumes?: { name: string; hostPath?: { path: string }; emptyDir?: { medium?: string } }[];
    [k: string]: unknown;
  };
const envOf = (c: Container, fill: Record<string, string>) =>
  Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value ?? fill[e.name] ?? ""]));

describe("what the templates hand the binaries", () => {
  for (const p of profiles()) {
    test(`${p.name}: every binary's config parser accepts its rendered env and flags`, async () => {
      const objs = await objectsOf(p);
      const manager = podSpec(named(objs, "Deployment", "-manager")).containers[0] as Container;
      expect(() =>
        parseManagerConfig(envOf(manager, { POD_NAME: "m-0" }), { hostname: "h", randomSuffix: "r" }),
      ).not.toThrow();
      const agent = podSpec(named(objs, "DaemonSet", "-agent")).containers[0] as Container;
      // Downward-API values as kubelet fills them (the lab takes its portal from status.hostIP).
      const agentCfg = parseAgentConfig(
        envOf(agent, { NODE_NAME: "node-a", DISTORT_PORTAL_ADDRESS: "198.18.0.11" }),
      );
      expect(agentCfg.namespace).toBe("distort-system");
      // The target watchdog runs in the Pod that runs nvmf_tgt (the agent's, or the separate
      // target's), on the agent's socket, and nowhere else.
      const dogs = byKind(objs, "DaemonSet").flatMap((w) =>
        podSpec(w)
          .containers.filter((c) => c.name === "target-watchdog")
          .map((c) => ({ at: w.metadata.name, c })),
      );
      if (agentCfg.backends.includes("spdk")) {
        const where = agentCfg.nvmfTgtExternal ? "-agent-nvmf-tgt" : "-agent";
        expect(dogs.map((d) => d.at)).toEqual([named(objs, "DaemonSet", where).metadata.name]);
        const dog = (dogs[0] as { c: Container }).c;
        expect(dog.command).toEqual(["/usr/local/bin/distort-agent", TARGET_WATCHDOG_MODE]);
        const dogCfg = parseWatchdogConfig(envOf(dog, { NODE_NAME: "node-a" }));
        expect(dogCfg.spdkSocket).toBe(agentCfg.spdkSocket);
        expect(dogCfg.node).toBe("node-a");
      } else expect(dogs).toEqual([]);
      const ctl = podSpec(named(objs, "Deployment", "-csi-controller")).containers.find(
        (c) => c.name === "distort-csi",
      ) as Container;
      expect(parseCsiConfig(ctl.args ?? [], {}).mode).toBe("controller");
      const node = podSpec(named(objs, "DaemonSet", "-csi-node")).containers.find(
        (c) => c.name === "distort-csi",
      ) as Container;
      const nodeArgs = (node.args ?? []).map((a) => a.replace("$(NODE_NAME)", "node-a"));
      // The lab's node binary takes its --sim-* option off before the csi binary's parser.
      const labNode = (node as { command?: string[] }).command?.[0]?.endsWith("/distort-csi-lab");
      const nodeCfg = parseCsiConfig(labNode ? splitSimArgs(nodeArgs).csi : nodeArgs, {});
      expect(nodeCfg.nodeId).toBe("node-a");
      // The node plugin publishes and unpublishes only below kubelet's directory.
      expect(nodeCfg.kubeletDir).toStartWith("/");
      // Sidecars that run DISTORT's equivalents (distort-csi --mode=registrar|liveness).
      for (const w of [named(objs, "DaemonSet", "-csi-node"), named(objs, "Deployment", "-csi-controller")])
        for (const c of podSpec(w).containers) {
          const argv = [...(c.command ?? []).slice(1), ...(c.args ?? [])];
          const mode = sidecarModeOf(argv);
          if (mode === "registrar")
            expect(parseRegistrarConfig(argv, {}).csiSocketPath).toBe("/csi/csi.sock");
          if (mode === "liveness") expect(parseLivenessConfig(argv, {}).csiSocketPath).toBe("/csi/csi.sock");
        }
      for (const sc of byKind(objs, "StorageClass")) {
        const params = sc.parameters as Record<string, string>;
        try {
          parseParameters(params, "distort-system");
        } catch (err) {
          // A shared DH-HMAC-CHAP Secret is validated, then refused (generated keys replace it).
          if (!(params.dhchapSecretName && /not supported/.test(String(err)))) throw err;
        }
      }
      const dpuConfig = join(import.meta.dir, "..", "dpu", "config.ts");
      if (byKind(objs, "DaemonSet").some((o) => o.metadata.name.endsWith("-dpu")) && existsSync(dpuConfig)) {
        // dpu/ is being written alongside; once its parser exists it must accept the rendered env.
        const mod = (await import(dpuConfig)) as Record<string, unknown>;
        const parser = Object.values(mod).find(
          (f): f is (env: Record<string, string>) => unknown =>
            typeof f === "function" && /^parse/.test(f.name),
        );
        if (parser) {
          const dpu = podSpec(named(objs, "DaemonSet", "-dpu")).containers[0] as Container;
          expect(() => parser(envOf(dpu, { NODE_NAME: "dpu-a" }))).not.toThrow();
        }
      }
    });
  }

  test("default: shapes the issue asks for", async () => {
    const objs = await objectsOf(profiles()[0] as Profile);
    const driver = byKind(objs, "CSIDriver")[0] as KubeDoc;
    expect(driver.metadata.name).toBe(DRIVER_NAME);
    expect((driver.spec as { attachRequired: boolean }).attachRequired).toBe(true);
    expect((named(objs, "Deployment", "-manager").spec as { replicas: number }).replicas).toBe(2);
    expect(byKind(objs, "PodDisruptionBudget")).toHaveLength(1);
    expect(byKind(objs, "PriorityClass")).toHaveLength(1);
    expect(byKind(objs, "VolumeSnapshotClass")).toHaveLength(0);
    const agent = podSpec(named(objs, "DaemonSet", "-agent"));
    expect([agent.hostNetwork, agent.hostIPC, agent.hostPID]).toEqual([true, true, true]);
    expect(agent.volumes?.map((v) => v.hostPath?.path ?? v.emptyDir?.medium)).toEqual(
      expect.arrayContaining(["/dev", "/sys", "/lib/modules", "HugePages-2Mi"]),
    );
    const node = podSpec(named(objs, "DaemonSet", "-csi-node"));
    const nodeDriver = node.containers.find((c) => c.name === "distort-csi") as Container & {
      volumeMounts: { name: string; mountPropagation?: string }[];
    };
    expect(nodeDriver.volumeMounts.find((m) => m.name === "kubelet-dir")?.mountPropagation).toBe(
      "Bidirectional",
    );
    expect(node.containers.map((c) => c.name).sort()).toEqual(
      ["distort-csi", "liveness-probe", "node-driver-registrar"].sort(),
    );
    const ctl = podSpec(named(objs, "Deployment", "-csi-controller"));
    expect(ctl.containers.map((c) => c.name).sort()).toEqual(
      ["csi-attacher", "csi-provisioner", "csi-resizer", "distort-csi", "liveness-probe"].sort(),
    );
    expect((ctl.containers.find((c) => c.name === "csi-provisioner") as Container).args).toContain(
      "--worker-threads=100",
    );
    // Every container of every workload carries requests and limits.
    for (const w of [...byKind(objs, "Deployment"), ...byKind(objs, "DaemonSet")]) {
      for (const c of podSpec(w).containers) {
        expect({ c: `${w.metadata.name}/${c.name}`, cpu: c.resources?.limits?.cpu !== undefined }).toEqual({
          c: `${w.metadata.name}/${c.name}`,
          cpu: true,
        });
        expect(c.resources?.requests?.memory).toBeDefined();
      }
    }
  });

  // The host NQN in /etc/nvme is the node's identity on the fabric: a node plugin that could
  // rewrite it could claim another host's ACL entries, so no DISTORT pod mounts it writable
  // (neither the host's /etc/nvme nor the directory csi.node.nvmeConfigDir puts at /etc/nvme).
  for (const p of profiles()) {
    test(`${p.name}: /etc/nvme is mounted read-only wherever it is mounted`, async () => {
      const objs = await objectsOf(p);
      const seen: string[] = [];
      for (const w of byKind(objs, "DaemonSet")) {
        const spec = podSpec(w);
        const etcNvme = new Set(
          (spec.volumes ?? []).filter((v) => v.hostPath?.path === "/etc/nvme").map((v) => v.name),
        );
        for (const c of [...spec.containers, ...((spec.initContainers as Container[] | undefined) ?? [])]) {
          const mounts =
            (c as { volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[] })
              .volumeMounts ?? [];
          for (const m of mounts.filter((x) => etcNvme.has(x.name) || x.mountPath === "/etc/nvme")) {
            seen.push(`${w.metadata.name}/${c.name}`);
            expect({ at: `${w.metadata.name}/${c.name}`, readOnly: m.readOnly === true }).toEqual({
              at: `${w.metadata.name}/${c.name}`,
              readOnly: true,
            });
          }
        }
      }
      // The csi-node plugin always mounts it (it reads the host NQN there).
      expect(seen.some((s) => s.endsWith("-csi-node/distort-csi"))).toBe(true);
    });
  }

  test("dpu-cluster profile: NVIDIA's attacher, a deleting StorageClass, the StorageVendor and the plugin sockets", async () => {
    const p = profiles().find((x) => x.name === "examples/dpu-cluster.yaml") as Profile;
    const objs = await objectsOf(p);
    const ctl = podSpec(named(objs, "Deployment", "-csi-controller"));
    expect((ctl.containers.find((c) => c.name === "csi-attacher") as Container).image).toContain(
      "svvolumeattachment-attacher",
    );
    const vendor = byKind(objs, "StorageVendor")[0] as KubeDoc;
    const spec = vendor.spec as { storageClassName: string; pluginName: string };
    const sc = byKind(objs, "StorageClass").find((o) => o.metadata.name === spec.storageClassName) as KubeDoc;
    expect(sc.reclaimPolicy).toBe("Delete");
    expect(spec.pluginName).toBe("distort");
    const dpu = podSpec(named(objs, "DaemonSet", "-dpu"));
    expect(dpu.volumes?.map((v) => v.hostPath?.path)).toContain(
      "/var/lib/nvidia/storage/snap/plugins/distort",
    );
    expect((dpu.containers[0] as Container).env?.find((e) => e.name === "DISTORT_DPU_SOCKET")?.value).toBe(
      "/var/lib/nvidia/storage/snap/plugins/distort/dpu.sock",
    );
    const driver = byKind(objs, "CSIDriver")[0] as KubeDoc;
    expect((driver.spec as { attachRequired: boolean }).attachRequired).toBe(true);
  });
});
