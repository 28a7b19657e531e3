// The kube-apiserver's own Prometheus metrics, read through the admin token and parsed into
// samples, so a bench can count what every client did (requests, open watches, watch events).

/** One sample line: metric name, its labels and its value. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses the text exposition format; comments and malformed lines are skipped. */
export function parseSamples(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries(
      [...(m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1] as string, x[2] as string]),
    );
    out.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return out;
}

/** Every sample the API server exposes now. Throws when /metrics does not answer 200. */
export async function apiServerSamples(server: string, token: string, caPem: string): Promise<Sample[]> {
  const res = await fetch(`${server}/metrics`, {
    headers: { authorization: `Bearer ${token}` },
    tls: { ca: caPem },
  });
  if (!res.ok) throw new Error(`GET /metrics: HTTP ${res.status}`);
  return parseSamples(await res.text());
}

/**
 * Sums the samples named `name` whose labels include every pair of `where`, grouped by the value
 * of label `by` (all under "" when `by` is omitted).
 */
export function sumBy(
  samples: readonly Sample[],
  name: string,
  where: Record<string, string>,
  by?: string,
): Map<string, number> {
  const out = new Map<string, number>();
  for (const s of samples) {
    if (s.name !== name) continue;
    if (!Object.entries(where).every(([k, v]) => s.labels[k] === v)) continue;
    const k = by ? (s.labels[by] ?? "") : "";
    out.set(k, (out.get(k) ?? 0) + s.value);
  }
  return out;
}

/** The total of a sumBy map. */
export function total(m: ReadonlyMap<string, number>): number {
  let t = 0;
  for (const v of m.values()) t += v;
  return t;
}
