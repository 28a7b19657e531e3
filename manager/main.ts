// The manager binary: reads its configuration from the environment, serves /healthz, /readyz and
// /metrics, campaigns for the leader Lease and runs the controllers only while it leads (lib/kube's
// leader terms stop them the moment leadership is lost), and shuts down cleanly on SIGTERM/SIGINT.
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { realClock } from "../lib/clock.ts";
import { errorMessage } from "../lib/errors.ts";
import { serveHealth } from "../lib/health-server.ts";
import { connect } from "../lib/kube/connection.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { type LeaderTerms, runLeaderTerms } from "../lib/kube/leader-terms.ts";
import { createLogger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { type ManagerConfig, parseConfig } from "./config.ts";
import { startManager } from "./manager.ts";
import { registerManagerMetrics } from "./metrics.ts";
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
const { metrics, onRequest } = registerManagerMetrics(registry);
const conn = connect(config.kubeconfig, { onRequest });
metrics.leader.set({}, 0);
const recorder = new EventRecorder(conn, {
  controller: EVENT_CONTROLLER,
  instance: config.identity,
  // Events about cluster-scoped objects (devices) must live in "default": the API server refuses
  // them elsewhere, so the recorder's default is kept.
  logger,
});

let terms: LeaderTerms | undefined;
const health = await serveHealth({
  host: config.health.host,
  port: config.health.port,
  registry,
  logger,
  healthz: () => true,
  // A standby is ready (it serves probes and metrics); a leader once its caches have synced.
  readyz: () => terms?.ready ?? true,
});

const le = config.leaderElection;
terms = runLeaderTerms({
  conn,
  clock: realClock,
  logger,
  ...(le.enabled
    ? {
        election: {
          namespace: config.namespace,
          name: le.leaseName,
          identity: config.identity,
          leaseDurationMs: le.leaseDurationMs,
          renewDeadlineMs: le.renewDeadlineMs,
          retryPeriodMs: le.retryPeriodMs,
          onNewLeader: (who: string) => logger.info("leader observed", { leader: who }),
        },
      }
    : {}),
  // Each term starts the controllers on fresh caches and a fresh inventory.
  start: (signal) =>
    startManager({ conn, config, clock: realClock, logger, registry, events: recorder, signal }),
  onLeading: (leading) => metrics.leader.set({}, leading ? 1 : 0),
});

let shuttingDown = false;
async function shutdown(sig: string): Promise<void> {
  if (shuttingDown) return;
  shuttingDown = true;
  logger.info("shutting down", { signal: sig });
  await terms?.stop();
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
