// The PromQL name extraction behind the metric-coverage test: selectors with and without matchers,
// functions, aggregations with grouping lists, vector matching, ranges, offsets, numbers, strings.
import { expect, test } from "bun:test";
import { metricNames } from "./promql-names.ts";

test.each([
  ["up == 0", ["up"]],
  ['up{job="distort-agent-metrics"} == 0', ["up"]],
  ["increase(distort_nvmf_tgt_failures_total[15m]) >= 2", ["distort_nvmf_tgt_failures_total"]],
  ["time() - last_ts > 120", ["last_ts"]],
  ['sum by (instance, state) (paths{state!="live"}) > 0', ["paths"]],
  ["100 * (1 - free / total) > 85", ["free", "total"]],
  ['sum(increase(p{result="unschedulable"}[15m])) > 0 and on () sum(pending) > 0', ["p", "pending"]],
  ["a / on (x) group_left (y) b", ["a", "b"]],
  ["histogram_quantile(0.99, sum by (le, method) (rate(h_bucket[$__rate_interval])))", ["h_bucket"]],
  ["rate(x[5m] offset 1h30m) / 1e3 + 0x1f", ["x"]],
  ["count(v == 0) or vector(0)", ["v"]],
  ["sum without (instance) (y) / count(y)", ["y"]],
  ['m{a=~"$namespace", b="{not a name}"}', ["m"]],
  ["max_over_time(q[10m:1m])", ["q"]],
  ["# a comment naming nothing\nz", ["z"]],
] as const)("%s", (expr, names) => {
  expect(metricNames(expr)).toEqual([...names]);
});

test("unterminated strings and brackets throw", () => {
  expect(() => metricNames('x{a="b}')).toThrow(/unterminated/);
  expect(() => metricNames("rate(x[5m)")).toThrow(/unterminated/);
});
