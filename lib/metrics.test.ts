// Tests for the Prometheus registry: golden exposition text, escaping, histogram buckets, and the
// validation that keeps bad names and label sets out.

import { describe, expect, test } from "bun:test";
import { StorageError } from "./errors.ts";
import { Registry } from "./metrics.ts";

describe("render", () => {
  test("golden text: families sorted by name, series by label values, HELP/TYPE lines", () => {
    const r = new Registry();
    const reqs = r.counter({
      name: "http_requests_total",
      help: "Requests.",
      labelNames: ["code", "method"],
    });
    const temp = r.gauge({ name: "a_temperature", help: "Degrees." });
    reqs.inc({ method: "GET", code: "500" });
    reqs.inc({ method: "GET", code: "200" }, 3);
    reqs.inc({ code: "200", method: "GET" });
    temp.set({}, -1.5);
    expect(r.render()).toBe(
      [
        "# HELP a_temperature Degrees.",
        "# TYPE a_temperature gauge",
        "a_temperature -1.5",
        "# HELP http_requests_total Requests.",
        "# TYPE http_requests_total counter",
        'http_requests_total{code="200",method="GET"} 4',
        'http_requests_total{code="500",method="GET"} 1',
        "",
      ].join("\n"),
    );
  });

  test("rendering is independent of insertion order", () => {
    const build = (order: string[]) => {
      const r = new Registry();
      const c = r.counter({ name: "x_total", help: "x", labelNames: ["k"] });
      r.gauge({ name: "b", help: "b" });
      for (const k of order) c.inc({ k });
      return r.render();
    };
    expect(build(["b", "a", "c"])).toBe(build(["c", "b", "a"]));
  });

  test('escapes label values (\\ " newline) and help (\\ newline)', () => {
    const r = new Registry();
    const c = r.counter({ name: "esc_total", help: 'back\\slash "quoted"\nsecond line', labelNames: ["v"] });
    c.inc({ v: 'a\\b"c\nd' });
    expect(r.render()).toBe(
      [
        '# HELP esc_total back\\\\slash "quoted"\\nsecond line',
        "# TYPE esc_total counter",
        'esc_total{v="a\\\\b\\"c\\nd"} 1',
        "",
      ].join("\n"),
    );
  });

  test("histogram: cumulative buckets, +Inf equals count, _sum and _count", () => {
    const r = new Registry();
    const h = r.histogram({
      name: "lat_seconds",
      help: "Latency.",
      labelNames: ["op"],
      buckets: [0.1, 0.5, 1],
    });
    for (const v of [0.05, 0.1, 0.3, 0.7, 2, 5]) h.observe({ op: "read" }, v);
    expect(r.render()).toBe(
      [
        "# HELP lat_seconds Latency.",
        "# TYPE lat_seconds histogram",
        'lat_seconds_bucket{op="read",le="0.1"} 2',
        'lat_seconds_bucket{op="read",le="0.5"} 3',
        'lat_seconds_bucket{op="read",le="1"} 4',
        'lat_seconds_bucket{op="read",le="+Inf"} 6',
        'lat_seconds_sum{op="read"} 8.15',
        'lat_seconds_count{op="read"} 6',
        "",
      ].join("\n"),
    );
    expect(h.get({ op: "read" })).toEqual({ buckets: [2, 3, 4], sum: 8.15, count: 6 });
  });

  test("label-less metrics show a zero series from registration; labelled ones only once touched", () => {
    const r = new Registry();
    r.counter({ name: "c_total", help: "c" });
    r.histogram({ name: "h", help: "h", buckets: [1] });
    r.gauge({ name: "g", help: "g", labelNames: ["x"] });
    expect(r.render()).toBe(
      [
        "# HELP c_total c",
        "# TYPE c_total counter",
        "c_total 0",
        "# HELP g g",
        "# TYPE g gauge",
        "# HELP h h",
        "# TYPE h histogram",
        'h_bucket{le="1"} 0',
        'h_bucket{le="+Inf"} 0',
        "h_sum 0",
        "h_count 0",
        "",
      ].join("\n"),
    );
  });

  test("special values render as Prometheus spells them", () => {
    const r = new Registry();
    const g = r.gauge({ name: "g", help: "g", labelNames: ["k"] });
    g.set({ k: "inf" }, Number.POSITIVE_INFINITY);
    g.set({ k: "ninf" }, Number.NEGATIVE_INFINITY);
    g.set({ k: "small" }, 1e-7);
    expect(r.render()).toContain('g{k="inf"} +Inf\ng{k="ninf"} -Inf\ng{k="small"} 1e-7\n');
    expect(new Registry().render()).toBe("");
  });
});

describe("values", () => {
  test("gauge set/inc/dec and counter get", () => {
    const r = new Registry();
    const g = r.gauge({ name: "g", help: "g", labelNames: ["k"] });
    g.set({ k: "a" }, 5);
    g.inc({ k: "a" });
    g.dec({ k: "a" }, 3);
    expect(g.get({ k: "a" })).toBe(3);
    expect(g.get({ k: "b" })).toBe(0);
    const c = r.counter({ name: "c_total", help: "c" });
    c.inc();
    c.inc(undefined, 2.5);
    expect(c.get()).toBe(3.5);
  });
});

describe("validation", () => {
  const r = () => new Registry();
  test.each([
    [
      "metric name starting with a digit",
      () => r().counter({ name: "1abc", help: "" }),
      /invalid metric name/,
    ],
    ["metric name with a dash", () => r().gauge({ name: "a-b", help: "" }), /invalid metric name/],
    ["empty metric name", () => r().gauge({ name: "", help: "" }), /invalid metric name/],
    [
      "label name with a dot",
      () => r().counter({ name: "a", help: "", labelNames: ["x.y"] }),
      /invalid label name "x.y"/,
    ],
    [
      "reserved label prefix",
      () => r().counter({ name: "a", help: "", labelNames: ["__x"] }),
      /invalid label name/,
    ],
    [
      "duplicate label name",
      () => r().counter({ name: "a", help: "", labelNames: ["x", "x"] }),
      /duplicate label name/,
    ],
    [
      "le on a histogram",
      () => r().histogram({ name: "h", help: "", labelNames: ["le"] }),
      /"le" is reserved/,
    ],
    [
      "unsorted buckets",
      () => r().histogram({ name: "h", help: "", buckets: [1, 0.5] }),
      /strictly increasing/,
    ],
    [
      "duplicate buckets",
      () => r().histogram({ name: "h", help: "", buckets: [1, 1] }),
      /strictly increasing/,
    ],
    ["infinite bucket", () => r().histogram({ name: "h", help: "", buckets: [1, Infinity] }), /finite/],
    ["no buckets", () => r().histogram({ name: "h", help: "", buckets: [] }), /at least one bucket/],
  ] as const)("rejects %s", (_, fn, message) => {
    expect(fn).toThrow(message);
    expect(fn).toThrow(StorageError);
  });

  test("duplicate registration is rejected, also across types", () => {
    const reg = new Registry();
    reg.counter({ name: "dup_total", help: "d" });
    expect(() => reg.counter({ name: "dup_total", help: "d" })).toThrow(/already registered \(pass reuse/);
    expect(() => reg.gauge({ name: "dup_total", help: "d" })).toThrow(/different type/);
  });

  test("reuse returns the same metric only when the definition matches", () => {
    const reg = new Registry();
    const a = reg.counter({ name: "shared_total", help: "s", labelNames: ["c"], reuse: true });
    const b = reg.counter({ name: "shared_total", help: "s", labelNames: ["c"], reuse: true });
    expect(b).toBe(a);
    a.inc({ c: "x" });
    expect(b.get({ c: "x" })).toBe(1);
    expect(() => reg.counter({ name: "shared_total", help: "s", labelNames: ["d"], reuse: true })).toThrow(
      /different/,
    );
    reg.histogram({ name: "hh", help: "h", buckets: [1, 2], reuse: true });
    expect(() => reg.histogram({ name: "hh", help: "h", buckets: [1, 3], reuse: true })).toThrow(/different/);
  });

  test("observations with missing, extra or non-string labels are rejected", () => {
    const reg = new Registry();
    const c = reg.counter({ name: "l_total", help: "l", labelNames: ["a", "b"] });
    const h = reg.histogram({ name: "lh", help: "l", labelNames: ["a"], buckets: [1] });
    expect(() => c.inc({ a: "1" } as never)).toThrow(/missing b/);
    expect(() => c.inc({ a: "1", b: "2", z: "3" } as never)).toThrow(/unexpected z/);
    expect(() => c.inc()).toThrow(/missing a, b/);
    expect(() => c.inc({ a: "1", b: 2 } as never)).toThrow(/must be a string/);
    expect(() => h.observe({} as never, 1)).toThrow(/missing a/);
    expect(() => h.observe({ a: "x" }, Number.NaN)).toThrow(/NaN/);
    expect(() => c.inc({ a: "1", b: "2" }, -1)).toThrow(/>= 0/);
    // Nothing half-recorded by the failed calls.
    expect(reg.render()).not.toContain("l_total{");
  });
});

describe("snapshot families and the family list", () => {
  test("replace swaps the whole series set; absent series disappear", () => {
    const reg = new Registry();
    const ops = reg.snapshot<"volume">({
      kind: "counter",
      name: "x_ops_total",
      help: "ops",
      labelNames: ["volume"],
    });
    ops.replace([
      [{ volume: "a" }, 3],
      [{ volume: "b" }, 5],
    ]);
    expect(reg.render()).toContain('x_ops_total{volume="b"} 5');
    ops.replace([[{ volume: "a" }, 4]]);
    const text = reg.render();
    expect(text).toContain("# TYPE x_ops_total counter");
    expect(text).toContain('x_ops_total{volume="a"} 4');
    expect(text).not.toContain('volume="b"');
    expect(ops.get({ volume: "a" })).toBe(4);
  });

  test("a bad row leaves the family unchanged", () => {
    const reg = new Registry();
    const g = reg.snapshot<"v">({ kind: "counter", name: "y_total", help: "y", labelNames: ["v"] });
    g.replace([[{ v: "a" }, 1]]);
    expect(() => g.replace([[{ v: "a" }, -1]])).toThrow(/>= 0/);
    expect(() =>
      g.replace([
        [{ v: "a" }, 1],
        [{ v: "a" }, 2],
      ]),
    ).toThrow(/two rows/);
    expect(() => g.replace([[{ w: "a" } as never, 1]])).toThrow(/wrong labels/);
    expect(g.get({ v: "a" })).toBe(1);
  });

  test("a snapshot family never reuses a plain one of the same definition", () => {
    const reg = new Registry();
    reg.gauge({ name: "z", help: "z", reuse: true });
    expect(() => reg.snapshot({ kind: "gauge", name: "z", help: "z", reuse: true })).toThrow(/different/);
  });

  test("families lists names, kinds and the series names a scrape shows", () => {
    const reg = new Registry();
    reg.histogram({ name: "h_seconds", help: "h" });
    reg.counter({ name: "c_total", help: "c", labelNames: ["k"] });
    expect(reg.families().map((f) => [f.name, f.kind, f.seriesNames])).toEqual([
      ["c_total", "counter", ["c_total"]],
      ["h_seconds", "histogram", ["h_seconds_bucket", "h_seconds_sum", "h_seconds_count"]],
    ]);
  });
});
