// Which metrics the chart's alert rules and dashboard query that no DISTORT binary exports: the
// binaries' own registration functions (the ones their main modules call) fill fresh registries,
// and every name a PromQL expression selects must be one of their series.
import { registerAgentMetrics } from "../agent/metrics/node-metrics.ts";
import { registerCsiMetrics } from "../csi/metrics.ts";
import { Registry } from "../lib/metrics.ts";
import { registerManagerMetrics } from "../manager/metrics.ts";
import { metricNames } from "./promql-names.ts";

/**
 * Series Prometheus itself writes for every scrape target, which no binary exports: `up` is how
 * an agent that stopped answering shows.
 */
export const PROMETHEUS_SERIES: readonly string[] = ["up"];

/** Series names each binary's /metrics can show, by binary. */
export function exportedSeries(): Record<string, Set<string>> {
  const of = (register: (r: Registry) => unknown) => {
    const r = new Registry();
    register(r);
    return new Set(r.families().flatMap((f) => f.seriesNames));
  };
  return {
    agent: of(registerAgentMetrics),
    manager: of(registerManagerMetrics),
    csi: of(registerCsiMetrics),
  };
}

/** One PromQL expression and where it comes from (an alert name, a panel title). */
export interface Query {
  readonly source: string;
  readonly expr: string;
}

/** Every alert and recording rule expression of a PrometheusRule spec ({ groups }). */
export function ruleQueries(spec: {
  groups: { rules: { alert?: string; record?: string; expr: string }[] }[];
}): Query[] {
  return spec.groups.flatMap((g) =>
    g.rules.map((r) => ({ source: `rule ${r.alert ?? r.record}`, expr: String(r.expr) })),
  );
}

interface Panel {
  title?: string;
  targets?: { expr?: string }[];
  panels?: Panel[];
}

/** Every target expression of a Grafana dashboard's panels, and its templating queries. */
export function dashboardQueries(dashboard: {
  panels?: Panel[];
  templating?: { list?: { name: string; type: string; query?: unknown }[] };
}): Query[] {
  const out: Query[] = [];
  const walk = (ps: readonly Panel[]) => {
    for (const p of ps) {
      for (const t of p.targets ?? []) if (t.expr) out.push({ source: `panel ${p.title}`, expr: t.expr });
      walk(p.panels ?? []);
    }
  };
  walk(dashboard.panels ?? []);
  for (const v of dashboard.templating?.list ?? []) {
    if (v.type !== "query") continue;
    const q = typeof v.query === "string" ? v.query : (v.query as { query?: string } | undefined)?.query;
    // Grafana's label_values(<selector>, <label>): the selector is PromQL, the label is not.
    const m = /^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$/s.exec(q ?? "");
    if (m?.[1]) out.push({ source: `variable ${v.name}`, expr: m[1] });
    else if (q) out.push({ source: `variable ${v.name}`, expr: q });
  }
  return out;
}

/** "<source>: <metric>" for every metric a query selects that no binary exports; [] when covered. */
export function uncovered(queries: readonly Query[], exported = exportedSeries()): string[] {
  const known = new Set([...PROMETHEUS_SERIES, ...Object.values(exported).flatMap((s) => [...s])]);
  return queries.flatMap((q) =>
    metricNames(q.expr)
      .filter((n) => !known.has(n))
      .map((n) => `${q.source}: ${n}`),
  );
}
