// The process shell of distort-csi's sidecar modes (csi/main.ts hands argv over when it asks for
// --mode=registrar or --mode=liveness): configuration, logger, start, signals and exit codes.
import { realClock } from "../../lib/clock.ts";
import { errorMessage } from "../../lib/errors.ts";
import { createLogger } from "../../lib/log.ts";
import { stopOnSignals } from "../../lib/signals.ts";
import { parseLivenessConfig, parseRegistrarConfig, SIDECAR_USAGE, type SidecarMode } from "./config.ts";
import { runLiveness } from "./liveness.ts";
import { runRegistrar } from "./registrar.ts";

/**
 * Runs one sidecar mode until a signal. Exit codes: 2 for a bad configuration, 1 when startup
 * fails (no CSI driver within the wait, socket or port taken) and, in registrar mode, when kubelet
 * reports the registration failed; 0 after SIGTERM/SIGINT.
 */
export async function runSidecarProcess(
  mode: SidecarMode,
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): Promise<void> {
  let logLevel: "debug" | "info" | "warn" | "error";
  let start: () => Promise<{ stop(): Promise<void>; failed?: Promise<string> }>;
  const logger = (level: typeof logLevel) => createLogger({ level, fields: { component: "csi", mode } });
  try {
    if (mode === "registrar") {
      const cfg = parseRegistrarConfig(argv, env);
      logLevel = cfg.logLevel;
      start = () => runRegistrar(cfg, { logger: logger(cfg.logLevel), clock: realClock });
    } else {
      const cfg = parseLivenessConfig(argv, env);
      logLevel = cfg.logLevel;
      start = () => runLiveness(cfg, { logger: logger(cfg.logLevel) });
    }
  } catch (err) {
    process.stderr.write(`distort-csi: ${errorMessage(err)}\n${SIDECAR_USAGE}\n`);
    process.exit(2);
  }
  const log = logger(logLevel);
  let running: Awaited<ReturnType<typeof start>>;
  try {
    running = await start();
  } catch (err) {
    log.error(`${mode} failed to start`, { err: errorMessage(err) });
    process.exit(1);
  }
  stopOnSignals(log, mode, () => running.stop());
  running.failed?.then(async () => {
    // The refusal is logged where it arrives; leave so that kubelet retries after the restart.
    try {
      await running.stop();
    } finally {
      process.exit(1);
    }
  });
}
