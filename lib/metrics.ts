// A small Prometheus registry with no dependency: counters, gauges and histograms with labels,
// rendered in the text exposition format 0.0.4. One Registry per process, passed to constructors.

import { StorageError } from "./errors.ts";

/** Label values of one series, keyed by label name. */
export type Labels<L extends string = string> = Readonly<Record<L, string>>;

interface BaseOptions<L extends string> {
  /** Metric name: [a-zA-Z_:][a-zA-Z0-9_:]*. */
  name: string;
  help: string;
  /** Label names: [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", no duplicates. */
  labelNames?: readonly L[];
  /**
   * When a metric of this name already exists with the same type, help, label names (and
   * buckets), return it instead of failing. For components that may be instantiated more than
   * once per registry (one runner per controller); any difference still throws.
   */
  reuse?: boolean;
}
export type CounterOptions<L extends string> = BaseOptions<L>;
export type GaugeOptions<L extends string> = BaseOptions<L>;
export interface HistogramOptions<L extends string> extends BaseOptions<L> {
  /** Upper bounds, finite and strictly increasing; +Inf is implied. Defaults to DEFAULT_BUCKETS. */
  buckets?: readonly number[];
}

/** client_golang's default buckets, in seconds. */
export const DEFAULT_BUCKETS: readonly number[] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/**
 * A monotonically increasing value per label set. `inc` throws StorageError("invalid") on
 * missing or extra labels, and on a negative or non-finite increment.
 */
export interface Counter<L extends string = string> {
  inc(labels?: Labels<L>, n?: number): void;
  /** Current value of one series (0 if never touched); for tests and internal reads. */
  get(labels?: Labels<L>): number;
}

/** A value that goes up and down. Same label rules as Counter; values must not be NaN. */
export interface Gauge<L extends string = string> {
  set(labels: Labels<L>, value: number): void;
  inc(labels?: Labels<L>, n?: number): void;
  dec(labels?: Labels<L>, n?: number): void;
  get(labels?: Labels<L>): number;
}

export interface HistogramSnapshot {
  /** Cumulative counts per configured bucket (same order as the buckets, +Inf excluded). */
  buckets: number[];
  sum: number;
  count: number;
}

/** Observations sorted into cumulative buckets, plus their sum and count. */
export interface Histogram<L extends string = string> {
  /** Throws StorageError("invalid") on missing or extra labels or a NaN value. */
  observe(labels: Labels<L>, value: number): void;
  get(labels?: Labels<L>): HistogramSnapshot;
}

/**
 * A family whose whole series set is replaced at once: the mirror of counters or gauges kept by
 * another process (SPDK's bdev statistics, a reactor's ticks), read in one round. Series absent
 * from the latest `replace` disappear, so a deleted volume leaves no stale series behind.
 */
export interface SnapshotFamily<L extends string = string> {
  /**
   * Replaces every series by `rows`. Throws StorageError("invalid") on wrong labels, a NaN value,
   * a negative counter value, or two rows with the same labels; the family is unchanged then.
   */
  replace(rows: Iterable<readonly [Labels<L>, number]>): void;
  get(labels?: Labels<L>): number;
}

export interface SnapshotOptions<L extends string> extends BaseOptions<L> {
  /** The TYPE line: "counter" for a source's monotonic totals, "gauge" for current values. */
  kind: "counter" | "gauge";
}

/** One registered family, as `Registry.families` lists it. */
export interface FamilyInfo {
  name: string;
  kind: "counter" | "gauge" | "histogram";
  help: string;
  labelNames: readonly string[];
  /** The series names a scrape shows: the name itself, or its _bucket, _sum and _count. */
  seriesNames: readonly string[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

type Kind = "counter" | "gauge" | "histogram";

interface Family {
  kind: Kind;
  name: string;
  help: string;
  labelNames: readonly string[];
  buckets: readonly number[];
  /** Filled by SnapshotFamily.replace rather than by inc/set/observe. */
  snapshot: boolean;
  /** Series keyed by the JSON of their label values: unambiguous whatever the values contain. */
  series: Map<string, { values: readonly string[]; data: number[] }>;
  api: unknown;
}

function invalid(message: string): StorageError {
  return new StorageError("invalid", message);
}

/** Number formatting as Prometheus parses it (Go's ParseFloat): Inf and NaN spelled its way. */
function formatValue(n: number): string {
  if (Number.isNaN(n)) return "NaN";
  if (n === Number.POSITIVE_INFINITY) return "+Inf";
  if (n === Number.NEGATIVE_INFINITY) return "-Inf";
  return String(n);
}

function escapeHelp(s: string): string {
  return s.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

function escapeLabelValue(s: string): string {
  return s.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function labelText(names: readonly string[], values: readonly string[], extra?: [string, string]): string {
  const parts = names.map((n, i) => `${n}="${escapeLabelValue(values[i] ?? "")}"`);
  if (extra) parts.push(`${extra[0]}="${escapeLabelValue(extra[1])}"`);
  return parts.length === 0 ? "" : `{${parts.join(",")}}`;
}

/**
 * Holds metric families and renders them. Registration validates names eagerly so a typo fails at
 * startup, not at the first scrape. Not shared across processes; cheap enough to create per test.
 */
export class Registry {
  #families = new Map<string, Family>();

  /** Registers a counter. Throws StorageError("invalid") on a bad or duplicate name (see `reuse`). */
  counter<L extends string = never>(opts: CounterOptions<L>): Counter<L> {
    const fam = this.#register("counter", opts, []);
    if (fam.api) return fam.api as Counter<L>;
    const api: Counter<L> = {
      inc: (labels, n = 1) => {
        if (!Number.isFinite(n) || n < 0) {
          throw invalid(`counter ${fam.name}: increment must be finite and >= 0, got ${n}`);
        }
        const s = this.#series(fam, labels);
        s.data[0] = (s.data[0] ?? 0) + n;
      },
      get: (labels) => this.#peek(fam, labels)?.[0] ?? 0,
    };
    fam.api = api;
    return api;
  }

  /** Registers a gauge. Throws StorageError("invalid") on a bad or duplicate name (see `reuse`). */
  gauge<L extends string = never>(opts: GaugeOptions<L>): Gauge<L> {
    const fam = this.#register("gauge", opts, []);
    if (fam.api) return fam.api as Gauge<L>;
    const add = (labels: Labels<L> | undefined, n: number) => {
      if (Number.isNaN(n)) throw invalid(`gauge ${fam.name}: value must not be NaN`);
      const s = this.#series(fam, labels);
      s.data[0] = (s.data[0] ?? 0) + n;
    };
    const api: Gauge<L> = {
      set: (labels, value) => {
        if (Number.isNaN(value)) throw invalid(`gauge ${fam.name}: value must not be NaN`);
        this.#series(fam, labels).data[0] = value;
      },
      inc: (labels, n = 1) => add(labels, n),
      dec: (labels, n = 1) => add(labels, -n),
      get: (labels) => this.#peek(fam, labels)?.[0] ?? 0,
    };
    fam.api = api;
    return api;
  }

  /** Registers a histogram. Throws StorageError("invalid") on bad names, buckets, or a duplicate. */
  histogram<L extends string = never>(opts: HistogramOptions<L>): Histogram<L> {
    const buckets = opts.buckets ?? DEFAULT_BUCKETS;
    if (buckets.length === 0) throw invalid(`histogram ${opts.name}: needs at least one bucket`);
    for (let i = 0; i < buckets.length; i++) {
      const b = buckets[i] as number;
      if (!Number.isFinite(b)) throw invalid(`histogram ${opts.name}: bucket ${b} must be finite`);
      if (i > 0 && b <= (buckets[i - 1] as number)) {
        throw invalid(`histogram ${opts.name}: buckets must be strictly increasing`);
      }
    }
    if (opts.labelNames?.includes("le" as L)) {
      throw invalid(`histogram ${opts.name}: label name "le" is reserved`);
    }
    const fam = this.#register("histogram", opts, buckets);
    if (fam.api) return fam.api as Histogram<L>;
    const n = buckets.length;
    const api: Histogram<L> = {
      observe: (labels, value) => {
        if (Number.isNaN(value)) throw invalid(`histogram ${fam.name}: value must not be NaN`);
        const s = this.#series(fam, labels);
        // data layout: [count per bucket (non-cumulative)..., sum, count]
        for (let i = 0; i < n; i++) {
          if (value <= (buckets[i] as number)) {
            s.data[i] = (s.data[i] ?? 0) + 1;
            break;
          }
        }
        s.data[n] = (s.data[n] ?? 0) + value;
        s.data[n + 1] = (s.data[n + 1] ?? 0) + 1;
      },
      get: (labels) => {
        const data = this.#peek(fam, labels) ?? [];
        let acc = 0;
        const cumulative = buckets.map((_, i) => (acc += data[i] ?? 0));
        return { buckets: cumulative, sum: data[n] ?? 0, count: data[n + 1] ?? 0 };
      },
    };
    fam.api = api;
    return api;
  }

  /**
   * Registers a family filled by `replace` (see SnapshotFamily). Throws StorageError("invalid") on
   * a bad or duplicate name (see `reuse`).
   */
  snapshot<L extends string = never>(opts: SnapshotOptions<L>): SnapshotFamily<L> {
    const fam = this.#register(opts.kind, opts, [], true);
    if (fam.api) return fam.api as SnapshotFamily<L>;
    const api: SnapshotFamily<L> = {
      replace: (rows) => {
        const next = new Map<string, { values: readonly string[]; data: number[] }>();
        for (const [labels, value] of rows) {
          if (Number.isNaN(value)) throw invalid(`metric ${fam.name}: value must not be NaN`);
          if (fam.kind === "counter" && value < 0) {
            throw invalid(`counter ${fam.name}: value must be >= 0, got ${value}`);
          }
          const { key, values } = this.#key(fam, labels);
          if (next.has(key)) throw invalid(`metric ${fam.name}: two rows with labels ${key}`);
          next.set(key, { values, data: [value] });
        }
        fam.series = next;
      },
      get: (labels) => this.#peek(fam, labels)?.[0] ?? 0,
    };
    fam.api = api;
    return api;
  }

  /** Every registered family, sorted by name (what a scrape of this registry can show). */
  families(): FamilyInfo[] {
    return [...this.#families.values()]
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
      .map((f) => ({
        name: f.name,
        kind: f.kind,
        help: f.help,
        labelNames: f.labelNames,
        seriesNames:
          f.kind === "histogram" ? [`${f.name}_bucket`, `${f.name}_sum`, `${f.name}_count`] : [f.name],
      }));
  }

  /**
   * The whole registry in text exposition format 0.0.4: families sorted by name, series sorted by
   * label values, so two renders of equal state are byte-identical. Ends with a newline.
   */
  render(): string {
    const out: string[] = [];
    const names = [...this.#families.keys()].sort();
    for (const name of names) {
      const fam = this.#families.get(name) as Family;
      out.push(`# HELP ${name} ${escapeHelp(fam.help)}`, `# TYPE ${name} ${fam.kind}`);
      const keys = [...fam.series.keys()].sort();
      for (const key of keys) {
        const { values, data } = fam.series.get(key) as { values: readonly string[]; data: number[] };
        if (fam.kind !== "histogram") {
          out.push(`${name}${labelText(fam.labelNames, values)} ${formatValue(data[0] ?? 0)}`);
          continue;
        }
        const n = fam.buckets.length;
        let acc = 0;
        for (let i = 0; i < n; i++) {
          acc += data[i] ?? 0;
          const le = formatValue(fam.buckets[i] as number);
          out.push(`${name}_bucket${labelText(fam.labelNames, values, ["le", le])} ${acc}`);
        }
        const count = data[n + 1] ?? 0;
        out.push(`${name}_bucket${labelText(fam.labelNames, values, ["le", "+Inf"])} ${count}`);
        out.push(`${name}_sum${labelText(fam.labelNames, values)} ${formatValue(data[n] ?? 0)}`);
        out.push(`${name}_count${labelText(fam.labelNames, values)} ${count}`);
      }
    }
    return out.length === 0 ? "" : `${out.join("\n")}\n`;
  }

  #register<L extends string>(
    kind: Kind,
    opts: BaseOptions<L>,
    buckets: readonly number[],
    snapshot = false,
  ): Family {
    const { name, help } = opts;
    const labelNames: readonly string[] = opts.labelNames ?? [];
    if (!METRIC_NAME.test(name)) throw invalid(`invalid metric name ${JSON.stringify(name)}`);
    const seen = new Set<string>();
    for (const l of labelNames) {
      if (!LABEL_NAME.test(l) || l.startsWith("__")) {
        throw invalid(`metric ${name}: invalid label name ${JSON.stringify(l)}`);
      }
      if (seen.has(l)) throw invalid(`metric ${name}: duplicate label name ${JSON.stringify(l)}`);
      seen.add(l);
    }
    const existing = this.#families.get(name);
    if (existing) {
      const same =
        existing.kind === kind &&
        existing.snapshot === snapshot &&
        existing.help === help &&
        existing.labelNames.join(",") === labelNames.join(",") &&
        existing.buckets.join(",") === buckets.join(",");
      if (opts.reuse && same) return existing;
      throw invalid(
        same
          ? `metric ${name} is already registered (pass reuse: true to share it)`
          : `metric ${name} is already registered with a different type, help, labels or buckets`,
      );
    }
    // Without labels there is exactly one series; expose it at 0 from the start, as client_golang
    // does, so rate() has a baseline before the first event.
    const fam: Family = {
      kind,
      name,
      help,
      labelNames,
      buckets,
      snapshot,
      series: new Map(),
      api: undefined,
    };
    if (labelNames.length === 0 && !snapshot) fam.series.set("[]", { values: [], data: [] });
    this.#families.set(name, fam);
    return fam;
  }

  /** Validates labels against the family; returns the series key and values in label-name order. */
  #key(fam: Family, labels: Labels | undefined): { key: string; values: string[] } {
    const given = labels ?? {};
    const givenNames = Object.keys(given);
    const missing = fam.labelNames.filter((l) => !Object.hasOwn(given, l));
    const extra = givenNames.filter((l) => !fam.labelNames.includes(l));
    if (missing.length > 0 || extra.length > 0) {
      const detail = [
        missing.length > 0 ? `missing ${missing.join(", ")}` : "",
        extra.length > 0 ? `unexpected ${extra.join(", ")}` : "",
      ].filter(Boolean);
      throw invalid(`metric ${fam.name}: wrong labels (${detail.join("; ")})`);
    }
    const values = fam.labelNames.map((l) => {
      const v = (given as Record<string, unknown>)[l];
      if (typeof v !== "string") throw invalid(`metric ${fam.name}: label ${l} must be a string`);
      return v;
    });
    return { key: JSON.stringify(values), values };
  }

  #series(fam: Family, labels: Labels | undefined): { values: readonly string[]; data: number[] } {
    const { key, values } = this.#key(fam, labels);
    let s = fam.series.get(key);
    if (!s) {
      s = { values, data: [] };
      fam.series.set(key, s);
    }
    return s;
  }

  #peek(fam: Family, labels: Labels | undefined): number[] | undefined {
    return fam.series.get(this.#key(fam, labels).key)?.data;
  }
}
