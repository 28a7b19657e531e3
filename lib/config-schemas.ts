// Valibot schemas for configuration values that arrive as strings (environment variables,
// command-line flags), shared by every binary's config module.
import * as v from "valibot";

/**
 * A string of decimal digits read as an integer in [min, max] (max defaults to the largest safe
 * integer). No sign, no spaces, no exponent. Messages read "must be a whole number", "must be >=
 * min", "must be <= max", prefixed with `what` (the flag or variable name) when given.
 */
export function wholeNumber(min: number, max = Number.MAX_SAFE_INTEGER, what?: string) {
  const p = what === undefined ? "" : `${what} `;
  return v.pipe(
    v.string(),
    v.regex(/^\d+$/, `${p}must be a whole number`),
    v.transform(Number),
    v.minValue(min, `${p}must be >= ${min}`),
    v.maxValue(max, `${p}must be <= ${max}`),
  );
}

// Go's time.ParseDuration units, in milliseconds ("µs" and "μs" are both micro).
const GO_UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3,
  μs: 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};
const GO_DURATION = /^(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$/;
const GO_PART = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/g;

/**
 * A Go duration string as the upstream Kubernetes sidecars' flags take it ("3s", "1m30s",
 * "1.5s", "250ms"; "0" alone is zero), read as whole milliseconds (rounded up, so a nonzero
 * duration never becomes 0) in [minMs, maxMs]. No sign: a negative timeout is always a mistake.
 * Messages name `what` (the flag) when given.
 */
export function goDuration(minMs: number, maxMs = Number.MAX_SAFE_INTEGER, what?: string) {
  const p = what === undefined ? "" : `${what} `;
  return v.pipe(
    v.string(),
    v.check((s) => s === "0" || GO_DURATION.test(s), `${p}must be a duration such as 500ms, 3s or 1m30s`),
    v.transform((s) => {
      let ms = 0;
      for (const m of s.matchAll(GO_PART)) ms += Number(m[1]) * (GO_UNIT_MS[m[2] as string] as number);
      return Math.ceil(ms);
    }),
    v.minValue(minMs, `${p}must be at least ${minMs} ms`),
    v.maxValue(maxMs, `${p}must be at most ${maxMs} ms`),
  );
}
