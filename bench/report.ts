// The benchmark result protocol shared by bench/main.ts and every bench/*.bench.ts: the result
// shape, writing it where the runner asks, number formatting, percentiles, the summary table, and
// small dependency-free SVG charts whose output depends only on their input.
import { writeFileSync } from "node:fs";

/** Which direction is an improvement for a figure. */
export type Better = "higher" | "lower";

/** One measured number, optionally set against a yardstick measured in the same run. */
export interface Figure {
  /** Stable identifier within its bench, e.g. "ours-ops". */
  id: string;
  /** What a reader sees in the table. */
  label: string;
  /** NaN (stored as null) only together with `failed`. */
  value: number;
  unit: string;
  better: Better;
  /** The reference this figure is compared with, measured in the same run. */
  yardstick?: { label: string; value: number; unit: string };
  /** value relative to the yardstick (or another figure); its meaning is in ratioLabel. */
  ratio?: number;
  /** e.g. "ours / connect-per-call". */
  ratioLabel?: string;
  /** A goal from the issue, and whether this run met it. */
  target?: { text: string; met: boolean };
  /** Set when the figure could not be measured: why. The table shows it as failed. */
  failed?: string;
}

/** What one bench process reports. */
export interface BenchResult {
  bench: string;
  figures: Figure[];
  notes?: string[];
  /** Where the time went, when a target was missed (phases with timestamps). */
  profile?: string[];
}

/** The env variable through which bench/main.ts tells a bench where to write its result. */
export const RESULT_FILE_ENV = "BENCH_RESULT_FILE";

/**
 * Writes `result` as JSON to $BENCH_RESULT_FILE when the runner set it, and always prints a
 * readable summary to stdout so a bench run on its own shows its figures. Never throws for a
 * missing variable; a write failure does throw (the runner would otherwise report nothing).
 */
export function writeResult(
  result: BenchResult,
  env: Record<string, string | undefined> = process.env,
): void {
  const path = env[RESULT_FILE_ENV];
  if (path) writeFileSync(path, `${JSON.stringify(result, null, 2)}\n`);
  const rows = tableRows([{ bench: result.bench, result }]);
  process.stdout.write(`\n${renderText(rows)}\n`);
  for (const n of result.notes ?? []) process.stdout.write(`  note: ${n}\n`);
  for (const p of result.profile ?? []) process.stdout.write(`  profile: ${p}\n`);
}

/**
 * The p-th percentile (0..100) of `values` by the nearest-rank method: the smallest value with at
 * least p% of the values at or below it (p=0 gives the minimum, p=100 the maximum). Does not
 * modify `values`. Throws RangeError for an empty list or p outside 0..100.
 */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) throw new RangeError("percentile of an empty list");
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile ${p} is outside 0..100`);
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1] as number;
}

/** The median (nearest-rank p50) of `values`; same contract as percentile(). */
export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/**
 * A number for people: at most three significant digits after the point (trailing zeros dropped),
 * integers from 100 up, thousands grouped with a space ("12 345"), "-" for NaN or infinities.
 * Deterministic, locale-independent.
 */
export function fmt(n: number): string {
  if (!Number.isFinite(n)) return "-";
  const a = Math.abs(n);
  let s: string;
  if (a === 0) s = "0";
  else if (a >= 100) s = String(Math.round(a));
  else if (a >= 10) s = a.toFixed(1);
  else if (a >= 1) s = a.toFixed(2);
  else s = a.toPrecision(3);
  if (s.includes(".") && !s.includes("e")) s = s.replace(/\.?0+$/, "");
  if (a >= 10_000) s = s.replace(/\B(?=(\d{3})+(?!\d))/g, " ");
  return n < 0 ? `-${s}` : s;
}

/** A bench's entry in the runner's report: its result, or why it has none. */
export interface BenchOutcome {
  bench: string;
  result?: BenchResult;
  /** Set when the bench process failed (crash, non-zero exit, no result written). */
  failed?: string;
}

/** One row of the summary table, already formatted. */
export interface TableRow {
  bench: string;
  figure: string;
  value: string;
  yardstick: string;
  ratio: string;
  target: string;
}

const HEADERS: TableRow = {
  bench: "bench",
  figure: "figure",
  value: "value",
  yardstick: "yardstick (same run)",
  ratio: "ratio",
  target: "target",
};

/** Formats outcomes into table rows: one per figure, or one "failed" row for a failed bench. */
export function tableRows(outcomes: readonly BenchOutcome[]): TableRow[] {
  const rows: TableRow[] = [];
  for (const o of outcomes) {
    const figures = o.result?.figures ?? [];
    if (o.failed !== undefined) {
      rows.push({
        bench: o.bench,
        figure: "(bench)",
        value: "FAILED",
        yardstick: "",
        ratio: "",
        target: oneLine(o.failed),
      });
    }
    for (const f of figures) {
      const failed = f.failed !== undefined;
      rows.push({
        bench: o.bench,
        figure: f.label,
        value: failed ? "FAILED" : `${fmt(f.value)} ${f.unit}`.trim(),
        yardstick: f.yardstick
          ? `${f.yardstick.label}: ${fmt(f.yardstick.value)} ${f.yardstick.unit}`.trim()
          : "",
        ratio:
          f.ratio !== undefined && !failed
            ? `${fmt(f.ratio)}x${f.ratioLabel ? ` (${f.ratioLabel})` : ""}`
            : "",
        target: failed
          ? `failed: ${oneLine(f.failed as string)}`
          : f.target
            ? `${f.target.met ? "met" : "MISSED"}: ${f.target.text}`
            : "",
      });
    }
  }
  return rows;
}

function oneLine(s: string): string {
  return s.replace(/\s+/g, " ").trim();
}

const COLUMNS = Object.keys(HEADERS) as (keyof TableRow)[];

/** A fixed-width text table for the terminal. */
export function renderText(rows: readonly TableRow[]): string {
  const widths = COLUMNS.map((c) => Math.max(HEADERS[c].length, ...rows.map((r) => r[c].length)));
  const line = (r: TableRow) =>
    COLUMNS.map((c, i) => r[c].padEnd(widths[i] as number))
      .join("  ")
      .trimEnd();
  const rule = widths.map((w) => "-".repeat(w)).join("  ");
  return [line(HEADERS), rule, ...rows.map(line)].join("\n");
}

/**
 * A GitHub-flavoured markdown table, pipes in cells escaped, columns padded to equal width (the
 * layout the repository's markdown formatter keeps, so a regenerated document stays formatted).
 */
export function renderMarkdown(rows: readonly TableRow[]): string {
  const esc = (s: string) => s.replaceAll("|", "\\|");
  const cells = [HEADERS, ...rows].map((r) => COLUMNS.map((c) => esc(r[c])));
  const widths = COLUMNS.map((_, i) => Math.max(3, ...cells.map((r) => (r[i] as string).length)));
  const line = (r: string[]) => `| ${r.map((x, i) => x.padEnd(widths[i] as number)).join(" | ")} |`;
  const [head, ...body] = cells;
  return [line(head as string[]), line(widths.map((w) => "-".repeat(w))), ...body.map(line)].join("\n");
}

/**
 * Replaces the text between `start` and `end` marker lines in `doc` with `body` (markers kept).
 * Throws when either marker is missing or they are out of order, so a mangled document is never
 * silently rewritten.
 */
export function replaceBetweenMarkers(doc: string, start: string, end: string, body: string): string {
  const i = doc.indexOf(start);
  const j = doc.indexOf(end);
  if (i < 0 || j < 0 || j < i) throw new Error(`markers ${start} ... ${end} not found in order`);
  return `${doc.slice(0, i + start.length)}\n${body}\n${doc.slice(j)}`;
}

// --- SVG ---------------------------------------------------------------------------------------

const FONT = 'font-family="sans-serif" font-size="12"';
const TITLE_FONT = 'font-family="sans-serif" font-size="15" font-weight="bold"';

function escXml(s: string): string {
  return s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");
}

/** Fixed two decimals, so output bytes never depend on float printing quirks. */
function n2(x: number): string {
  return (Math.round(x * 100) / 100).toFixed(2).replace(/\.?0+$/, "");
}

/** One bar of a bar chart. */
export interface Bar {
  label: string;
  value: number;
  /** Extra text printed after the value, e.g. "16 in flight". */
  note?: string;
  /** Drawn in the accent colour; default: only the first bar. */
  highlight?: boolean;
}

export interface BarChartOptions {
  title: string;
  unit: string;
  bars: readonly Bar[];
  /** Logarithmic value axis (decades); values must be > 0. Default false. */
  log?: boolean;
  width?: number;
}

/** Axis ticks: decades for a log axis, 1/2/5 steps for a linear one, ending at or past `max`. */
function ticks(max: number, log: boolean, min = 1): number[] {
  if (log) {
    const out: number[] = [];
    for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e++) out.push(10 ** e);
    return out;
  }
  if (max <= 0) return [0, 1];
  const raw = max / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) as number;
  const out: number[] = [];
  for (let t = 0; t < max + step; t += step) out.push(t);
  return out;
}

/**
 * A horizontal bar chart as an SVG document: title, one labelled bar per entry with its value
 * printed, a value axis with ticks and the unit. The same input always yields the same bytes.
 * Throws RangeError for a log chart with a value <= 0 or a non-finite value.
 */
export function svgBarChart(o: BarChartOptions): string {
  const width = o.width ?? 720;
  const log = o.log === true;
  for (const b of o.bars) {
    if (!Number.isFinite(b.value) || (log && b.value <= 0))
      throw new RangeError(`bar ${b.label}: value ${b.value} cannot be drawn`);
  }
  const labelW = 230;
  const valueW = 150;
  const top = 40;
  const barH = 22;
  const gap = 10;
  const plotW = width - labelW - valueW - 20;
  const max = Math.max(...o.bars.map((b) => b.value), log ? 10 : 1);
  const min = log ? Math.min(...o.bars.map((b) => b.value), 1) : 0;
  const tk = ticks(max, log, min);
  const lo = log ? Math.log10(tk[0] as number) : 0;
  const hi = log ? Math.log10(tk[tk.length - 1] as number) : (tk[tk.length - 1] as number);
  const x = (v: number) => labelW + (((log ? Math.log10(v) : v) - lo) / (hi - lo || 1)) * plotW;
  const plotH = o.bars.length * (barH + gap);
  const height = top + plotH + 50;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">`,
    `<title>${escXml(o.title)}</title>`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" ${TITLE_FONT}>${escXml(o.title)}</text>`,
  ];
  for (const t of tk) {
    const tx = n2(x(t));
    out.push(
      `<line x1="${tx}" y1="${top - 4}" x2="${tx}" y2="${top + plotH}" stroke="#dddddd"/>`,
      `<text x="${tx}" y="${top + plotH + 16}" text-anchor="middle" ${FONT}>${escXml(fmt(t))}</text>`,
    );
  }
  out.push(
    `<line x1="${labelW}" y1="${top + plotH}" x2="${labelW + plotW}" y2="${top + plotH}" stroke="#333333"/>`,
    `<line x1="${labelW}" y1="${top - 4}" x2="${labelW}" y2="${top + plotH}" stroke="#333333"/>`,
    `<text x="${labelW + plotW / 2}" y="${top + plotH + 36}" text-anchor="middle" ${FONT}>${escXml(
      `${o.unit}${log ? " (log scale)" : ""}`,
    )}</text>`,
  );
  o.bars.forEach((b, i) => {
    const y = top + i * (barH + gap);
    const w = Math.max(1, x(b.value) - labelW);
    out.push(
      `<text x="${labelW - 8}" y="${n2(y + barH / 2 + 4)}" text-anchor="end" ${FONT}>${escXml(b.label)}</text>`,
      `<rect x="${labelW}" y="${y}" width="${n2(w)}" height="${barH}" fill="${(b.highlight ?? i === 0) ? "#2b6cb0" : "#90a4ae"}"/>`,
      `<text x="${n2(labelW + w + 6)}" y="${n2(y + barH / 2 + 4)}" ${FONT}>${escXml(
        `${fmt(b.value)}${b.note ? ` (${b.note})` : ""}`,
      )}</text>`,
    );
  });
  out.push("</svg>");
  return `${out.join("\n")}\n`;
}

export interface HistogramOptions {
  title: string;
  unit: string;
  values: readonly number[];
  /** Number of equal-width bins; default 20. */
  bins?: number;
  width?: number;
  height?: number;
}

/**
 * A histogram of `values` as an SVG document: equal-width bins between the minimum and the
 * maximum, count axis on the left, value axis with the unit below, p50 and p99 marked. The same
 * input always yields the same bytes. Throws RangeError for an empty list or non-finite values.
 */
export function svgHistogram(o: HistogramOptions): string {
  if (o.values.length === 0) throw new RangeError("histogram of an empty list");
  if (o.values.some((v) => !Number.isFinite(v))) throw new RangeError("histogram of non-finite values");
  const width = o.width ?? 720;
  const height = o.height ?? 320;
  const nb = Math.max(1, Math.floor(o.bins ?? 20));
  const lo = Math.min(...o.values);
  const hi = Math.max(...o.values);
  const span = hi - lo || 1;
  const counts = new Array<number>(nb).fill(0);
  for (const v of o.values) {
    const b = Math.min(nb - 1, Math.floor(((v - lo) / span) * nb));
    counts[b] = (counts[b] as number) + 1;
  }
  const left = 60;
  const right = 20;
  const top = 40;
  const bottom = 50;
  const pw = width - left - right;
  const ph = height - top - bottom;
  const cmax = Math.max(...counts);
  const ctk = ticks(cmax, false);
  const cTop = ctk[ctk.length - 1] as number;
  const xv = (v: number) => left + ((v - lo) / span) * pw;
  const yc = (c: number) => top + ph - (c / cTop) * ph;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">`,
    `<title>${escXml(o.title)}</title>`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" ${TITLE_FONT}>${escXml(o.title)}</text>`,
  ];
  for (const t of ctk) {
    out.push(
      `<line x1="${left}" y1="${n2(yc(t))}" x2="${left + pw}" y2="${n2(yc(t))}" stroke="#dddddd"/>`,
      `<text x="${left - 6}" y="${n2(yc(t) + 4)}" text-anchor="end" ${FONT}>${fmt(t)}</text>`,
    );
  }
  const bw = pw / nb;
  counts.forEach((c, i) => {
    if (c === 0) return;
    out.push(
      `<rect x="${n2(left + i * bw)}" y="${n2(yc(c))}" width="${n2(Math.max(1, bw - 1))}" height="${n2(top + ph - yc(c))}" fill="#2b6cb0"/>`,
    );
  });
  for (let i = 0; i <= 4; i++) {
    const v = lo + (span * i) / 4;
    out.push(`<text x="${n2(xv(v))}" y="${top + ph + 16}" text-anchor="middle" ${FONT}>${fmt(v)}</text>`);
  }
  for (const [name, p] of [
    ["p50", 50],
    ["p99", 99],
  ] as const) {
    const v = percentile(o.values, p);
    out.push(
      `<line x1="${n2(xv(v))}" y1="${top}" x2="${n2(xv(v))}" y2="${top + ph}" stroke="#c53030" stroke-dasharray="4 3"/>`,
      `<text x="${n2(xv(v) + 4)}" y="${top + 12}" ${FONT} fill="#c53030">${name} ${fmt(v)}</text>`,
    );
  }
  out.push(
    `<line x1="${left}" y1="${top + ph}" x2="${left + pw}" y2="${top + ph}" stroke="#333333"/>`,
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${top + ph}" stroke="#333333"/>`,
    `<text x="${left + pw / 2}" y="${height - 12}" text-anchor="middle" ${FONT}>${escXml(o.unit)}</text>`,
    `<text x="14" y="${top + ph / 2}" text-anchor="middle" ${FONT} transform="rotate(-90 14 ${top + ph / 2})">count</text>`,
    "</svg>",
  );
  return `${out.join("\n")}\n`;
}

// --- growth -------------------------------------------------------------------------------------

/** One measurement of a quantity at one size of the work (e.g. 2000 exports took 4.1 s). */
export interface GrowthPoint {
  size: number;
  value: number;
}

/**
 * The exponent k of value ~ size^k: the least-squares slope of log(value) over log(size). 1 is
 * linear, 2 quadratic, about 0 constant. Throws RangeError with fewer than two distinct sizes or
 * a size or value that is not a positive finite number.
 */
export function growthExponent(points: readonly GrowthPoint[]): number {
  for (const p of points) {
    if (!(p.size > 0 && Number.isFinite(p.size) && p.value > 0 && Number.isFinite(p.value)))
      throw new RangeError(`growth point ${p.size}: ${p.value} cannot be fitted on a log-log scale`);
  }
  if (new Set(points.map((p) => p.size)).size < 2)
    throw new RangeError("a growth fit needs at least two distinct sizes");
  const xs = points.map((p) => Math.log(p.size));
  const ys = points.map((p) => Math.log(p.value));
  const mx = xs.reduce((a, b) => a + b, 0) / xs.length;
  const my = ys.reduce((a, b) => a + b, 0) / ys.length;
  let num = 0;
  let den = 0;
  xs.forEach((x, i) => {
    num += (x - mx) * ((ys[i] as number) - my);
    den += (x - mx) ** 2;
  });
  return num / den;
}

/**
 * One line for people on how `what` grows: the values per size, the ratios between consecutive
 * sizes, and the fitted exponent, e.g. "restart re-verify: 500 -> 1.2 s, 1000 -> 2.3 s (x1.92),
 * ...; exponent 0.97". Sizes are taken in the order given. Same errors as growthExponent.
 */
export function growthLine(what: string, unit: string, points: readonly GrowthPoint[]): string {
  const k = growthExponent(points);
  const parts = points.map((p, i) => {
    const prev = points[i - 1];
    return `${fmt(p.size)} -> ${fmt(p.value)} ${unit}${prev ? ` (x${fmt(p.value / prev.value)} for x${fmt(p.size / prev.size)} the work)` : ""}`;
  });
  return `${what}: ${parts.join(", ")}; log-log exponent ${fmt(k)} (1 = linear)`;
}

/**
 * Several SVG documents (e.g. from svgBarChart, all `width` wide) stacked vertically into one,
 * under `title`. Every part keeps its own <title>. Deterministic; throws RangeError for no parts.
 */
export function svgStack(title: string, parts: readonly string[], width = 720): string {
  if (parts.length === 0) throw new RangeError("nothing to stack");
  let y = 0;
  const placed = parts.map((doc) => {
    const h = Number(/height="(\d+(?:\.\d+)?)"/.exec(doc)?.[1] ?? 0);
    const out = doc.trimEnd().replace("<svg ", `<svg y="${y}" `);
    y += h;
    return out;
  });
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}">`,
    `<title>${escXml(title)}</title>`,
    ...placed,
    "</svg>",
    "",
  ].join("\n");
}
