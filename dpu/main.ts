// The distort-dpu process: reads its configuration, opens one persistent JSON-RPC connection to
// SNAP, serves the DPF IdentityService and StoragePluginService on the plugin socket and
// /healthz, /readyz, /metrics over HTTP, and on SIGTERM lets in-flight calls finish before exiting.

import { Identity as CsiIdentity, Node as CsiNode } from "../gen/csi/v1/csi_pb.ts";
import { IdentityService, StoragePluginService } from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { type Clock, realClock } from "../lib/clock.ts";
import { errorMessage } from "../lib/errors.ts";
import { type Exec, hostExec } from "../lib/exec.ts";
import { hostFs } from "../lib/fs.ts";
import { callMetrics } from "../lib/grpc/call-metrics.ts";
import { register, serveGrpc } from "../lib/grpc/server.ts";
import { serveHealth } from "../lib/health-server.ts";
import { readHostNqn } from "../lib/host-nqn.ts";
import { dirKeyFiles } from "../lib/key-files.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { kubeSecretReader, type SecretReader } from "../lib/kube/secrets.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { SpdkClient, type SpdkRpc } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import pkg from "../package.json" with { type: "json" };
import { type DpuConfig, parseDpuConfig, USAGE } from "./config.ts";
import { createCsiNodeInfo } from "./csi-node-info.ts";
import { type BlockDevices, snapNbdBlockDevices } from "./devices/block-devices.ts";
import { DeviceManager } from "./devices/device-manager.ts";
import { type HostFilesystem, hostFilesystem } from "./devices/host-filesystem.ts";
import { type DeviceStore, fileDeviceStore } from "./devices/state-store.ts";
import { createIdentityService } from "./identity.ts";
import { Readiness } from "./readiness.ts";
import { SnapRpc } from "./snap/snap-rpc.ts";
import { createStoragePluginService } from "./storage-plugin.ts";

/** Replaceable parts, for tests and the lab; production uses none. */
export interface DpuOverrides {
  /** How Filesystem volumes reach the DPU kernel; default SNAP's NBD export. */
  blockDevices?: BlockDevices;
  filesystem?: HostFilesystem;
  /** Secret access; `null` for none. Default: Kubernetes, when a kubeconfig or the in-cluster account exists. */
  secrets?: SecretReader | null;
  /** Kubernetes connection for Secrets and the Node registration; `null` for none. Default as for secrets. */
  kube?: KubeConnection | null;
  exec?: Exec;
  clock?: Clock;
  /** Wraps the SNAP connection (fault injection in crash tests). */
  wrapSnapRpc?: (rpc: SpdkRpc) => SpdkRpc;
  /** Wraps the device records (fault injection in crash tests). */
  wrapStore?: (store: DeviceStore) => DeviceStore;
}

export interface RunningDpu {
  /** "unix:///..." of the plugin socket. */
  readonly address: string;
  readonly healthPort: number;
  readonly readiness: Readiness;
  /** Resolves once the plugin is initialised (first SNAP round trip); never rejects. */
  readonly initialised: Promise<void>;
  /** Graceful stop: in-flight calls get shutdownGraceMs, then the SNAP connection closes. Idempotent. */
  stop(): Promise<void>;
}

function kubeFor(cfg: DpuConfig, o: DpuOverrides, logger: Logger): KubeConnection | undefined {
  if (o.kube !== undefined) return o.kube ?? undefined;
  if (!cfg.kubeconfig && !cfg.inCluster) {
    logger.warn(
      "no Kubernetes access: volumes asking for DH-HMAC-CHAP are refused (their Secrets cannot be read)",
    );
    return undefined;
  }
  return connect(cfg.kubeconfig);
}

/**
 * Starts the plugin. The socket is served at once (a stale one from a crash is replaced, a live
 * one is "precondition"); Probe answers ready=false until SNAP has answered once. With NODE_NAME
 * and a CSI socket, serves NodeGetInfo there for kubelet (the host NQN in the node ID). Rejects when the host NQN cannot be read or the socket not bound.
 */
export async function runDpu(cfg: DpuConfig, logger: Logger, o: DpuOverrides = {}): Promise<RunningDpu> {
  const clock = o.clock ?? realClock;
  const hostNqn = cfg.hostNqn ?? (await readHostNqn(hostFs("/"), cfg.hostNqnFile));
  const kube = kubeFor(cfg, o, logger);
  const client = new SpdkClient({
    socketPath: cfg.snapSocketPath,
    logger,
    clock,
    callTimeoutMs: cfg.snapTimeoutMs,
  });
  const rpc = o.wrapSnapRpc ? o.wrapSnapRpc(client) : client;
  const methods = new SpdkMethods(rpc);
  const snap = new SnapRpc(rpc);
  const fileStore = fileDeviceStore(cfg.stateDir);
  const store = o.wrapStore ? o.wrapStore(fileStore) : fileStore;
  // The host NQN reaches ControllerPublish in the node ID kubelet stores in CSINode (served on the
  // CSI socket below); the plugin writes nothing on its Node.
  if (!cfg.nodeName || !cfg.csiSocketPath) {
    logger.warn(
      "no CSI node socket (needs NODE_NAME and DISTORT_DPU_CSI_SOCKET): kubelet cannot record this DPU's host NQN in CSINode, so ControllerPublish refuses this node",
      { hostNqn },
    );
  }
  const readiness = new Readiness({ methods, store, logger, clock });
  const secrets =
    o.secrets === undefined ? (kube ? kubeSecretReader(kube) : undefined) : (o.secrets ?? undefined);
  const devices = new DeviceManager({
    methods,
    snap,
    store,
    keyFiles: dirKeyFiles(cfg.keyDir),
    ...(secrets ? { secrets } : {}),
    secretNamespace: cfg.secretNamespace,
    blockDevices: o.blockDevices ?? snapNbdBlockDevices(snap),
    filesystem:
      o.filesystem ??
      hostFilesystem({ exec: o.exec ?? hostExec, fs: hostFs("/"), commandTimeoutMs: cfg.commandTimeoutMs }),
    mountRoot: cfg.mountRoot,
    hostNqn,
    trtypes: cfg.trtypes,
    defaultFsType: cfg.defaultFsType,
    logger,
  });

  const registry = new Registry();
  const measure = callMetrics(registry, "distort_dpu", "DPF plugin");
  const manifest: Record<string, string> = {
    pluginName: cfg.pluginName,
    snapProvider: cfg.snapProvider,
    hostNqn,
    volumeModes: "Block,Filesystem",
    transports: `tcp=${cfg.trtypes.tcp},rdma=${cfg.trtypes.rdma}`,
    authentication: "DH-HMAC-CHAP",
    multipath: "true",
  };
  const server = await serveGrpc({
    socketPath: cfg.socketPath,
    services: [
      register(
        IdentityService,
        measure(createIdentityService({ vendorVersion: pkg.version, manifest, readiness })),
      ),
      register(
        StoragePluginService,
        measure(createStoragePluginService({ devices, snapProvider: cfg.snapProvider })),
      ),
    ],
    logger,
    shutdownGraceMs: cfg.shutdownGraceMs,
  });
  let csiServer: Awaited<ReturnType<typeof serveGrpc>> | undefined;
  if (cfg.nodeName && cfg.csiSocketPath) {
    const info = createCsiNodeInfo({
      nodeName: cfg.nodeName,
      hostNqn,
      vendorVersion: pkg.version,
      notReady: async () => {
        const r = await readiness
          .check()
          .catch((err: unknown) => ({ ready: false, reason: errorMessage(err) }));
        return r.ready ? undefined : (r.reason ?? "not ready");
      },
    });
    try {
      csiServer = await serveGrpc({
        socketPath: cfg.csiSocketPath,
        services: [register(CsiIdentity, info.identity), register(CsiNode, info.node)],
        logger,
        shutdownGraceMs: cfg.shutdownGraceMs,
      });
    } catch (err) {
      await server.close();
      await client.close();
      throw err;
    }
  }
  let health: Awaited<ReturnType<typeof serveHealth>>;
  try {
    health = await serveHealth({
      host: cfg.health.host,
      port: cfg.health.port,
      registry,
      logger,
      healthz: async () => {
        await store.check();
        return true;
      },
      readyz: async () => {
        const r = await readiness.check();
        if (!r.ready) throw new Error(r.reason ?? "not ready");
        return true;
      },
    });
  } catch (err) {
    await csiServer?.close();
    await server.close();
    await client.close();
    throw err;
  }
  const initAbort = new AbortController();
  const initialised = readiness.initialise(initAbort.signal).catch(() => {});
  logger.info("dpu plugin running", {
    socket: cfg.socketPath,
    snap: cfg.snapSocketPath,
    hostNqn,
    health: health.url,
  });

  let stopping: Promise<void> | undefined;
  return {
    address: server.address,
    healthPort: health.port,
    readiness,
    initialised,
    stop() {
      stopping ??= (async () => {
        initAbort.abort();
        await csiServer?.close();
        await server.close();
        await health.close();
        await client.close();
      })();
      return stopping;
    },
  };
}

if (import.meta.main) {
  let cfg: DpuConfig;
  try {
    cfg = parseDpuConfig(process.env);
  } catch (err) {
    process.stderr.write(`distort-dpu: ${errorMessage(err)}\n${USAGE}\n`);
    process.exit(2);
  }
  const logger = createLogger({
    level: cfg.logLevel,
    fields: { component: "dpu", plugin: cfg.pluginName, ...(cfg.nodeName ? { node: cfg.nodeName } : {}) },
  });
  let running: RunningDpu;
  try {
    running = await runDpu(cfg, logger);
  } catch (err) {
    logger.error("dpu plugin failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
  stopOnSignals(logger, "dpu plugin", () => running.stop());
}
