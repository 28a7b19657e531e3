// The manager binary: reads its configuration from the environment, serves /healthz, /readyz and
// /metrics, campaigns for the leader Lease and runs the controllers only while it leads (stopping
// them the moment leadership is lost), and shuts down cleanly on SIGTERM/SIGINT.
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { realClock } from "../lib/clock.ts";
import { errorMessage } from "../lib/errors.ts";
import { serveHealth } from "../lib/health-server.ts";
import { connect } from "../lib/kube/connection.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { LeaderElector } from "../lib/kube/leader.ts";
import { kubeRequestCounter } from "../lib/kube/request-metrics.ts";
import { createLogger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { type ManagerConfig, parseConfig } from "./config.ts";
import { type RunningManager, startManager } from "./manager.ts";
import { managerMetrics } from "./metrics.ts";
import { EVENT_CONTROLLER } from "./vocabulary.ts";

let config: ManagerConfig;
try {
  config = parseConfig(process.env, { hostname: hostname(), randomSuffix: randomBytes(4).toString("hex") });
} catch (err) {
  process.stderr.write(`distort-manager: ${errorMessage(err)}\n`);
  process.exit(2);
}

const logger = createLogger({
  level: config.logLevel,
  fields: { component: "manager", identity: config.identity },
});
const registry = new Registry();
const conn = connect(config.kubeconfig, { onRequest: kubeRequestCounter(registry) });
const metrics = managerMetrics(registry);
metrics.leader.set({}, 0);
const recorder = new EventRecorder(conn, {
  controller: EVENT_CONTROLLER,
  instance: config.identity,
  // Events about cluster-scoped objects (devices) must live in "default": the API server refuses
  // them elsewhere, so the recorder's default is kept.
  logger,
});

let leading = false;
let running: RunningManager | undefined;

/** Runs the controllers until `signal` aborts (leadership lost, or shutdown). */
async function lead(signal: AbortSignal): Promise<void> {
  leading = true;
  metrics.leader.set({}, 1);
  try {
    running = await startManager({
      conn,
      config,
      clock: realClock,
      logger,
      registry,
      events: recorder,
      signal,
    });
    logger.info("controllers running");
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", () => resolve(), { once: true });
    });
  } catch (err) {
    if (!signal.aborted) logger.error("controllers failed", { err: errorMessage(err) });
  } finally {
    const r = running;
    running = undefined;
    await r?.stop();
    leading = false;
    metrics.leader.set({}, 0);
    logger.info("controllers stopped");
  }
}

const health = await serveHealth({
  host: config.health.host,
  port: config.health.port,
  registry,
  logger,
  healthz: () => true,
  // A standby is ready (it serves probes and metrics); a leader once its caches have synced.
  readyz: () => !leading || running !== undefined,
});

let stopLeading: () => Promise<void>;
if (config.leaderElection.enabled) {
  const le = config.leaderElection;
  const elector = new LeaderElector(conn, {
    namespace: config.namespace,
    name: le.leaseName,
    identity: config.identity,
    leaseDurationMs: le.leaseDurationMs,
    renewDeadlineMs: le.renewDeadlineMs,
    retryPeriodMs: le.retryPeriodMs,
    clock: realClock,
    logger,
    onStartedLeading: lead,
    onNewLeader: (who) => logger.info("leader observed", { leader: who }),
  });
  elector.start();
  stopLeading = () => elector.stop();
} else {
  logger.warn("leader election disabled: controllers run in this process unconditionally");
  const ctl = new AbortController();
  const done = lead(ctl.signal);
  stopLeading = async () => {
    ctl.abort();
    await done;
  };
}

let shuttingDown = false;
async function shutdown(sig: string): Promise<void> {
  if (shuttingDown) return;
  shuttingDown = true;
  logger.info("shutting down", { signal: sig });
  await stopLeading();
  await health.close();
  process.exit(0);
}
process.on("SIGTERM", () => void shutdown("SIGTERM"));
process.on("SIGINT", () => void shutdown("SIGINT"));
logger.info("manager started", {
  namespace: config.namespace,
  leaderElection: config.leaderElection.enabled,
  health: health.url,
});
