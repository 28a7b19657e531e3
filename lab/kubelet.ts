// The lab's kubelet stand-in: what kubelet does for CSI volumes and nothing else. Registers the
// Node, CSINode and Lease from the driver's NodeGetInfo, runs the Pods bound to the node with the
// lab workload as their container, and stages/publishes their volumes through the driver's socket.
import * as k8s from "@kubernetes/client-node";
import { Identity, Node, NodeServiceCapability_RPC_Type as RpcType } from "../gen/csi/v1/csi_pb.ts";
import { errorMessage, StorageError } from "../lib/errors.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { WatchCache } from "../lib/kube/cache.ts";
import { connect } from "../lib/kube/connection.ts";
import { objectKey, ResourceClient, type ResourceKind } from "../lib/kube/resource.ts";
import { createLogger, type Level, type Logger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { type DriverInfo, NodeAgent } from "./kubelet/node-agent.ts";
import { type PodObject, PodSchema } from "./kubelet/pod-status.ts";
import { PodWorker, WantedVolumes, type WorkerContext } from "./kubelet/pod-worker.ts";
import { VolumeManager } from "./kubelet/volume-manager.ts";

/** How to run one node's kubelet stand-in; the timings default to kubelet's own. */
export interface KubeletOptions {
  kubeconfigPath: string;
  nodeName: string;
  /** The CSI driver's node socket, "unix:///path/csi.sock". */
  csiEndpoint: string;
  /** kubelet's root directory for this node, e.g. <labNodeRoot>/var/lib/kubelet. */
  rootDir: string;
  /** Extra Node labels. */
  labels?: Record<string, string>;
  logger: Logger;
  /** How long to wait for the driver socket to answer. Default 120 s. */
  pluginWaitMs?: number;
  /** Lease renewal period. Default 10 s. */
  leaseRenewMs?: number;
  /** Ready heartbeat period. Default 40 s. */
  heartbeatMs?: number;
  /** Poll period while a Pod waits for its claim or attachment. Default 500 ms. */
  pollMs?: number;
  /** Re-check period of running Pods (online expansion) and of the unstage sweep. Default 2 s. */
  resyncMs?: number;
  /** SIGTERM-to-SIGKILL grace for workloads. Default 5 s. */
  killGraceMs?: number;
}

/** A started stand-in. */
export interface RunningKubelet {
  /** The driver name the plugin reported (PVs of other drivers are refused). */
  readonly driver: string;
  /**
   * Stops watching and kills the workloads (SIGTERM, then SIGKILL) without recording anything
   * about them; staged and published volumes stay, as when kubelet stops. Idempotent.
   */
  stop(): Promise<void>;
}

/** Pods in the watch cache: core API paths (the cache's client only builds the collection path). */
class PodClient extends ResourceClient<PodObject> {
  override collectionPath(namespace?: string): string {
    return namespace ? `/api/v1/namespaces/${namespace}/pods` : "/api/v1/pods";
  }
}

const POD_KIND: ResourceKind<PodObject> = {
  group: "",
  version: "v1",
  kind: "Pod",
  plural: "pods",
  scope: "Namespaced",
  schema: PodSchema,
};

/** Calls the plugin until it answers, as kubelet's plugin watcher waits for a socket. */
async function waitForPlugin(csi: GrpcJsClient, waitMs: number, log: Logger) {
  const deadline = Date.now() + waitMs;
  for (let attempt = 1; ; attempt++) {
    try {
      return await csi.unary(Identity.method.getPluginInfo, {}, { timeoutMs: 5_000 });
    } catch (err) {
      if (Date.now() > deadline)
        throw new StorageError(
          "unavailable",
          `CSI driver did not answer GetPluginInfo: ${errorMessage(err)}`,
        );
      if (attempt === 1 || attempt % 20 === 0)
        log.info("waiting for the CSI driver socket", { err: errorMessage(err) });
      await Bun.sleep(500);
    }
  }
}

/**
 * Starts the stand-in: waits for the driver socket, registers the Node, CSINode and Lease, loads
 * what an earlier instance on the same rootDir recorded, then runs every Pod bound to the node.
 * Volumes of Pods that no longer exist are unpublished and unstaged. Resolves once the Node is
 * registered and the Pod cache synced; throws when the driver or the API server refuses.
 */
export async function startKubelet(o: KubeletOptions): Promise<RunningKubelet> {
  const log = o.logger.with({ node: o.nodeName });
  const conn = connect(o.kubeconfigPath);
  const csi = new GrpcJsClient(o.csiEndpoint);
  let agent: NodeAgent | undefined;
  try {
    const info = await waitForPlugin(csi, o.pluginWaitMs ?? 120_000, log);
    const pluginCaps = await csi.unary(Identity.method.getPluginCapabilities, {});
    const nodeInfo = await csi.unary(Node.method.nodeGetInfo, {});
    const rpcs = new Set(
      (await csi.unary(Node.method.nodeGetCapabilities, {})).capabilities.flatMap((c) =>
        c.type.case === "rpc" ? [c.type.value.type] : [],
      ),
    );
    const driver: DriverInfo = {
      name: info.name,
      nodeId: nodeInfo.nodeId,
      topology: { ...(nodeInfo.accessibleTopology?.segments ?? {}) },
      maxVolumes: Number(nodeInfo.maxVolumesPerNode),
    };
    const caps = {
      stageUnstage: rpcs.has(RpcType.STAGE_UNSTAGE_VOLUME),
      expand: rpcs.has(RpcType.EXPAND_VOLUME),
    };
    log.info(`CSI driver ${driver.name} ${info.vendorVersion} found; node id ${driver.nodeId}`, {
      topology: driver.topology,
      stageUnstage: caps.stageUnstage,
      expand: caps.expand,
      pluginCapabilities: pluginCaps.capabilities.length,
    });

    const volumes = new VolumeManager({
      rootDir: o.rootDir,
      nodeName: o.nodeName,
      driver: driver.name,
      csi,
      stageUnstage: caps.stageUnstage,
    });
    await volumes.load();
    const wanted = new WantedVolumes();
    const nodeAgent = new NodeAgent({
      conn,
      nodeName: o.nodeName,
      rootDir: o.rootDir,
      labels: o.labels ?? {},
      driver,
      logger: log,
      ...(o.leaseRenewMs ? { leaseRenewMs: o.leaseRenewMs } : {}),
      ...(o.heartbeatMs ? { heartbeatMs: o.heartbeatMs } : {}),
      volumesInUse: () => [...wanted.names(), ...volumes.inUseNames()],
    });
    agent = nodeAgent;
    await nodeAgent.register();
    nodeAgent.start();

    let stopping = false;
    const workers = new Map<string, PodWorker>();
    const pods = new WatchCache(new PodClient(conn, POD_KIND), {
      fieldSelector: `spec.nodeName=${o.nodeName}`,
      logger: log,
    });
    const resyncMs = o.resyncMs ?? 2_000;
    const ctx: WorkerContext = {
      nodeName: o.nodeName,
      driver: driver.name,
      rootDir: o.rootDir,
      caps,
      core: conn.api(k8s.CoreV1Api),
      storage: conn.api(k8s.StorageV1Api),
      volumes,
      node: nodeAgent,
      wanted,
      logger: log,
      pollMs: o.pollMs ?? 500,
      resyncMs,
      killGraceMs: o.killGraceMs ?? 5_000,
      currentPod(key, uid) {
        const p = pods.get(key);
        return p?.metadata.uid === uid ? p : undefined;
      },
      stopping: () => stopping,
      finished: (uid) => workers.delete(uid),
    };
    const workerFor = (uid: string, key: string | undefined) => {
      let w = workers.get(uid);
      if (w === undefined) {
        w = new PodWorker(ctx, uid, key);
        workers.set(uid, w);
      }
      return w;
    };
    const onPod = (p: PodObject) => {
      const uid = p.metadata.uid;
      if (uid) workerFor(uid, objectKey(p.metadata)).kick();
    };
    pods.on({
      add: onPod,
      update: (_old, p) => onPod(p),
      // A Pod deleted for good: its worker (if any) tears down; none is started for it.
      delete: (p) => workers.get(p.metadata.uid ?? "")?.kick(),
    });
    await pods.start();

    // Pods recorded on disk that no longer exist: their volumes are torn down like any deleted Pod's.
    const live = new Set(pods.list().flatMap((p) => (p.metadata.uid ? [p.metadata.uid] : [])));
    for (const uid of await volumes.podUIDsOnDisk()) {
      if (!live.has(uid)) {
        log.info(`pod ${uid} on disk no longer exists; tearing its volumes down`);
        workerFor(uid, undefined).kick();
      }
    }

    // Staged volumes no Pod publishes or wants (a teardown cut short): unstaged on a sweep.
    let sweeping = false;
    const sweep = setInterval(() => {
      if (sweeping || stopping) return;
      sweeping = true;
      void (async () => {
        try {
          for (const rec of volumes.stagedRecords()) {
            if (wanted.isWanted(rec.volumeHandle)) continue;
            if ((await volumes.unstageIfUnused(rec.volumeHandle, (h) => wanted.isWanted(h))) === "unstaged")
              log.info(`volume ${rec.volumeHandle} unstaged (no Pod uses it)`);
          }
          await nodeAgent.flushVolumesInUse();
        } catch (err) {
          log.warn("unstage sweep failed; retrying", { err: errorMessage(err) });
        } finally {
          sweeping = false;
        }
      })();
    }, resyncMs);

    log.info(`kubelet for node ${o.nodeName} running`, { rootDir: o.rootDir, pods: pods.list().length });
    let stopped: Promise<void> | undefined;
    return {
      driver: driver.name,
      stop() {
        stopped ??= (async () => {
          stopping = true;
          clearInterval(sweep);
          await pods.stop();
          await nodeAgent.stop();
          await Promise.all([...workers.values()].map((w) => w.shutdown()));
          // Closing the channel cancels CSI calls still in flight, so their syncs end now.
          csi.close();
          await Promise.all([...workers.values()].map((w) => w.idle()));
          log.info(`kubelet for node ${o.nodeName} stopped`);
        })();
        return stopped;
      },
    };
  } catch (err) {
    await agent?.stop();
    csi.close();
    throw err;
  }
}

/** The CLI's usage line, printed with exit code 2 on a bad flag. */
export const USAGE =
  "usage: bun lab/kubelet.ts --kubeconfig=<path> --node-name=<name> --csi-endpoint=unix:///<socket> " +
  "--root-dir=<dir> [--label=k=v ...] [--log-level=debug|info|warn|error]";

/** The parsed CLI flags. */
export interface KubeletArgs {
  kubeconfig: string;
  nodeName: string;
  csiEndpoint: string;
  rootDir: string;
  labels: Record<string, string>;
  logLevel: Level;
}

/** Parses the CLI flags (--flag=value or --flag value; --label repeats). Throws an Error naming the problem. */
export function parseKubeletArgs(argv: readonly string[]): KubeletArgs {
  const single = new Map<string, string>();
  const labels: Record<string, string> = {};
  const known = new Set(["kubeconfig", "node-name", "csi-endpoint", "root-dir", "label", "log-level"]);
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const m = /^--([a-z-]+)(?:=(.*))?$/s.exec(arg);
    if (!m || !known.has(m[1] as string)) throw new Error(`unknown argument ${JSON.stringify(arg)}`);
    const name = m[1] as string;
    let value = m[2];
    if (value === undefined) {
      value = argv[++i];
      if (value === undefined) throw new Error(`--${name} needs a value`);
    }
    if (name === "label") {
      const eq = value.indexOf("=");
      if (eq <= 0) throw new Error(`--label ${JSON.stringify(value)} is not key=value`);
      labels[value.slice(0, eq)] = value.slice(eq + 1);
    } else {
      if (single.has(name)) throw new Error(`--${name} is given twice`);
      single.set(name, value);
    }
  }
  const need = (name: string) => {
    const v = single.get(name);
    if (!v) throw new Error(`--${name} is required`);
    return v;
  };
  const kubeconfig = need("kubeconfig");
  const nodeName = need("node-name");
  const csiEndpoint = need("csi-endpoint");
  if (!csiEndpoint.startsWith("unix:///")) throw new Error("--csi-endpoint must be unix:///absolute/path");
  const rootDir = need("root-dir");
  const logLevel = single.get("log-level") ?? "info";
  if (!["debug", "info", "warn", "error"].includes(logLevel))
    throw new Error("--log-level must be debug, info, warn or error");
  return { kubeconfig, nodeName, csiEndpoint, rootDir, labels, logLevel: logLevel as Level };
}

if (import.meta.main) {
  let args: KubeletArgs;
  try {
    args = parseKubeletArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`kubelet: ${errorMessage(err)}\n${USAGE}\n`);
    process.exit(2);
  }
  const logger = createLogger({ level: args.logLevel, fields: { component: "kubelet" } });
  let running: RunningKubelet;
  try {
    running = await startKubelet({
      kubeconfigPath: args.kubeconfig,
      nodeName: args.nodeName,
      csiEndpoint: args.csiEndpoint,
      rootDir: args.rootDir,
      labels: args.labels,
      logger,
    });
  } catch (err) {
    logger.error("kubelet failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
  stopOnSignals(logger, "kubelet", () => running.stop());
}
