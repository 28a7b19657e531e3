// The distort-csi process: parses flags and environment, serves Identity plus the Controller
// and/or Node service on the CSI UNIX socket, serves /healthz, /readyz and /metrics, and on
// SIGTERM lets in-flight calls finish before it exits. --mode=registrar|liveness run the sidecar
// equivalents instead (csi/sidecar/).
import { hostname } from "node:os";
import { API_VERSION } from "../api/common.ts";
import { Controller, GroupController, Identity, Node, SnapshotMetadata } from "../gen/csi/v1/csi_pb.ts";
import { realClock } from "../lib/clock.ts";
import { formatNodeId } from "../lib/csi-node-id.ts";
import { errorMessage, StorageError } from "../lib/errors.ts";
import { type Exec, hostExec } from "../lib/exec.ts";
import { hostFs } from "../lib/fs.ts";
import { register, type ServiceRegistration, serveGrpc } from "../lib/grpc/server.ts";
import { serveHealth } from "../lib/health-server.ts";
import { readHostNqn } from "../lib/host-nqn.ts";
import { dirKeyFiles } from "../lib/key-files.ts";
import { CacheSet } from "../lib/kube/cache-set.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { nodeLabels, nodeVolumeClaims } from "../lib/kube/node-directory.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { logPreflight } from "../lib/preflight/log-report.ts";
import { runPreflight } from "../lib/preflight/preflight.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import pkg from "../package.json" with { type: "json" };
import { csiTransform } from "./caches.ts";
import { type CsiConfig, parseCsiConfig, USAGE } from "./config.ts";
import { parseVolumeId } from "./controller/volume-id.ts";
import { CsiController } from "./controller.ts";
import { HostMounter } from "./host/mounter.ts";
import { NvmeCli } from "./host/nvme-cli.ts";
import { createIdentityService, hostToolsCheck, notReadyReasons, type ReadinessCheck } from "./identity.ts";
import { NODE_PATH_PERIOD_MS, registerCsiMetrics } from "./metrics.ts";
import { meteredInitiator, PathObserver } from "./node/metrics.ts";
import { StagingSweep } from "./node/staging-sweep.ts";
import { fileStateStore } from "./node/state-store.ts";
import { createNode, type NodeDeps } from "./node.ts";
import { sidecarModeOf } from "./sidecar/config.ts";
import { runSidecarProcess } from "./sidecar/process.ts";

export interface RunningCsi {
  /** "unix:///..." of the CSI socket. */
  address: string;
  healthPort: number;
  /** The controller, in controller and all modes. */
  controller?: CsiController;
  /** Graceful stop: in-flight calls get cfg.shutdownGraceMs, then caches and probes stop. */
  stop(): Promise<void>;
}

export interface RunOptions {
  /** An existing connection (tests); otherwise one from cfg.kubeconfig or the service account. */
  conn?: KubeConnection;
  /** Resolves a command on PATH, for the node tools check. */
  which?: (name: string) => string | null;
  /** Host ports of the node service; the lab passes its simulated fabric, production none. */
  node?: Partial<Pick<NodeDeps, "initiator" | "mounter" | "fs" | "state">> & { exec?: Exec };
}

/**
 * Starts the services for cfg.mode. Node and all modes first read the host NQN (under
 * cfg.hostRoot) and record it on this node's Node object, and fail startup when either is
 * impossible: the controller authorizes exactly that NQN. The socket is then served; controller
 * caches sync in the background and Probe answers ready=false until they have.
 */
export async function runCsi(cfg: CsiConfig, logger: Logger, opts: RunOptions = {}): Promise<RunningCsi> {
  const registry = new Registry();
  const { measure, node: nodeMetrics } = registerCsiMetrics(registry);
  const stopObserver = new AbortController();
  let observing: Promise<void> | undefined;
  let sweeping: Promise<void> | undefined;
  const readiness: ReadinessCheck[] = [];
  const services: ServiceRegistration[] = [];
  const serveController = cfg.mode === "controller" || cfg.mode === "all";
  const serveNode = cfg.mode === "node" || cfg.mode === "all";
  const conn = opts.conn ?? connect(cfg.kubeconfig);

  if (serveNode) {
    const nodeName = cfg.nodeId as string;
    // Staging paths, /dev and /proc/self/mountinfo are as this process sees them; only the
    // host's identity and its sysfs may sit under another root (a container mount, the lab).
    const fs = opts.node?.fs ?? hostFs("/");
    const hostRootFs = hostFs(cfg.hostRoot);
    const exec = opts.node?.exec ?? hostExec;
    const nodeLog = logger.with({ service: "node" });
    const hostNqn = await readHostNqn(hostRootFs);
    // The host NQN travels in the node ID kubelet stores in CSINode; the Node is only read.
    const nodeId = formatNodeId(nodeName, hostNqn);
    const labels = await withRetries(() => nodeLabels(conn, nodeName), logger);
    const topology = Object.fromEntries(
      cfg.topologyKeys.flatMap((k) => (labels[k] === undefined ? [] : [[k, labels[k] as string]])),
    );
    const initiator = meteredInitiator(
      opts.node?.initiator ??
        new NvmeCli({ exec, fs: hostRootFs, logger: nodeLog, secretFiles: dirKeyFiles(cfg.keyDir) }),
      nodeMetrics,
    );
    observing = new PathObserver(initiator, nodeMetrics, nodeLog).run(
      NODE_PATH_PERIOD_MS,
      realClock,
      stopObserver.signal,
    );
    const state = opts.node?.state ?? fileStateStore(cfg.stateDir);
    const node = createNode({
      nodeId,
      hostNqn,
      topology,
      maxVolumesPerNode: cfg.maxVolumesPerNode,
      initiator,
      mounter: opts.node?.mounter ?? new HostMounter({ exec, fs }),
      fs,
      state,
      clock: realClock,
      logger: nodeLog,
      ...(cfg.kubeletDir === undefined ? {} : { kubeletDir: cfg.kubeletDir }),
    });
    services.push(register(Node, measure(node.service)));
    if (cfg.stagingSweepMs > 0) {
      const events = new EventRecorder(conn, {
        controller: "storage.distort.io/csi-node",
        instance: nodeName,
        logger: nodeLog,
      });
      const sweep = new StagingSweep({
        state,
        claims: () => nodeVolumeClaims(conn, nodeName, DRIVER_NAME),
        unstage: (volumeId, stagingPath) => node.unstage(volumeId, stagingPath),
        // On the volume's NVMePartition, where `kubectl describe` of the volume shows it.
        report: async (outcome, volumeId, _staging, detail) => {
          const ref = parseVolumeId(volumeId);
          if (ref === undefined) return;
          await events.record(
            {
              apiVersion: API_VERSION,
              kind: "NVMePartition",
              metadata: { name: ref.name, namespace: ref.namespace, uid: ref.uid },
            },
            "Warning",
            outcome === "unstaged" ? "ForgottenStagingUnstaged" : "ForgottenStagingNotUnstaged",
            "Unstage",
            `node ${nodeName}: ${detail}`,
          );
        },
        logger: nodeLog.with({ component: "staging-sweep" }),
      });
      sweeping = sweep.run(cfg.stagingSweepMs, realClock, stopObserver.signal);
    }
    // Preflight of the initiator side, logged only: the node plugin never exits on it, since it
    // cannot know which transport or authentication a volume will need before NodeStage, and
    // NodeStage reports a missing module or nvme-cli for exactly the volume that needs it.
    void runPreflight({ roles: ["initiator"], transports: ["tcp", "rdma"] }, { fs: hostRootFs, exec })
      .then((report) => logPreflight(report, nodeLog.with({ component: "preflight" })))
      .catch((err: unknown) => nodeLog.warn("preflight could not run", { err: errorMessage(err) }));
    if (cfg.nodeTools.length > 0) readiness.push(hostToolsCheck(cfg.nodeTools, opts.which ?? Bun.which));
    logger.info("node plugin identity", { node: nodeName, nodeId, hostNQN: hostNqn, topology });
  }

  let controller: CsiController | undefined;
  if (serveController) {
    const controllerLog = logger.with({ service: "controller" });
    const c = new CsiController({
      conn,
      caches: new CacheSet(conn, { logger: controllerLog, transform: csiTransform }),
      namespace: cfg.namespace,
      logger: controllerLog,
      clock: realClock,
      defaultTimeoutMs: cfg.defaultTimeoutMs,
      defaultVolumeBytes: cfg.defaultVolumeBytes,
      events: new EventRecorder(conn, { controller: "storage.distort.io/csi", instance: hostname(), logger }),
      orphans: { graceMs: cfg.orphanGraceMs, intervalMs: cfg.orphanSweepMs },
      heartbeatStalenessMs: cfg.heartbeatStalenessMs,
    });
    controller = c;
    readiness.push(() => c.notReadyReason());
    services.push(register(Controller, measure(c.service())));
    services.push(register(GroupController, measure(c.groupService())));
    services.push(register(SnapshotMetadata, measure(c.snapshotMetadataService())));
    c.start().then(
      () => logger.info("controller caches synced"),
      (err) => logger.error("controller caches failed to start", { err: errorMessage(err) }),
    );
  }

  services.unshift(
    register(
      Identity,
      measure(
        createIdentityService({
          vendorVersion: pkg.version,
          controllerService: serveController,
          readiness,
          logger,
        }),
      ),
    ),
  );

  let server: Awaited<ReturnType<typeof serveGrpc>>;
  let health: Awaited<ReturnType<typeof serveHealth>>;
  try {
    server = await serveGrpc({
      socketPath: cfg.socketPath,
      services,
      logger,
      shutdownGraceMs: cfg.shutdownGraceMs,
    });
    try {
      health = await serveHealth({
        host: cfg.health.host,
        port: cfg.health.port,
        registry,
        logger,
        healthz: () => true,
        readyz: async () => {
          const reasons = await notReadyReasons(readiness);
          if (reasons.length) throw new Error(reasons.join("; "));
          return true;
        },
      });
    } catch (err) {
      await server.close();
      throw err;
    }
  } catch (err) {
    stopObserver.abort();
    await observing;
    await sweeping;
    await controller?.stop();
    throw err;
  }
  logger.info("csi running", {
    mode: cfg.mode,
    socket: cfg.socketPath,
    namespace: cfg.namespace,
    health: health.url,
  });

  let stopping: Promise<void> | undefined;
  return {
    address: server.address,
    healthPort: health.port,
    ...(controller ? { controller } : {}),
    stop() {
      stopping ??= (async () => {
        stopObserver.abort();
        await observing;
        await sweeping;
        await server.close();
        await controller?.stop();
        await health.close();
      })();
      return stopping;
    },
  };
}

/** Retries a startup call through a short API-server outage; any other failure is final. */
async function withRetries<T>(fn: () => Promise<T>, logger: Logger, attempts = 6): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts || !(err instanceof StorageError && err.kind === "unavailable")) throw err;
      logger.warn("startup call failed, retrying", { err: errorMessage(err), attempt: i });
      await realClock.sleep(250 * 2 ** i);
    }
  }
}

/** The driver process: configuration, logger, start, signals. */
async function main(argv: readonly string[]): Promise<void> {
  let cfg: CsiConfig;
  try {
    cfg = parseCsiConfig(argv, process.env);
  } catch (err) {
    process.stderr.write(`distort-csi: ${errorMessage(err)}\n${USAGE}\n`);
    process.exit(2);
  }
  const logger = createLogger({
    level: cfg.logLevel,
    fields: { component: "csi", mode: cfg.mode, ...(cfg.nodeId ? { node: cfg.nodeId } : {}) },
  });
  let running: RunningCsi;
  try {
    running = await runCsi(cfg, logger);
  } catch (err) {
    logger.error("csi failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
  stopOnSignals(logger, "csi", () => running.stop());
}

if (import.meta.main) {
  const argv = process.argv.slice(2);
  const sidecar = sidecarModeOf(argv);
  if (sidecar === undefined) await main(argv);
  else await runSidecarProcess(sidecar, argv, process.env);
}
