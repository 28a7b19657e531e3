// DISTORT's node-driver-registrar: learns the driver name from the CSI socket, then serves kubelet's
// plugin-registration service (pluginregistration.Registration) on
// <plugins_registry>/<driver>-reg.sock, telling kubelet which endpoint to dial for CSI.
import { lstat, unlink } from "node:fs/promises";
import { join } from "node:path";
import { Registration } from "../../gen/pluginregistration/v1/api_pb.ts";
import type { Clock } from "../../lib/clock.ts";
import { register, serveGrpc } from "../../lib/grpc/server.ts";
import { serveHealth } from "../../lib/health-server.ts";
import type { Logger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import type { RegistrarConfig } from "./config.ts";
import { waitForDriverName } from "./csi-client.ts";

/** PluginInfo.type of a CSI plugin (k8s.io/kubelet pluginregistration/v1 constants.go). */
export const CSI_PLUGIN_TYPE = "CSIPlugin";
/**
 * The CSI spec versions reported to kubelet, as upstream node-driver-registrar reports them;
 * kubelet's CSI plugin handler accepts any 1.x.
 */
export const SUPPORTED_VERSIONS: readonly string[] = ["1.0.0"];

export interface RunningRegistrar {
  /** The driver name GetPluginInfo reported. */
  driverName: string;
  /** The registration socket: <registrationDir>/<driverName>-reg.sock. */
  socketPath: string;
  /** The bound /healthz port, when cfg.http is set. */
  healthPort?: number;
  /**
   * Resolves with kubelet's error message when kubelet reports that registration failed
   * (NotifyRegistrationStatus with plugin_registered=false); the process should then stop and
   * exit non-zero, so that kubelet retries against a fresh socket, as upstream does.
   */
  readonly failed: Promise<string>;
  /** Stops /healthz and the gRPC server and removes the registration socket. Idempotent. */
  stop(): Promise<void>;
}

export interface RegistrarDeps {
  logger: Logger;
  clock: Clock;
}

/** True when `path` exists and is a socket. */
async function isSocket(path: string): Promise<boolean> {
  try {
    return (await lstat(path)).isSocket();
  } catch {
    return false;
  }
}

/**
 * Starts the registrar. Waits (up to cfg.csiWaitMs) for the driver's GetPluginInfo, then serves
 * GetInfo and NotifyRegistrationStatus on the registration socket; a socket left by a dead
 * predecessor is replaced, a live one is refused (lib/grpc/socket.ts). /healthz (when cfg.http is
 * set) answers 200 while the socket exists and kubelet has confirmed the registration, 500
 * otherwise. Rejects when the driver never answers, or the socket or port cannot be bound.
 */
export async function runRegistrar(cfg: RegistrarConfig, deps: RegistrarDeps): Promise<RunningRegistrar> {
  const { logger } = deps;
  const driverName = await waitForDriverName(cfg.csiSocketPath, {
    callTimeoutMs: cfg.callTimeoutMs,
    waitMs: cfg.csiWaitMs,
    clock: deps.clock,
    logger,
  });
  const socketPath = join(cfg.registrationDir, `${driverName}-reg.sock`);
  const log = logger.with({ driver: driverName });
  log.info("CSI driver found", { csiSocket: cfg.csiSocketPath });

  let registered = false;
  let reportFailure!: (error: string) => void;
  const failed = new Promise<string>((resolve) => {
    reportFailure = resolve;
  });

  const server = await serveGrpc({
    socketPath,
    logger: log,
    // Both calls are instant; nothing needs a long drain.
    shutdownGraceMs: 1000,
    services: [
      register(Registration, {
        getInfo: () => ({
          type: CSI_PLUGIN_TYPE,
          name: driverName,
          endpoint: cfg.kubeletRegistrationPath,
          supportedVersions: [...SUPPORTED_VERSIONS],
        }),
        notifyRegistrationStatus: (status) => {
          if (status.pluginRegistered) {
            if (!registered)
              log.info("kubelet registered the plugin", { endpoint: cfg.kubeletRegistrationPath });
            registered = true;
          } else {
            registered = false;
            const error = status.error || "kubelet gave no reason";
            log.error("kubelet refused the plugin registration", { error });
            reportFailure(error);
          }
          return {};
        },
      }),
    ],
  });

  let health: Awaited<ReturnType<typeof serveHealth>> | undefined;
  if (cfg.http) {
    const check = async () => {
      if (!(await isSocket(socketPath))) throw new Error(`registration socket ${socketPath} does not exist`);
      if (!registered)
        throw new Error("kubelet has not confirmed the registration (NotifyRegistrationStatus)");
      return true;
    };
    try {
      health = await serveHealth({
        host: cfg.http.host,
        port: cfg.http.port,
        registry: new Registry(),
        logger: log,
        healthz: check,
        readyz: check,
        failureStatus: 500,
      });
    } catch (err) {
      await server.close();
      await removeSocket(socketPath);
      throw err;
    }
  }
  log.info("registrar serving", {
    socket: socketPath,
    endpoint: cfg.kubeletRegistrationPath,
    ...(health ? { health: health.url } : {}),
  });

  let stopping: Promise<void> | undefined;
  return {
    driverName,
    socketPath,
    ...(health ? { healthPort: health.port } : {}),
    failed,
    stop() {
      stopping ??= (async () => {
        await health?.close();
        await server.close();
        // kubelet's plugin watcher sees the removal and deregisters the plugin.
        await removeSocket(socketPath);
      })();
      return stopping;
    },
  };
}

/** Removes our socket file; a path that is gone, or is not a socket, is left alone. */
async function removeSocket(path: string): Promise<void> {
  if (!(await isSocket(path))) return;
  try {
    await unlink(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
}
