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
