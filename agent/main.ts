// The storage-node agent process: wires configuration, the Kubernetes connection, the SPDK client
// and the kernel target into discovery + reporter and the partition, attachment and snapshot
// reconcilers (one ControllerManager over one cache per kind), and serves /healthz, /readyz and
// /metrics. Stops cleanly on SIGTERM.
import { readFile } from "node:fs/promises";
import { hostname } from "node:os";
import { kinds, type NVMePartition } from "../api/index.ts";
import { realClock } from "../lib/clock.ts";
import { Mutex } from "../lib/concurrency/mutex.ts";
import { errorMessage, StorageError } from "../lib/errors.ts";
import { type Exec, hostExec, runChecked } from "../lib/exec.ts";
import { type HostFs, hostFs } from "../lib/fs.ts";
import { serveHealth } from "../lib/health-server.ts";
import { dirKeyFiles } from "../lib/key-files.ts";
import { CacheSet } from "../lib/kube/cache-set.ts";
import { connect } from "../lib/kube/connection.ts";
import { ControllerManager } from "../lib/kube/controller-manager.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { kubeSecretReader } from "../lib/kube/secrets.ts";
import { createLogger, type Logger } from "../lib/log.ts";
import { Registry } from "../lib/metrics.ts";
import { logPreflight } from "../lib/preflight/log-report.ts";
import { runPreflight } from "../lib/preflight/preflight.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { bunProcessRunner, findSetpriv, hostSocketFiles, procInspector } from "../lib/spdk/process-runner.ts";
import { SpdkReadCache } from "../lib/spdk/read-cache.ts";
import { NvmfTgtSupervisor } from "../lib/spdk/supervisor.ts";
import { TargetFacts } from "../lib/spdk/target-facts.ts";
import { AttachmentController } from "./attachments/controller.ts";
import { KernelTarget } from "./backends/kernel/kernel-target.ts";
import { SpdkTarget } from "./backends/spdk/target.ts";
import type { BackendName, TargetBackend, VolumeManager, VolumeManagerName } from "./backends/types.ts";
import { agentTransform } from "./caches.ts";
import { type AgentConfig, parseAgentConfig } from "./config.ts";
import { discoverDevices } from "./discovery/discover.ts";
import { hostNetworkSource } from "./discovery/network-source.ts";
import { portalsInNetworks } from "./discovery/portal-networks.ts";
import { type EndpointResult, findRdmaEndpoint } from "./discovery/rdma-endpoint.ts";
import { registerAgentMetrics, runNodeMetrics } from "./metrics/node-metrics.ts";
import { SpdkStatsCollector } from "./metrics/spdk-stats.ts";
import type { NexusSpdk } from "./nexus/assembler.ts";
import { PartitionController, type Step } from "./partitions/controller.ts";
import { runPeriodically } from "./reporter/periodic.ts";
import { Reporter } from "./reporter/reporter.ts";
import { SnapshotController } from "./snapshots/controller.ts";
import { applySpaceReport, type SpaceMemory } from "./space/space-report.ts";
import { agentPreflightPlan, assertUsable, fatalChecks } from "./startup-preflight.ts";
import { PartedVolumeManager } from "./volumes/parted/parted-volume-manager.ts";
import { SpdkBlockMaps } from "./volumes/spdk-lvol/block-map.ts";
import { SpdkLvolVolumeManager } from "./volumes/spdk-lvol/manager.ts";
import { buildLease, type FenceRecord, parseFenceRecord, watchdogPaths } from "./watchdog/lease.ts";
import { LeaseWriter } from "./watchdog/lease-writer.ts";
import { runTargetWatchdog, TARGET_WATCHDOG_MODE } from "./watchdog/main.ts";

export interface RunningAgent {
  healthPort: number;
  stop(): Promise<void>;
}

/** Starts every part of the agent; resolves once the caches are synced and the loops run. */
export interface AgentHooks {
  /** Runs after every partition reconcile step (tests inject faults here). */
  afterStep?(step: Step, key: string): void | Promise<void>;
  /**
   * The host's filesystem (sysfs, /dev, configfs); default hostFs(cfg.hostRoot). The lab passes a
   * simulated configfs whose writes reach its simulated nvmet.
   */
  hostFs?: HostFs;
  /** Runs host commands (parted, modprobe, lsblk...); default hostExec. */
  exec?: Exec;
  /**
   * The target backends one controller drives; default the shared ones. Tests wrap them to pause
   * one controller's calls at a chosen point while the other runs.
   */
  controllerBackends?(
    controller: "partitions" | "attachments",
    backends: Partial<Record<BackendName, TargetBackend>>,
  ): Partial<Record<BackendName, TargetBackend>>;
}

export async function runAgent(
  cfg: AgentConfig,
  logger: Logger,
  hooks: AgentHooks = {},
): Promise<RunningAgent> {
  const clock = realClock;
  const registry = new Registry();
  const agentMetrics = registerAgentMetrics(registry);
  const conn = connect(cfg.kubeconfig);
  const fs = hooks.hostFs ?? hostFs(cfg.hostRoot);
  const exec = hooks.exec ?? hostExec;
  const events = new EventRecorder(conn, {
    controller: "storage.distort.io/agent",
    instance: `${cfg.nodeName}/${hostname()}`,
    logger,
  });

  // Preflight before anything is started: its plan counts the partitions placed on this node.
  const placed = await listPlaced(conn, cfg).catch((err: unknown) => {
    logger.warn("preflight: cannot list this node's partitions; hugepage estimate for 0 volumes", {
      err: errorMessage(err),
    });
    return [];
  });
  const preflight = await runPreflight(agentPreflightPlan(cfg, placed), { fs, exec: hostExec });
  logPreflight(preflight, logger.with({ component: "preflight" }));
  assertUsable(fatalChecks(preflight, cfg));

  const backends: Partial<Record<BackendName, TargetBackend>> = {};
  const volumeManagers: Partial<Record<VolumeManagerName, VolumeManager>> = {};
  let spdk: SpdkClient | undefined;
  // What the SPDK backend and volume manager verified on the running target, shared so that a
  // target restart forgets all of it at once.
  let facts: TargetFacts | undefined;
  let reads: SpdkReadCache | undefined;
  // The calls a replicated volume's serving node makes (copies attached, raid1 built).
  let nexusSpdk: NexusSpdk | undefined;
  // Changed-block records read live counts: past the read cache.
  let spdkMethods: SpdkMethods | undefined;
  const snapshotCopies = new Mutex();
  if (cfg.backends.includes("spdk")) {
    spdk = new SpdkClient({ socketPath: cfg.spdkSocket, logger: logger.with({ component: "spdk" }), clock });
    // Every backend read goes through the read cache: a verify sweep or a replay lists the
    // target once instead of reading each export's subsystem and bdev on its own.
    reads = new SpdkReadCache({ rpc: spdk, clock });
    spdkMethods = new SpdkMethods(spdk);
    facts = new TargetFacts({ rpc: reads, clock });
    const methods = new SpdkMethods(reads);
    nexusSpdk = methods;
    const binder = {
      async bind(pciAddress: string) {
        if (!cfg.spdkSetup) return;
        await runChecked(exec, [cfg.spdkSetup], { env: { PCI_ALLOWED: pciAddress }, timeoutMs: 120_000 });
      },
    };
    backends.spdk = new SpdkTarget({
      methods,
      rpc: reads,
      binder,
      keyFiles: dirKeyFiles(cfg.keyDir),
      tlsSaltFixBackported: cfg.spdkTlsSaltFix,
      logger: logger.with({ backend: "spdk" }),
      facts,
      reads,
    });
    volumeManagers["spdk-lvol"] = new SpdkLvolVolumeManager({
      methods,
      rpc: reads,
      snapshotCopies,
      logger,
      facts,
      reads,
    });
  }
  if (cfg.backends.includes("kernel")) {
    backends.kernel = new KernelTarget({ fs, exec: exec, log: logger.with({ backend: "kernel" }) });
    volumeManagers.parted = new PartedVolumeManager({ exec: exec, fs, clock, log: logger });
  }

  const secrets = kubeSecretReader(conn);
  const network = hostNetworkSource(fs, exec);
  const portalAddresses = cfg.portalNetworks
    ? await portalsInNetworks(cfg.portalNetworks, exec, logger)
    : cfg.portalAddresses;
  const endpoint = async (): Promise<EndpointResult> => {
    const configured = portalAddresses?.[0];
    if (configured) {
      return {
        ok: true,
        endpoint: {
          ip: configured,
          device: "configured",
          port: 1,
          netdev: "configured",
        },
      };
    }
    return findRdmaEndpoint(network);
  };

  // Fault injection (DISTORT_FAULT_CRASH_AFTER="<step>" or "<step>@<namespace/name>"): a real
  // crash, no cleanup, so restart tests see exactly what a killed agent leaves behind.
  const crash = async (step: Step, key: string) => {
    await hooks.afterStep?.(step, key);
    const [wantStep, wantKey] = (cfg.crashAfter ?? "").split("@");
    if (wantStep === step && (!wantKey || wantKey === key)) {
      logger.warn("fault injection: crashing", { step, key });
      process.kill(process.pid, "SIGKILL");
    }
  };
  const storageNodes = new ResourceClient(conn, kinds.RDMAStorageNode);
  // One cache per kind for all three controllers (and the reporter's device list).
  const controllers = new ControllerManager({
    caches: new CacheSet(conn, { logger, transform: agentTransform }),
    logger,
    clock,
    registry,
  });
  let reporterRef: Reporter | undefined;
  // The target watchdog (agent/watchdog/) beside nvmf_tgt: what it fenced while this agent was
  // away stays fenced until a heartbeat goes through; the lease it watches is renewed below.
  const watchdogFiles = spdk ? watchdogPaths(cfg.spdkSocket) : undefined;
  const fencedAtStart = watchdogFiles ? await readFenceRecord(watchdogFiles.record, logger) : new Map();
  const leaseWriter = watchdogFiles
    ? new LeaseWriter({ path: watchdogFiles.lease, logger: logger.with({ component: "lease" }) })
    : undefined;
  let renewLease = async (_heartbeatMs?: number): Promise<void> => {};
  const partitions = new PartitionController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    backends: hooks.controllerBackends?.("partitions", backends) ?? backends,
    volumeManagers,
    portal: async () => {
      const r = await endpoint();
      return r.ok ? { address: r.endpoint.ip, port: cfg.portalPort } : undefined;
    },
    morePortalAddresses: portalAddresses?.slice(1) ?? [],
    logger: logger.with({ controller: "partitions" }),
    clock,
    events,
    verifyPeriodMs: cfg.verifyPeriodMs,
    secrets,
    afterStep: crash,
    nodeObject: () => storageNodes.get(cfg.nodeName, cfg.namespace),
    ...(nexusSpdk ? { nexusSpdk } : {}),
    nexusDegradeAfterMs: cfg.nexusDegradeAfterMs,
    // The reporter is made below; its heartbeats are what the manager's failover bound counts.
    lastHeartbeatMs: () => reporterRef?.lastHeartbeatMs(),
    lostDriveReleaseAfterMs: cfg.lostDriveReleaseAfterMs,
    fencedAtStart,
    beforeServing: () => renewLease(),
    rebuilds: {
      maxPerNode: cfg.rebuildsPerNode,
      bandwidthMbSec: cfg.rebuildBandwidthMbSec,
      needsGrant: cfg.rebuildNeedsGrant,
      metrics: agentMetrics.rebuild,
    },
  });
  const attachmentController = new AttachmentController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    backends: hooks.controllerBackends?.("attachments", backends) ?? backends,
    logger: logger.with({ controller: "attachments" }),
    clock,
    events,
    secrets,
  });
  const blockMaps =
    spdkMethods && cfg.blockMetadataDir
      ? new SpdkBlockMaps({
          methods: spdkMethods,
          scratchDir: cfg.blockMetadataDir,
          copies: snapshotCopies,
          clock,
          logger: logger.with({ component: "block-maps" }),
        })
      : undefined;
  if (spdkMethods && !blockMaps)
    logger.info("changed-block tracking is off: DISTORT_BLOCK_METADATA_DIR is not set");
  new SnapshotController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    lvols: volumeManagers["spdk-lvol"] as SpdkLvolVolumeManager | undefined,
    blockMaps,
    logger: logger.with({ controller: "snapshots" }),
    clock,
    events,
  });
  const spdkSource = spdk
    ? {
        listControllers: () => (spdk as SpdkClient).call("bdev_nvme_get_controllers"),
        getBdevs: () => (spdk as SpdkClient).call("bdev_get_bdevs"),
        getVersion: () => (spdk as SpdkClient).call("spdk_get_version"),
      }
    : undefined;
  const reporter = new Reporter(
    {
      devices: new ResourceClient(conn, kinds.NVMeDevice),
      listDevices: async () => partitions.devices.list(),
      storageNodes,
      discover: () =>
        discoverDevices({ fs, exec: exec, spdk: spdkSource, logger }, { filter: cfg.deviceFilter }),
      findEndpoint: endpoint,
      exportCount: async () =>
        partitions.partitions.list().filter((p) => p.status?.state === "Exported").length,
      servedTransports: async () =>
        partitions.partitions
          .list()
          .filter((p) => p.status?.state === "Exported" && p.status.transport !== undefined)
          .map((p) => p.status?.transport as string),
      events,
      clock,
      logger: logger.with({ component: "reporter" }),
      afterHeartbeat: (heartbeatMs) => void renewLease(heartbeatMs),
    },
    {
      nodeName: cfg.nodeName,
      namespace: cfg.namespace,
      periodMs: cfg.reportPeriodMs,
      // A node serving one backend locks its drives to it, so placement keeps the other one away.
      ...(cfg.backends.length === 1 ? { onlyBackend: cfg.backends[0] } : {}),
    },
  );
  reporterRef = reporter;
  renewLease = async (heartbeatMs = reporter.lastHeartbeatMs()) => {
    if (!leaseWriter || heartbeatMs === undefined) return;
    await leaseWriter.write(
      buildLease({ node: cfg.nodeName, heartbeatMs, serving: partitions.servingNexus() }),
    );
  };

  // nvmf_tgt: started and kept alive by the agent when a command is configured; adopted, initialised
  // and watched when it runs in a container of its own (external); else adopted as is. A restarted
  // target has lost every subsystem: all partitions are re-verified at once.
  let supervisor: NvmfTgtSupervisor | undefined;
  if (spdk && (cfg.nvmfTgtCommand.length > 0 || cfg.nvmfTgtExternal)) {
    supervisor = new NvmfTgtSupervisor({
      command: cfg.nvmfTgtCommand,
      launch: !cfg.nvmfTgtExternal,
      socketPath: cfg.spdkSocket,
      coreMask: cfg.coreMask,
      extraArgs: cfg.spdkMemSizeMb === undefined ? [] : ["-s", String(cfg.spdkMemSizeMb)],
      startupOptions: { maxSubsystems: cfg.spdkMaxSubsystems },
      openClient: () => new SpdkClient({ socketPath: cfg.spdkSocket, logger, clock }),
      runner: bunProcessRunner({ setprivPath: findSetpriv() }),
      inspector: procInspector(hostFs("/")),
      sockets: hostSocketFiles(),
      clock,
      logger: logger.with({ component: "nvmf_tgt" }),
      metrics: registry,
      onRestart: () => {
        facts?.forget();
        reads?.forget();
        partitions.targetRestarted("spdk");
      },
    });
    if (cfg.nvmfTgtExternal) {
      // The target's own Pod may start after this one: wait for it a while, then let the
      // supervisor's loop adopt it whenever it comes (exports are verified then).
      const deadline = Date.now() + 60_000;
      for (;;) {
        try {
          await supervisor.ensureRunning();
          break;
        } catch (err) {
          // Another core mask: waiting does not change it (the message says what to do).
          if (err instanceof StorageError && err.kind === "precondition") throw err;
          if (Date.now() >= deadline) {
            logger.warn("nvmf_tgt not up yet; going on and adopting it when it answers", { err });
            break;
          }
          await Bun.sleep(500);
        }
      }
    } else {
      await supervisor.ensureRunning();
    }
    supervisor.start();
  }

  await controllers.start();
  const stopReporter = new AbortController();
  const reporting = reporter.run(stopReporter.signal);
  const heartbeats = reporter.runHeartbeats(stopReporter.signal, cfg.heartbeatPeriodMs);
  // A serving node whose heartbeats stop going through fences itself (agent/nexus/self-fence.ts).
  const recordSeen: { bad?: string } = {};
  const selfFencing = runPeriodically(clock, 1000, stopReporter.signal, async () => {
    try {
      // A fence the target watchdog set while this agent runs (its lease went stale).
      if (watchdogFiles) {
        const record = await readFenceRecordFile(watchdogFiles.record, logger, recordSeen);
        if (record) partitions.noteWatchdogFence(record);
      }
      await partitions.checkSelfFence();
    } catch (err) {
      logger.error("self-fence check failed", { err: errorMessage(err) });
    }
  });
  const spaceMemory: SpaceMemory = new Map();
  const metricsLoop = runNodeMetrics(
    {
      metrics: agentMetrics,
      spdk: spdk
        ? new SpdkStatsCollector({
            rpc: spdk,
            metrics: agentMetrics.spdk,
            volumes: () =>
              partitions.partitions.list().map((p) => ({
                namespace: p.metadata.namespace ?? "",
                partition: p.metadata.name,
                state: p.status?.state ?? "Pending",
                bdev: p.spec.backend === "spdk" ? p.status?.backendPath : undefined,
                nqn: p.status?.nqn,
              })),
            logger: logger.with({ component: "metrics" }),
            now: () => clock.now(),
            onSpace: (lvstores, bdevs) =>
              applySpaceReport(
                {
                  nodeName: cfg.nodeName,
                  devices: new ResourceClient(conn, kinds.NVMeDevice),
                  partitions: new ResourceClient(conn, kinds.NVMePartition),
                  listDevices: () => partitions.devices.list(),
                  listPartitions: () => partitions.partitions.list(),
                  events,
                  now: () => clock.now(),
                  logger: logger.with({ component: "space" }),
                },
                spaceMemory,
                lvstores,
                bdevs,
              ),
          })
        : undefined,
      attachments: () => attachmentController.attachments.list(),
      partitions: () => partitions.partitions.list(),
      clock,
      periodMs: cfg.metricsPeriodMs,
    },
    stopReporter.signal,
  );
  const health = await serveHealth({
    host: "0.0.0.0",
    port: cfg.healthPort,
    registry,
    logger,
    healthz: () => true,
    readyz: () => controllers.ready,
  });
  logger.info("agent running", { node: cfg.nodeName, backends: Object.keys(backends), health: health.port });

  return {
    healthPort: health.port,
    async stop() {
      stopReporter.abort();
      await reporting.catch(() => {});
      await heartbeats.catch(() => {});
      await selfFencing.catch(() => {});
      await metricsLoop.catch(() => {});
      await controllers.stop();
      // A managed target runs under the agent's parent-death signal, so it ends with the agent
      // in any case; stopping it here makes that orderly.
      await supervisor?.stop();
      await spdk?.close();
      await health.close();
    },
  };
}

/**
 * The target watchdog's fence record (agent/watchdog/lease.ts), as NQN -> when it fenced. A
 * missing record is none; an unreadable or malformed one is logged and read as none (the lease
 * it answered was this node's, and the volumes' own passes wait for a heartbeat regardless).
 */
async function readFenceRecord(path: string, logger: Logger): Promise<Map<string, number>> {
  const record = await readFenceRecordFile(path, logger);
  if (!record) return new Map();
  logger.warn("the target watchdog fenced exports while the agent was away", {
    fencedAtMs: record.fencedAtMs,
    nqns: record.nqns,
  });
  return new Map(record.nqns.map((n) => [n, record.fencedAtMs]));
}

/**
 * The fence record at `path`; undefined when there is none or it is unusable (logged; once per
 * text when `seen` is passed along between calls).
 */
async function readFenceRecordFile(
  path: string,
  logger: Logger,
  seen: { bad?: string } = {},
): Promise<FenceRecord | undefined> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT")
      logger.error("target watchdog's fence record unreadable", { path, err: errorMessage(err) });
    return undefined;
  }
  const r = parseFenceRecord(text);
  if ("why" in r) {
    if (seen.bad !== text)
      logger.error("target watchdog's fence record malformed; ignored", { path, why: r.why });
    seen.bad = text;
    return undefined;
  }
  return r.record;
}

/** NVMePartitions placed on this node (field selector spec.nodeName), for the preflight plan. */
async function listPlaced(conn: ReturnType<typeof connect>, cfg: AgentConfig): Promise<NVMePartition[]> {
  const k = kinds.NVMePartition;
  const path = `/apis/${k.group}/${k.version}/namespaces/${encodeURIComponent(cfg.namespace)}/${k.plural}?fieldSelector=${encodeURIComponent(`spec.nodeName=${cfg.nodeName}`)}`;
  const res = await conn.request(path);
  if (!res.ok) throw new Error(`list partitions of ${cfg.nodeName}: HTTP ${res.status}`);
  return ((await res.json()) as { items?: NVMePartition[] }).items ?? [];
}

if (import.meta.main && process.argv.includes(TARGET_WATCHDOG_MODE)) {
  // The same binary, beside nvmf_tgt in the target's Pod (agent/watchdog/main.ts).
  await runTargetWatchdog(process.env);
} else if (import.meta.main) {
  const cfg = (() => {
    try {
      return parseAgentConfig(process.env);
    } catch (err) {
      process.stderr.write(`${errorMessage(err)}\n`);
      process.exit(2);
    }
  })();
  const logger = createLogger({ level: cfg.logLevel, fields: { component: "agent", node: cfg.nodeName } });
  const agent = await runAgent(cfg, logger).catch((err: unknown) => {
    // A fatal preflight finding (or another start-up failure): one clear line, then exit 1.
    logger.error("agent failed to start", { err: errorMessage(err) });
    process.exit(1);
  });
  stopOnSignals(logger, "agent", () => agent.stop());
}
