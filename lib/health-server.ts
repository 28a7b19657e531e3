// The probe and scrape endpoint every binary runs: /healthz, /readyz and /metrics over plain HTTP
// (Bun.serve), bound to loopback unless the caller chooses otherwise.

import { errorMessage, StorageError } from "./errors.ts";
import type { Logger } from "./log.ts";
import type { Registry } from "./metrics.ts";

/** A probe: true when healthy/ready. Throwing or rejecting counts as failing, with the message shown. */
export type Check = () => boolean | Promise<boolean>;

export interface HealthServerOptions {
  /** Interface to bind. Loopback by default: exposing probes beyond the Pod is a deliberate choice. */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from the result). */
  port: number;
  registry: Registry;
  healthz: Check;
  readyz: Check;
  logger: Logger;
  /**
   * HTTP status of a failing probe. Default 503; the sidecar equivalents answer 500, as the
   * upstream node-driver-registrar and livenessprobe do (kubelet fails a probe on any >= 400).
   */
  failureStatus?: 500 | 503;
}

export interface HealthServer {
  /** The port actually bound. */
  readonly port: number;
  /** Base URL, e.g. http://127.0.0.1:8080 (IPv6 hosts are bracketed). */
  readonly url: string;
  /** Stops listening and drops open connections. Idempotent; concurrent calls share one stop. */
  close(): Promise<void>;
}

export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";
const TEXT = "text/plain; charset=utf-8";
// Probe bodies land in kubelet events and `kubectl describe`; a stack-sized message helps nobody.
const MAX_REASON = 512;

/**
 * Starts the server. GET or HEAD /healthz and /readyz answer 200 "ok", or failureStatus (503)
 * "<probe> failed: <reason>"; GET /metrics answers registry.render() (500 if rendering throws); anything else 404.
 * Checks run on every request, concurrently if requests overlap, and should be cheap: a check
 * that never settles holds its request until the kubelet's probe timeout. Failures are logged
 * once per transition (ok -> failing and back), not on every probe. Rejects with
 * StorageError("unavailable") when the address cannot be bound.
 */
export async function serveHealth(opts: HealthServerOptions): Promise<HealthServer> {
  const host = opts.host ?? "127.0.0.1";
  const { registry, logger } = opts;
  const lastOk = new Map<string, boolean>();

  const probe = async (which: "healthz" | "readyz", check: Check): Promise<Response> => {
    let reason: string | undefined;
    try {
      // Wrapped in an async call so a check that throws synchronously is caught the same way.
      const ok = await (async () => check())();
      if (ok !== true) reason = `${which} check returned ${String(ok)}`;
    } catch (err) {
      reason = errorMessage(err).replace(/\s+/g, " ").trim() || "check threw without a message";
    }
    const ok = reason === undefined;
    if (lastOk.get(which) !== ok) {
      lastOk.set(which, ok);
      if (ok) logger.info(`${which} passing`, { probe: which });
      else logger.warn(`${which} failing`, { probe: which, reason });
    }
    if (ok)
      return new Response("ok", {
        status: 200,
        headers: { "content-type": TEXT, "cache-control": "no-store" },
      });
    const body = `${which} failed: ${reason}`.slice(0, MAX_REASON);
    return new Response(body, {
      status: opts.failureStatus ?? 503,
      headers: { "content-type": TEXT, "cache-control": "no-store" },
    });
  };

  const notFound = () => new Response("not found", { status: 404, headers: { "content-type": TEXT } });

  let server: ReturnType<typeof Bun.serve>;
  try {
    server = Bun.serve({
      hostname: host,
      port: opts.port,
      async fetch(req) {
        if (req.method !== "GET" && req.method !== "HEAD") return notFound();
        const path = new URL(req.url).pathname;
        switch (path) {
          case "/healthz":
            return probe("healthz", opts.healthz);
          case "/readyz":
            return probe("readyz", opts.readyz);
          case "/metrics":
            try {
              return new Response(registry.render(), {
                status: 200,
                headers: { "content-type": METRICS_CONTENT_TYPE, "cache-control": "no-store" },
              });
            } catch (err) {
              logger.error("rendering metrics failed", { err: errorMessage(err) });
              return new Response("rendering metrics failed", {
                status: 500,
                headers: { "content-type": TEXT },
              });
            }
          default:
            return notFound();
        }
      },
      error(err) {
        logger.error("health server request failed", { err: errorMessage(err) });
        return new Response("internal error", { status: 500, headers: { "content-type": TEXT } });
      },
    });
  } catch (err) {
    throw new StorageError(
      "unavailable",
      `health server cannot listen on ${host}:${opts.port}: ${errorMessage(err)}`,
      {
        cause: err,
        details: { host, port: opts.port },
      },
    );
  }

  const port = server.port;
  if (port === undefined) {
    await server.stop(true);
    throw new StorageError("internal", `health server on ${host} reported no port`);
  }
  const urlHost = host.includes(":") ? `[${host}]` : host;
  let closing: Promise<void> | undefined;
  logger.info("health server listening", { host, port });
  return {
    port,
    url: `http://${urlHost}:${port}`,
    close() {
      closing ??= server.stop(true).then(() => logger.info("health server stopped", { host, port }));
      return closing;
    },
  };
}
