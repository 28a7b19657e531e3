// DISTORT's livenessprobe: an HTTP /healthz that turns each request into a CSI Probe on the
// driver's socket, so kubelet's httpGet liveness probe restarts a driver that stopped answering.
import { serveHealth } from "../../lib/health-server.ts";
import type { Logger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import type { LivenessConfig } from "./config.ts";
import { probeDriver } from "./csi-client.ts";

export interface RunningLiveness {
  /** The bound /healthz port. */
  port: number;
  url: string;
  /** Stops listening. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Serves /healthz (and /readyz, the same check) on cfg.http. Every request makes one CSI Probe
 * with cfg.probeTimeoutMs: 200 when the driver answers ready=true or leaves ready unset, 500 with
 * the reason when it answers ready=false, fails, or does not answer in time. Requests that
 * overlap each make their own Probe. Rejects when the port cannot be bound.
 */
export async function runLiveness(cfg: LivenessConfig, deps: { logger: Logger }): Promise<RunningLiveness> {
  const check = async () => {
    const reason = await probeDriver(cfg.csiSocketPath, cfg.probeTimeoutMs);
    if (reason !== undefined) throw new Error(reason);
    return true;
  };
  const health = await serveHealth({
    host: cfg.http.host,
    port: cfg.http.port,
    registry: new Registry(),
    logger: deps.logger,
    healthz: check,
    readyz: check,
    failureStatus: 500,
  });
  deps.logger.info("liveness probe serving", {
    csiSocket: cfg.csiSocketPath,
    health: health.url,
    probeTimeoutMs: cfg.probeTimeoutMs,
  });
  return { port: health.port, url: health.url, stop: () => health.close() };
}
