// The exit codes of `kubectl distort`, one table for every subcommand, so a script can tell
// "something is unhealthy" from "the command could not run".

/**
 * 0 success / healthy; 1 what was inspected is unhealthy (status, describe) or a preflight check
 * failed; 2 usage error, no kubeconfig, or the API server could not be read; 3 preflight had
 * warnings and --strict was given; 4 the object named on the command line does not exist.
 */
export const EXIT = { ok: 0, unhealthy: 1, usage: 2, warnings: 3, notFound: 4 } as const;

/** A problem the user must fix before the command can run; printed as is, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** The object named on the command line does not exist; exit code 4. */
export class NotFoundError extends Error {
  override readonly name = "NotFoundError";
}
