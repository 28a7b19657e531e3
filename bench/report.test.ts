// Unit tests of the benchmark report helpers: percentiles, number formatting, the summary table
// (including failed benches and figures), marker replacement, and that the SVG charts are
// well-formed and byte-for-byte deterministic.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type BenchResult,
  fmt,
  growthExponent,
  growthLine,
  median,
  percentile,
  renderMarkdown,
  renderText,
  replaceBetweenMarkers,
  svgBarChart,
  svgHistogram,
  svgStack,
  tableRows,
  writeResult,
} from "./report.ts";

describe("percentile", () => {
  test("nearest rank over unsorted input, input left alone", () => {
    const xs = [5, 1, 4, 2, 3];
    expect(percentile(xs, 0)).toBe(1);
    expect(percentile(xs, 20)).toBe(1);
    expect(percentile(xs, 21)).toBe(2);
    expect(percentile(xs, 50)).toBe(3);
    expect(percentile(xs, 99)).toBe(5);
    expect(percentile(xs, 100)).toBe(5);
    expect(median(xs)).toBe(3);
    expect(xs).toEqual([5, 1, 4, 2, 3]);
  });
  test("p99 of 1..100 is 99", () => {
    expect(
      percentile(
        Array.from({ length: 100 }, (_, i) => i + 1),
        99,
      ),
    ).toBe(99);
  });
  test("refuses empty input and out-of-range p", () => {
    expect(() => percentile([], 50)).toThrow(RangeError);
    expect(() => percentile([1], 101)).toThrow(RangeError);
    expect(() => percentile([1], Number.NaN)).toThrow(RangeError);
  });
});

test("fmt: three significant digits, grouped thousands, dashes for non-finite", () => {
  expect(fmt(0)).toBe("0");
  expect(fmt(0.012345)).toBe("0.0123");
  expect(fmt(1.234)).toBe("1.23");
  expect(fmt(10)).toBe("10");
  expect(fmt(2.5)).toBe("2.5");
  expect(fmt(0.5)).toBe("0.5");
  expect(fmt(12.345)).toBe("12.3");
  expect(fmt(123.4)).toBe("123");
  expect(fmt(9999.6)).toBe("10000");
  expect(fmt(12345.6)).toBe("12 346");
  expect(fmt(1234567)).toBe("1 234 567");
  expect(fmt(-2.5)).toBe("-2.5");
  expect(fmt(Number.NaN)).toBe("-");
  expect(fmt(Number.POSITIVE_INFINITY)).toBe("-");
});

describe("table", () => {
  const result: BenchResult = {
    bench: "spdk-client",
    figures: [
      {
        id: "ours",
        label: "ours | 16 in flight",
        value: 5123.4,
        unit: "ops/s",
        better: "higher",
        yardstick: { label: "connect-per-call", value: 812, unit: "ops/s" },
        ratio: 6.31,
        ratioLabel: "ours / connect-per-call",
        target: { text: ">= 5x", met: true },
      },
      {
        id: "py",
        label: "rpc.py",
        value: Number.NaN,
        unit: "ops/s",
        better: "higher",
        target: { text: ">= 300x", met: false },
        failed: "pip: no network",
      },
    ],
  };
  const rows = tableRows([
    { bench: "spdk-client", result },
    { bench: "broken", failed: "exited with code 1" },
  ]);

  test("rows carry formatted value, yardstick, ratio and target; failures say so", () => {
    expect(rows).toEqual([
      {
        bench: "spdk-client",
        figure: "ours | 16 in flight",
        value: "5123 ops/s",
        yardstick: "connect-per-call: 812 ops/s",
        ratio: "6.31x (ours / connect-per-call)",
        target: "met: >= 5x",
      },
      {
        bench: "spdk-client",
        figure: "rpc.py",
        value: "FAILED",
        yardstick: "",
        ratio: "",
        target: "failed: pip: no network",
      },
      {
        bench: "broken",
        figure: "(bench)",
        value: "FAILED",
        yardstick: "",
        ratio: "",
        target: "exited with code 1",
      },
    ]);
  });

  test("text table aligns columns", () => {
    const lines = renderText(rows).split("\n");
    expect(lines).toHaveLength(5);
    expect(lines[0]?.startsWith("bench        figure")).toBe(true);
    expect(lines[2]?.indexOf("5123 ops/s")).toBe(lines[0]?.indexOf("value"));
  });

  test("markdown escapes pipes and pads columns", () => {
    const md = renderMarkdown(rows).split("\n");
    expect(md).toHaveLength(5);
    expect(md[0]?.startsWith("| bench       | figure ")).toBe(true);
    expect(md[1]?.startsWith("| ----------- | ------")).toBe(true);
    expect(md[2]).toContain("ours \\| 16 in flight");
    // Padded: every line has its pipes in the same columns.
    const pipes = (l: string) => [...l.matchAll(/(?<!\\)\|/g)].map((m) => m.index);
    for (const l of md) expect(pipes(l)).toEqual(pipes(md[0] as string));
  });

  test("writeResult writes the JSON the runner reads", () => {
    const dir = mkdtempSync(join(tmpdir(), "report-test-"));
    try {
      const file = join(dir, "r.json");
      const write = process.stdout.write;
      process.stdout.write = () => true;
      try {
        writeResult(result, { BENCH_RESULT_FILE: file });
      } finally {
        process.stdout.write = write;
      }
      const back = JSON.parse(readFileSync(file, "utf8")) as BenchResult;
      expect(back.figures[0]?.ratio).toBe(6.31);
      expect(back.figures[1]?.value).toBeNull(); // NaN travels as null, flagged by `failed`
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

test("replaceBetweenMarkers keeps markers and surroundings, refuses missing markers", () => {
  const doc = "intro\n<!-- s -->\nold\n<!-- e -->\nafter\n";
  expect(replaceBetweenMarkers(doc, "<!-- s -->", "<!-- e -->", "new")).toBe(
    "intro\n<!-- s -->\nnew\n<!-- e -->\nafter\n",
  );
  expect(() => replaceBetweenMarkers("no markers", "<!-- s -->", "<!-- e -->", "x")).toThrow();
  expect(() => replaceBetweenMarkers("<!-- e --> <!-- s -->", "<!-- s -->", "<!-- e -->", "x")).toThrow();
});

describe("svg", () => {
  const bars = [
    { label: "ours", value: 5000, note: "16 in flight" },
    { label: "connect-per-call", value: 700 },
    { label: "process per call <rpc.py>", value: 12.5 },
  ];

  test("bar chart: deterministic, labelled, escaped, log axis in decades", () => {
    const a = svgBarChart({ title: "SPDK & control path", unit: "RPC/s", bars, log: true });
    const b = svgBarChart({ title: "SPDK & control path", unit: "RPC/s", bars, log: true });
    expect(a).toBe(b);
    expect(a.startsWith("<svg xmlns=")).toBe(true);
    expect(a.trimEnd().endsWith("</svg>")).toBe(true);
    expect(a).not.toMatch(/<[^>]*font-size="[^"]*"[^>]*font-size=/); // no duplicate attributes
    expect(a).toContain("SPDK &amp; control path");
    expect(a).toContain("process per call &lt;rpc.py&gt;");
    expect(a).toContain("RPC/s (log scale)");
    for (const t of ["1", "10", "100", "1000", "10 000"]) expect(a).toContain(`>${t}</text>`);
    expect(a).toContain("5000 (16 in flight)");
    expect((a.match(/<rect /g) ?? []).length).toBe(4); // background + 3 bars
    expect((a.match(/fill="#2b6cb0"/g) ?? []).length).toBe(1); // only the first bar by default
    const hl = svgBarChart({ title: "t", unit: "u", bars: bars.map((b, i) => ({ ...b, highlight: i < 2 })) });
    expect((hl.match(/fill="#2b6cb0"/g) ?? []).length).toBe(2);
  });

  test("bar chart: linear axis starts at zero; log axis refuses non-positive values", () => {
    const lin = svgBarChart({ title: "t", unit: "ms", bars: [{ label: "a", value: 42 }] });
    expect(lin).toContain(">0</text>");
    expect(lin).toContain(">50</text>");
    expect(() => svgBarChart({ title: "t", unit: "u", bars: [{ label: "z", value: 0 }], log: true })).toThrow(
      RangeError,
    );
  });

  test("histogram: deterministic, bins counted, percentiles marked", () => {
    const values = Array.from({ length: 200 }, (_, i) => (i * 37) % 101);
    const a = svgHistogram({ title: "latency", unit: "ms", values, bins: 10 });
    expect(a).toBe(svgHistogram({ title: "latency", unit: "ms", values, bins: 10 }));
    expect((a.match(/fill="#2b6cb0"/g) ?? []).length).toBe(10);
    expect(a).toContain(`p50 ${percentile(values, 50)}`);
    expect(a).toContain(`p99 ${percentile(values, 99)}`);
    expect(a).toContain(">count</text>");
    expect(() => svgHistogram({ title: "x", unit: "ms", values: [] })).toThrow(RangeError);
  });
});

describe("growth", () => {
  test("the log-log exponent of linear, quadratic and constant series", () => {
    const sizes = [500, 1000, 2000];
    expect(growthExponent(sizes.map((s) => ({ size: s, value: 3 * s })))).toBeCloseTo(1, 9);
    expect(growthExponent(sizes.map((s) => ({ size: s, value: s * s })))).toBeCloseTo(2, 9);
    expect(growthExponent(sizes.map((s) => ({ size: s, value: 7 })))).toBeCloseTo(0, 9);
  });

  test("refuses what a log-log fit cannot take", () => {
    expect(() => growthExponent([{ size: 1, value: 1 }])).toThrow(RangeError);
    expect(() =>
      growthExponent([
        { size: 1, value: 1 },
        { size: 1, value: 2 },
      ]),
    ).toThrow(RangeError);
    expect(() =>
      growthExponent([
        { size: 1, value: 0 },
        { size: 2, value: 2 },
      ]),
    ).toThrow(RangeError);
  });

  test("growthLine states values, ratios and the exponent", () => {
    const line = growthLine("re-verify", "s", [
      { size: 500, value: 1 },
      { size: 1000, value: 2 },
    ]);
    expect(line).toBe(
      "re-verify: 500 -> 1 s, 1000 -> 2 s (x2 for x2 the work); log-log exponent 1 (1 = linear)",
    );
  });

  test("svgStack places the parts one below the other", () => {
    const bar = svgBarChart({ title: "a", unit: "s", bars: [{ label: "x", value: 1 }] });
    const h = Number(/height="(\d+)"/.exec(bar)?.[1]);
    const doc = svgStack("both", [bar, bar]);
    expect(doc.startsWith(`<svg xmlns="http://www.w3.org/2000/svg" width="720" height="${2 * h}"`)).toBe(
      true,
    );
    expect(doc).toContain(`<svg y="${h}" xmlns=`);
    expect(doc).toBe(svgStack("both", [bar, bar]));
    expect(() => svgStack("none", [])).toThrow(RangeError);
  });
});
