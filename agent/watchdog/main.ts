// `distort-agent --mode=target-watchdog`: the target watchdog's process (agent/watchdog/watchdog.ts),
// configured from the environment the agent's own container has (DISTORT_SPDK_SOCKET, NODE_NAME,
// DISTORT_LOG_LEVEL) plus DISTORT_WATCHDOG_POLL_MS. Stops on SIGTERM/SIGINT.
import * as v from "valibot";
import { realClock } from "../../lib/clock.ts";
import { createLogger } from "../../lib/log.ts";
import { stopOnSignals } from "../../lib/signals.ts";
import { SpdkClient } from "../../lib/spdk/client.ts";
import { SpdkMethods } from "../../lib/spdk/methods.ts";
import { watchdogPaths } from "./lease.ts";
import { TargetWatchdog } from "./watchdog.ts";

/** The command-line flag that selects this mode of the agent binary. */
export const TARGET_WATCHDOG_MODE = "--mode=target-watchdog";

/** The poll period's range (ms): DISTORT_WATCHDOG_POLL_MS, chart value agent.spdk.targetWatchdog.pollMs. */
export const WATCHDOG_POLL_MS = { min: 10, max: 10_000 } as const;

const EnvSchema = v.object({
  DISTORT_SPDK_SOCKET: v.optional(v.pipe(v.string(), v.startsWith("/")), "/var/tmp/spdk.sock"),
  NODE_NAME: v.optional(v.string()),
  DISTORT_WATCHDOG_POLL_MS: v.optional(
    v.pipe(
      v.string(),
      v.transform(Number),
      v.number(),
      v.integer(),
      v.minValue(WATCHDOG_POLL_MS.min),
      v.maxValue(WATCHDOG_POLL_MS.max),
    ),
    "250",
  ),
  DISTORT_LOG_LEVEL: v.optional(v.picklist(["debug", "info", "warn", "error"]), "info"),
});

export type WatchdogConfig = {
  spdkSocket: string;
  node?: string;
  pollMs: number;
  logLevel: "debug" | "info" | "warn" | "error";
};

/** Parses the watchdog's environment; throws Error with a clear message for a bad value. */
export function parseWatchdogConfig(env: Record<string, string | undefined>): WatchdogConfig {
  const r = v.safeParse(EnvSchema, env);
  if (!r.success) {
    const issue = r.issues[0];
    throw new Error(`target watchdog config: ${v.getDotPath(issue) ?? "<root>"}: ${issue.message}`);
  }
  const o = r.output;
  return {
    spdkSocket: o.DISTORT_SPDK_SOCKET,
    ...(o.NODE_NAME ? { node: o.NODE_NAME } : {}),
    pollMs: Number(o.DISTORT_WATCHDOG_POLL_MS),
    logLevel: o.DISTORT_LOG_LEVEL,
  };
}

/** Runs the watchdog until a signal stops it. */
export async function runTargetWatchdog(env: Record<string, string | undefined>): Promise<void> {
  let cfg: WatchdogConfig;
  try {
    cfg = parseWatchdogConfig(env);
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(2);
  }
  const logger = createLogger({
    level: cfg.logLevel,
    fields: { component: "target-watchdog", ...(cfg.node ? { node: cfg.node } : {}) },
  });
  const paths = watchdogPaths(cfg.spdkSocket);
  // Short calls: a fence retried every poll beats one call waiting out a long default.
  const client = new SpdkClient({
    socketPath: cfg.spdkSocket,
    logger,
    clock: realClock,
    callTimeoutMs: 2_000,
  });
  const dog = new TargetWatchdog({
    leasePath: paths.lease,
    recordPath: paths.record,
    ...(cfg.node ? { node: cfg.node } : {}),
    spdk: new SpdkMethods(client),
    clock: realClock,
    logger,
  });
  const stop = new AbortController();
  logger.info("target watchdog running", { lease: paths.lease, record: paths.record, pollMs: cfg.pollMs });
  const running = dog.run(stop.signal, cfg.pollMs);
  stopOnSignals(logger, "target-watchdog", async () => {
    stop.abort();
    await running;
    await client.close();
  });
}
