// One preflight check's result and the report over all of them: what a node needs before the
// agent or the CSI node plugin can serve, with a message a person can act on.

/** pass: met; warn: works, but something will fail later or run slowly; fail: the part cannot work; skip: not needed here. */
export type CheckStatus = "pass" | "warn" | "fail" | "skip";

/** One check's outcome. `id` is stable (scripts and tests match on it); `message` is for people. */
export interface CheckResult {
  readonly id: string;
  readonly status: CheckStatus;
  readonly message: string;
  /** What a person should do about a warn or fail (a command, a setting). */
  readonly fix?: string;
  /** Measured facts behind the verdict (counts, sizes, versions), for -o json. */
  readonly details?: Readonly<Record<string, unknown>>;
}

/** Every check that ran, in a fixed order, and the worst status among them. */
export interface PreflightReport {
  readonly checks: readonly CheckResult[];
  readonly worst: CheckStatus;
}

const RANK: Record<CheckStatus, number> = { skip: 0, pass: 1, warn: 2, fail: 3 };

/** The report of `checks`; worst is "pass" for an empty list. Pure. */
export function reportOf(checks: readonly CheckResult[]): PreflightReport {
  let worst: CheckStatus = "pass";
  for (const c of checks) if (RANK[c.status] > RANK[worst]) worst = c.status;
  return { checks, worst };
}

/**
 * Exit codes a script can use: 0 nothing failed, 1 at least one check failed, 3 only warnings and
 * `strict` was asked for. (2 is the CLI's usage error; it never comes from a report.)
 */
export const PREFLIGHT_EXIT = { ok: 0, failed: 1, usage: 2, warnings: 3 } as const;

/** The exit code for `report`; warnings count only when `strict`. Pure. */
export function preflightExitCode(report: PreflightReport, strict = false): number {
  if (report.worst === "fail") return PREFLIGHT_EXIT.failed;
  if (report.worst === "warn" && strict) return PREFLIGHT_EXIT.warnings;
  return PREFLIGHT_EXIT.ok;
}

const MARK: Record<CheckStatus, string> = { pass: "PASS", warn: "WARN", fail: "FAIL", skip: "SKIP" };

/** Plain text, one line per check plus an indented fix; ends with a one-line summary. Pure. */
export function renderPreflight(report: PreflightReport): string {
  const width = Math.max(...report.checks.map((c) => c.id.length), 5);
  const lines: string[] = [];
  for (const c of report.checks) {
    lines.push(`${MARK[c.status]}  ${c.id.padEnd(width)}  ${c.message}`);
    if (c.fix && (c.status === "warn" || c.status === "fail"))
      lines.push(`      ${"".padEnd(width)}  fix: ${c.fix}`);
  }
  const count = (s: CheckStatus) => report.checks.filter((c) => c.status === s).length;
  lines.push(
    "",
    `${count("pass")} passed, ${count("warn")} warnings, ${count("fail")} failed, ${count("skip")} skipped`,
  );
  return `${lines.join("\n")}\n`;
}
