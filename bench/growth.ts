// Growth runs for the scale benches: a bench file run as its own process once per size of the work
// (each with its own control plane), its results merged into one, with how every time and memory
// figure grows across the sizes (log-log exponent, ratios) and a chart of them.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type BenchResult,
  type Figure,
  type GrowthPoint,
  growthExponent,
  growthLine,
  RESULT_FILE_ENV,
  svgBarChart,
  svgStack,
  writeResult,
} from "./report.ts";

/** Units whose growth is worth a fit: times and memory. */
const GROWING_UNITS = new Set(["s", "ms", "MiB", "B"]);

/** Runs `file` with `argsFor(size)` and returns the result it wrote; throws when it wrote none. */
async function runOnce(file: string, args: readonly string[]): Promise<BenchResult> {
  const dir = mkdtempSync(join(tmpdir(), "distort-growth-"));
  const out = join(dir, "result.json");
  try {
    const p = Bun.spawn([process.execPath, file, ...args], {
      env: { ...process.env, [RESULT_FILE_ENV]: out },
      stdout: "inherit",
      stderr: "inherit",
    });
    const code = await p.exited;
    if (code !== 0) throw new Error(`${file} ${args.join(" ")} exited with ${code}`);
    return JSON.parse(readFileSync(out, "utf8")) as BenchResult;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Runs bench `file` at each of `sizes` (ascending, at least two) and writes one merged result
 * under `bench`: every figure of every size (ids suffixed "@size", labels naming the size, targets only at
 * targetSize), one
 * "growth of ..." figure per time or memory figure that every size measured as a positive number,
 * notes with values and ratios per size, and a stacked bar chart of those figures at `svgPath`.
 * A size whose run fails fails the whole run (throws): growth from a partial series would mislead.
 */
export async function runGrowth(o: {
  bench: string;
  file: string;
  sizes: readonly number[];
  /** The bench's own arguments for one size. */
  argsFor: (size: number) => string[];
  /** What a size counts, e.g. "partitions". */
  noun: string;
  svgPath: string;
  chartTitle: string;
  /** The size the bench's targets are stated for; the others' figures carry none. Default: the largest. */
  targetSize?: number;
}): Promise<void> {
  if (o.sizes.length < 2) throw new RangeError("a growth run needs at least two sizes");
  const targetSize = o.targetSize ?? Math.max(...o.sizes);
  const results: { size: number; result: BenchResult }[] = [];
  for (const size of o.sizes) {
    process.stdout.write(`\n=== ${o.bench} at ${size} ${o.noun} ===\n`);
    results.push({ size, result: await runOnce(o.file, o.argsFor(size)) });
  }
  const figures: Figure[] = [];
  const notes: string[] = [];
  const profile: string[] = [];
  for (const { size, result } of results) {
    for (const f of result.figures) {
      const { target, ...rest } = f;
      figures.push({
        ...rest,
        ...(target && size === targetSize ? { target } : {}),
        id: `${f.id}@${size}`,
        label: `[${size} ${o.noun}] ${f.label}`,
      });
    }
    notes.push(...(result.notes ?? []).map((n) => `[${size}] ${n}`));
    profile.push(...(result.profile ?? []).map((p) => `[${size}] ${p}`));
  }
  const first = results[0]?.result.figures ?? [];
  const charts: string[] = [];
  for (const f of first) {
    if (!GROWING_UNITS.has(f.unit)) continue;
    const pts: GrowthPoint[] = results.map(({ size, result }) => ({
      size,
      value: result.figures.find((g) => g.id === f.id && g.failed === undefined)?.value ?? Number.NaN,
    }));
    if (pts.some((p) => !(p.value > 0 && Number.isFinite(p.value)))) continue;
    figures.push({
      id: `growth-${f.id}`,
      label: `growth of "${f.label.replaceAll(new RegExp(`\\b${o.sizes[0]}\\b`, "g"), "N")}" over ${o.sizes.join(", ")} ${o.noun}: log-log exponent`,
      value: growthExponent(pts),
      unit: "",
      better: "lower",
    });
    notes.push(`growth, ${growthLine(f.id, f.unit, pts)}`);
    charts.push(
      svgBarChart({
        title: `${f.id} (${f.unit})`,
        unit: f.unit,
        bars: pts.map((p) => ({ label: `${p.size} ${o.noun}`, value: p.value })),
      }),
    );
  }
  if (charts.length > 0) {
    await Bun.write(o.svgPath, svgStack(o.chartTitle, charts));
    notes.push(`Chart of the growth: docs/${o.svgPath.split("/").pop()}.`);
  }
  writeResult({ bench: o.bench, figures, notes, profile });
}

/**
 * The sizes a bench was asked for: `--sizes a,b,c` anywhere in `argv` (positive integers, at
 * least two), else undefined. Throws Error for a malformed list.
 */
export function sizesArg(argv: readonly string[]): number[] | undefined {
  const at = argv.indexOf("--sizes");
  if (at < 0) return undefined;
  const sizes = (argv[at + 1] ?? "").split(",").map(Number);
  if (sizes.length < 2 || sizes.some((s) => !(Number.isInteger(s) && s > 0)))
    throw new Error(`--sizes takes two or more positive integers, comma separated, got ${argv[at + 1]}`);
  return sizes;
}
