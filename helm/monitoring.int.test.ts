// The chart's monitoring: the PrometheusRule passes `promtool check rules` and the alert unit tests
// (`promtool test rules`, helm/testdata/alerts.promtool.yaml), every metric a rule or dashboard
// panel queries is one a DISTORT binary registers, and the objects render only when asked for.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify } from "yaml";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { ensurePromtool } from "../lab/cluster/promtool-tool.ts";
import { type KubeDoc, render } from "./chart-support.ts";
import { dashboardQueries, exportedSeries, ruleQueries, uncovered } from "./metric-coverage.ts";

const MONITORING = {
  name: "monitoring",
  files: [],
  set: [
    "metrics.prometheusRule.enabled=true",
    "metrics.grafanaDashboard.enabled=true",
    "metrics.serviceMonitor.enabled=true",
  ],
};
type RuleSpec = { groups: { name: string; rules: { alert?: string; expr: string; for?: string }[] }[] };

let helm: string;
let promtool: string;
let objects: KubeDoc[];
let rules: RuleSpec;
let dashboard: Parameters<typeof dashboardQueries>[0];
const dir = mkdtempSync(join(tmpdir(), "distort-rules-"));

async function promtoolRun(args: string[]): Promise<{ code: number; out: string }> {
  const p = Bun.spawn([promtool, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, out: out + err };
}

beforeAll(async () => {
  helm = await ensureHelm();
  promtool = await ensurePromtool();
  objects = (await render(helm, MONITORING, "distort", "distort-system")).objects;
  const rule = objects.find((o) => o.kind === "PrometheusRule");
  if (!rule) throw new Error("no PrometheusRule rendered");
  rules = rule.spec as RuleSpec;
  const cm = objects.find((o) => o.kind === "ConfigMap" && o.metadata.labels?.grafana_dashboard === "1");
  if (!cm) throw new Error("no dashboard ConfigMap rendered");
  dashboard = JSON.parse((cm.data as Record<string, string>)["distort.json"] as string);
  writeFileSync(join(dir, "rules.yaml"), stringify(rules));
  copyFileSync(join(import.meta.dir, "testdata", "alerts.promtool.yaml"), join(dir, "alerts.promtool.yaml"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("alert rules", () => {
  test("cover every alert of issue 17 item 4", () => {
    expect(rules.groups.flatMap((g) => g.rules.map((r) => r.alert)).sort()).toEqual([
      "DistortAttachmentStuck",
      "DistortLvstoreNearlyFull",
      "DistortPlacementFailing",
      "DistortStatisticsStale",
      "DistortStorageNodeDown",
      "DistortTargetDown",
      "DistortTargetRestarting",
      "DistortVolumeDegraded",
      "DistortVolumeFailed",
      "DistortVolumeHighLatency",
      "DistortVolumeInaccessible",
      "DistortVolumeNoLivePath",
    ]);
  });

  test("promtool check rules passes", async () => {
    const r = await promtoolRun(["check", "rules", "rules.yaml"]);
    expect(r.out).toContain("SUCCESS: 12 rules found");
    expect(r.code).toBe(0);
  });

  test("promtool test rules: the alerts fire as helm/testdata/alerts.promtool.yaml expects", async () => {
    const r = await promtoolRun(["test", "rules", "alerts.promtool.yaml"]);
    expect(r.out).toContain("SUCCESS");
    expect(r.code).toBe(0);
  });

  test("the node-down alert selects the job the ServiceMonitor gives the agent's metrics Service", () => {
    const svc = objects.find((o) => o.kind === "Service" && o.metadata.name.endsWith("-agent-metrics"));
    const down = rules.groups.flatMap((g) => g.rules).find((r) => r.alert === "DistortStorageNodeDown");
    expect(svc).toBeDefined();
    expect(down?.expr).toBe(`up{job="${svc?.metadata.name}"} == 0`);
  });
});

describe("metric coverage", () => {
  test("every metric the rules and the dashboard query is exported by a binary", () => {
    const queries = [...ruleQueries(rules), ...dashboardQueries(dashboard)];
    expect(queries.length).toBeGreaterThan(30);
    expect(uncovered(queries)).toEqual([]);
  });

  test("a rule naming a metric no binary exports fails the check, though promtool accepts it", async () => {
    const bad: RuleSpec = {
      groups: [
        ...rules.groups,
        { name: "typo", rules: [{ alert: "DistortTypo", expr: "rate(distort_volume_read_ops[5m]) > 0" }] },
      ],
    };
    expect(uncovered(ruleQueries(bad))).toEqual(["rule DistortTypo: distort_volume_read_ops"]);
    writeFileSync(join(dir, "bad.yaml"), stringify(bad));
    const r = await promtoolRun(["check", "rules", "bad.yaml"]);
    expect(r.code).toBe(0);
  });

  test("the binaries' registrations are what is checked against: each exports its own families", () => {
    const s = exportedSeries();
    expect(s.agent?.has("distort_volume_read_ops_total")).toBe(true);
    expect(s.agent?.has("distort_placements_total")).toBe(false);
    expect(s.manager?.has("distort_placements_total")).toBe(true);
    expect(s.csi?.has("distort_csi_node_paths")).toBe(true);
    expect(s.csi?.has("distort_csi_call_duration_seconds_bucket")).toBe(true);
  });
});

test("by default neither the PrometheusRule nor the dashboard renders", async () => {
  const { objects: plain } = await render(
    helm,
    { name: "default", files: [], set: [] },
    "distort",
    "distort-system",
  );
  expect(plain.filter((o) => o.kind === "PrometheusRule" || o.metadata.labels?.grafana_dashboard)).toEqual(
    [],
  );
});

test("the dashboard ConfigMap carries the grafana_dashboard label and a dashboard with panels", () => {
  const cm = objects.find((o) => o.kind === "ConfigMap" && o.metadata.labels?.grafana_dashboard === "1");
  expect(cm?.metadata.namespace).toBe("distort-system");
  expect((dashboard as { uid?: string }).uid).toBe("distort-overview");
  expect(dashboardQueries(dashboard).length).toBeGreaterThan(20);
});
