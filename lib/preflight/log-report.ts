// Logging a preflight report at start-up: every failure and warning on its own line with its
// fix, and one summary line, so `kubectl logs` of an agent or CSI node Pod says what to repair.
import type { Logger } from "../log.ts";
import type { PreflightReport } from "./check.ts";

/** Logs fail as error, warn as warn, and an info summary naming the checks that passed. */
export function logPreflight(report: PreflightReport, logger: Logger): void {
  for (const c of report.checks) {
    const fields = {
      check: c.id,
      ...(c.fix ? { fix: c.fix } : {}),
      ...(c.details ? { details: c.details } : {}),
    };
    if (c.status === "fail") logger.error(`preflight: ${c.message}`, fields);
    else if (c.status === "warn") logger.warn(`preflight: ${c.message}`, fields);
  }
  logger.info("preflight done", {
    worst: report.worst,
    passed: report.checks.filter((c) => c.status === "pass").map((c) => c.id),
  });
}
