// Serves Connect-typed service implementations over gRPC on a UNIX socket (CSI, DPF plugin API),
// on @grpc/grpc-js's Server. Owns the lifecycle: stale-socket handling, bind, graceful shutdown.
// Why grpc-js rather than connect-node: docs/grpc-transport.md (measured on Bun).

import { isAbsolute } from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import type { Logger } from "../log";
import { addServiceSpec } from "./grpc-js-adapter";
import { instrumentService, type ServiceRegistration } from "./instrument";
import { prepareSocketPath, restrictSocket } from "./socket";

export { register, type ServiceRegistration } from "./instrument";

export interface GrpcServerOptions {
  /** Absolute path of the UNIX socket, e.g. /csi/csi.sock. Its directory is created if missing. */
  socketPath: string;
  /** Services to serve; build each entry with register(GenService, impl) so impl is type-checked. */
  services: readonly ServiceRegistration<DescService>[];
  logger: Logger;
  /** How long close() lets in-flight calls finish before cancelling them. Default 10 s. */
  shutdownGraceMs?: number;
  /** Largest request or response message accepted, in bytes. Default 16 MiB. */
  maxMessageBytes?: number;
  /** Methods whose successful calls log at debug (see instrument.ts). Default ["Probe"]. */
  quietMethods?: readonly string[];
}

export interface GrpcServer {
  /** The gRPC target clients dial: "unix:///abs/path.sock". */
  readonly address: string;
  /**
   * Stops accepting connections and calls at once, lets in-flight calls finish for up to
   * shutdownGraceMs, then aborts their ctx.signal (reason: UNAVAILABLE "server shutting down"),
   * gives them a moment to answer, and drops the connections. Idempotent: every call returns the
   * same promise, which resolves once the server is fully down.
   */
  close(): Promise<void>;
}

const DEFAULT_GRACE_MS = 10_000;
const DEFAULT_MAX_BYTES = 16 << 20;
/** After the grace period: time for handlers that honour ctx.signal to send their status. */
const ABORT_FLUSH_MS = 100;

/**
 * Starts serving. Rejects with StorageError "precondition" ("already serving") when a live
 * process answers on socketPath; a dead socket file left by a crash is replaced. The socket is
 * chmod 0660 once bound. Methods an impl leaves out answer UNIMPLEMENTED, and so do services that
 * are not registered at all. Every call is logged once (see instrument.ts) with secrets redacted.
 */
export async function serveGrpc(opts: GrpcServerOptions): Promise<GrpcServer> {
  if (!isAbsolute(opts.socketPath))
    throw new Error(`serveGrpc: socketPath must be absolute: ${opts.socketPath}`);
  const maxBytes = opts.maxMessageBytes ?? DEFAULT_MAX_BYTES;
  const graceMs = opts.shutdownGraceMs ?? DEFAULT_GRACE_MS;
  const log = opts.logger.with({ socket: opts.socketPath });

  await prepareSocketPath(opts.socketPath);

  const server = new grpc.Server({
    "grpc.max_receive_message_length": maxBytes,
    "grpc.max_send_message_length": maxBytes,
    // channelz keeps per-call traces we never read.
    "grpc.enable_channelz": 0,
  });
  const shutdown = new AbortController();
  for (const reg of opts.services) {
    const spec = instrumentService(reg, { logger: log, quietMethods: opts.quietMethods });
    addServiceSpec(server, spec, shutdown.signal, log);
  }

  const address = `unix://${opts.socketPath}`;
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err) =>
      err ? reject(err) : resolve(),
    ),
  );
  try {
    await restrictSocket(opts.socketPath);
  } catch (e) {
    server.forceShutdown();
    throw e;
  }
  log.info("grpc serving", { services: opts.services.map((s) => s.service.typeName) });

  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= new Promise<void>((resolve) => {
      const started = performance.now();
      let forced = false;
      let finished = false;
      const finish = () => {
        if (finished) return;
        finished = true;
        clearTimeout(graceTimer);
        clearTimeout(forceTimer);
        log.info("grpc stopped", { forced, durationMs: Math.round(performance.now() - started) });
        resolve();
      };
      let forceTimer: ReturnType<typeof setTimeout> | undefined;
      const graceTimer = setTimeout(() => {
        forced = true;
        shutdown.abort(new ConnectError("server shutting down", Code.Unavailable));
        forceTimer = setTimeout(() => {
          server.forceShutdown();
          finish();
        }, ABORT_FLUSH_MS);
      }, graceMs);
      // Closes the listener at once and sends GOAWAY on each connection; completes when the
      // last in-flight call has finished.
      server.tryShutdown(() => finish());
    });
    return closing;
  };
  return { address, close };
}
