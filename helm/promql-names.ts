// The metric names a PromQL expression selects, for the metric-coverage test: a tokenizer that
// skips strings, label matchers, range and subquery brackets, grouping label lists and function
// names, and keeps every other identifier (a bare selector, or the name before "{").

const KEYWORDS = new Set([
  "and",
  "or",
  "unless",
  "by",
  "without",
  "on",
  "ignoring",
  "group_left",
  "group_right",
  "offset",
  "bool",
  "atan2",
  "inf",
  "nan",
]);
/** Aggregation operators: `sum by (x) (...)` puts the grouping between the name and its "(". */
const AGGREGATORS = new Set([
  "sum",
  "min",
  "max",
  "avg",
  "group",
  "stddev",
  "stdvar",
  "count",
  "count_values",
  "bottomk",
  "topk",
  "quantile",
  "limitk",
  "limit_ratio",
]);
/** Keywords followed by a parenthesised list of label names, not of expressions. */
const LABEL_LISTS = new Set(["by", "without", "on", "ignoring", "group_left", "group_right"]);
const IDENT = /[a-zA-Z_:][a-zA-Z0-9_:]*/y;
const NUMBER = /0[xX][0-9a-fA-F]+|(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?(?:ms|[smhdwy])?)+/y;

/**
 * Every metric name `expr` selects, in order of appearance, each once. Throws on an unterminated
 * string or bracket, so a malformed expression never passes as "names nothing".
 */
export function metricNames(expr: string): string[] {
  const out: string[] = [];
  let i = 0;
  const closing = (open: string, close: string, from: number): number => {
    let depth = 0;
    for (let j = from; j < expr.length; j++) {
      const c = expr[j];
      if (c === '"' || c === "'" || c === "`") {
        j = endOfString(expr, j);
        continue;
      }
      if (c === open) depth++;
      else if (c === close && --depth === 0) return j;
    }
    throw new Error(`unterminated ${open} at ${from} in ${JSON.stringify(expr)}`);
  };
  let lastIdent: string | undefined;
  while (i < expr.length) {
    const c = expr[i] as string;
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (c === '"' || c === "'" || c === "`") {
      i = endOfString(expr, i) + 1;
      continue;
    }
    if (c === "#") {
      const nl = expr.indexOf("\n", i);
      i = nl < 0 ? expr.length : nl + 1;
      continue;
    }
    if (c === "{") {
      i = closing("{", "}", i) + 1;
      continue;
    }
    if (c === "[") {
      i = closing("[", "]", i) + 1;
      continue;
    }
    if (c === "(" && lastIdent !== undefined && LABEL_LISTS.has(lastIdent)) {
      i = closing("(", ")", i) + 1;
      lastIdent = undefined;
      continue;
    }
    if (/[0-9.]/.test(c)) {
      // A number or a duration (1e3, 0x1f, 5m, 1h30m): never a name.
      NUMBER.lastIndex = i;
      i += NUMBER.exec(expr)?.[0].length || 1;
      lastIdent = undefined;
      continue;
    }
    IDENT.lastIndex = i;
    const id = IDENT.exec(expr)?.[0];
    if (id === undefined) {
      i++;
      lastIdent = undefined;
      continue;
    }
    i += id.length;
    let j = i;
    while (j < expr.length && /\s/.test(expr[j] as string)) j++;
    const isCall = expr[j] === "(";
    const lower = id.toLowerCase();
    if (!KEYWORDS.has(lower) && !AGGREGATORS.has(lower) && !isCall) {
      if (!out.includes(id)) out.push(id);
    }
    lastIdent = lower;
  }
  return out;
}

function endOfString(s: string, from: number): number {
  const q = s[from];
  for (let j = from + 1; j < s.length; j++) {
    if (q !== "`" && s[j] === "\\") {
      j++;
      continue;
    }
    if (s[j] === q) return j;
  }
  throw new Error(`unterminated string at ${from} in ${JSON.stringify(s)}`);
}
