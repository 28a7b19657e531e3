// The storage-node agent process: wires configuration, the Kubernetes connection, the SPDK client
// and the kernel target into discovery + reporter and the partition, attachment and snapshot
// reconcilers (one ControllerManager over one cache per kind), and serves /healthz, /readyz and
// /metrics. Stops cleanly on SIGTERM.
import { hostname } from "node:os";
import { kinds } from "../api/index.ts";
import { realClock } from "../lib/clock.ts";
import { errorMessage } from "../lib/errors.ts";
import { hostExec, runChecked } from "../lib/exec.ts";
import { hostFs } from "../lib/fs.ts";
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
import { stopOnSignals } from "../lib/signals.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { bunProcessRunner, findSetpriv, hostSocketFiles, procInspector } from "../lib/spdk/process-runner.ts";
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
import { type EndpointResult, findRdmaEndpoint } from "./discovery/rdma-endpoint.ts";
import { PartitionController, type Step } from "./partitions/controller.ts";
import { Reporter } from "./reporter/reporter.ts";
import { SnapshotController } from "./snapshots/controller.ts";
import { PartedVolumeManager } from "./volumes/parted/parted-volume-manager.ts";
import { SpdkLvolVolumeManager } from "./volumes/spdk-lvol/manager.ts";

export interface RunningAgent {
  healthPort: number;
  stop(): Promise<void>;
}

/** Starts every part of the agent; resolves once the caches are synced and the loops run. */
export interface AgentHooks {
  /** Runs after every partition reconcile step (tests inject faults here). */
  afterStep?(step: Step, key: string): void | Promise<void>;
}

export async function runAgent(
  cfg: AgentConfig,
  logger: Logger,
  hooks: AgentHooks = {},
): Promise<RunningAgent> {
  const clock = realClock;
  const registry = new Registry();
  const conn = connect(cfg.kubeconfig);
  const fs = hostFs(cfg.hostRoot);
  const events = new EventRecorder(conn, {
    controller: "storage.distort.io/agent",
    instance: `${cfg.nodeName}/${hostname()}`,
    logger,
  });

  const backends: Partial<Record<BackendName, TargetBackend>> = {};
  const volumeManagers: Partial<Record<VolumeManagerName, VolumeManager>> = {};
  let spdk: SpdkClient | undefined;
  // What the SPDK backend and volume manager verified on the running target, shared so that a
  // target restart forgets all of it at once.
  let facts: TargetFacts | undefined;
  if (cfg.backends.includes("spdk")) {
    spdk = new SpdkClient({ socketPath: cfg.spdkSocket, logger: logger.with({ component: "spdk" }), clock });
    facts = new TargetFacts({ rpc: spdk, clock });
    const methods = new SpdkMethods(spdk);
    const binder = {
      async bind(pciAddress: string) {
        if (!cfg.spdkSetup) return;
        await runChecked(hostExec, [cfg.spdkSetup], { env: { PCI_ALLOWED: pciAddress }, timeoutMs: 120_000 });
      },
    };
    backends.spdk = new SpdkTarget({
      methods,
      rpc: spdk,
      binder,
      keyFiles: dirKeyFiles(cfg.keyDir),
      logger: logger.with({ backend: "spdk" }),
      facts,
    });
    volumeManagers["spdk-lvol"] = new SpdkLvolVolumeManager({
      methods,
      rpc: spdk,
      logger,
      thinProvision: cfg.thinLvols,
      facts,
    });
  }
  if (cfg.backends.includes("kernel")) {
    backends.kernel = new KernelTarget({ fs, exec: hostExec, log: logger.with({ backend: "kernel" }) });
    volumeManagers.parted = new PartedVolumeManager({ exec: hostExec, fs, clock, log: logger });
  }

  const secrets = kubeSecretReader(conn);
  const network = hostNetworkSource(fs, hostExec);
  const endpoint = async (): Promise<EndpointResult> => {
    const configured = cfg.portalAddresses?.[0];
    if (configured) {
      return {
        ok: true,
        endpoint: {
          ip: configured,
          transport: "rdma",
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
  const partitions = new PartitionController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    backends,
    volumeManagers,
    portal: async () => {
      const r = await endpoint();
      return r.ok ? { address: r.endpoint.ip, port: cfg.portalPort } : undefined;
    },
    morePortalAddresses: cfg.portalAddresses?.slice(1) ?? [],
    logger: logger.with({ controller: "partitions" }),
    clock,
    events,
    verifyPeriodMs: cfg.verifyPeriodMs,
    secrets,
    afterStep: crash,
    nodeObject: () => storageNodes.get(cfg.nodeName, cfg.namespace),
  });
  new AttachmentController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    backends,
    logger: logger.with({ controller: "attachments" }),
    clock,
    events,
    secrets,
  });
  new SnapshotController({
    conn,
    manager: controllers,
    nodeName: cfg.nodeName,
    namespace: cfg.namespace,
    lvols: volumeManagers["spdk-lvol"] as SpdkLvolVolumeManager | undefined,
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
        discoverDevices({ fs, exec: hostExec, spdk: spdkSource, logger }, { filter: cfg.deviceFilter }),
      findEndpoint: endpoint,
      exportCount: async () =>
        partitions.partitions.list().filter((p) => p.status?.state === "Exported").length,
      events,
      clock,
      logger: logger.with({ component: "reporter" }),
    },
    { nodeName: cfg.nodeName, namespace: cfg.namespace, periodMs: cfg.reportPeriodMs },
  );

  // nvmf_tgt: started and kept alive by the agent when a command is configured, else adopted as is.
  // A restarted target has lost every subsystem: all partitions are re-verified at once.
  let supervisor: NvmfTgtSupervisor | undefined;
  if (spdk && cfg.nvmfTgtCommand.length > 0) {
    supervisor = new NvmfTgtSupervisor({
      command: cfg.nvmfTgtCommand,
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
        partitions.targetRestarted("spdk");
      },
    });
    await supervisor.ensureRunning();
    supervisor.start();
  }

  await controllers.start();
  const stopReporter = new AbortController();
  const reporting = reporter.run(stopReporter.signal);
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
      await controllers.stop();
      // A managed target runs under the agent's parent-death signal, so it ends with the agent
      // in any case; stopping it here makes that orderly.
      await supervisor?.stop();
      await spdk?.close();
      await health.close();
    },
  };
}

if (import.meta.main) {
  const cfg = (() => {
    try {
      return parseAgentConfig(process.env);
    } catch (err) {
      process.stderr.write(`${errorMessage(err)}\n`);
      process.exit(2);
    }
  })();
  const logger = createLogger({ level: cfg.logLevel, fields: { component: "agent", node: cfg.nodeName } });
  const agent = await runAgent(cfg, logger);
  stopOnSignals(logger, "agent", () => agent.stop());
}
