// The whole of DISTORT on one machine, assembled from the real modules: storage nodes (simulated
// drives + emulated nvmf_tgt + agent), the manager, and CSI (controller + node services) whose
// node side reaches the exports through the simulated fabric and loop devices. Used by the
// conformance run (csi-sanity) and the lab; every part is the production code path except the
// hardware.

import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { parseAgentConfig } from "../../agent/config.ts";
import { type RunningAgent, runAgent } from "../../agent/main.ts";
import { kinds, type NVMeDevice, type NVMeDeviceClaim } from "../../api/index.ts";
import { parseCsiConfig } from "../../csi/config.ts";
import { type RunningCsi, runCsi } from "../../csi/main.ts";
import { realClock } from "../../lib/clock.ts";
import { StorageError } from "../../lib/errors.ts";
import { hostExec } from "../../lib/exec.ts";
import { connect, type KubeConnection } from "../../lib/kube/connection.ts";
import { EventRecorder } from "../../lib/kube/events.ts";
import { kubeError, ResourceClient } from "../../lib/kube/resource.ts";
import type { Logger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import { SpdkClient } from "../../lib/spdk/client.ts";
import { parseConfig as parseManagerConfig } from "../../manager/config.ts";
import { type RunningManager, startManager } from "../../manager/manager.ts";
import { installCrds } from "../cluster/crds.ts";
import { type NamespaceBackingResolver, spdkRpcBackingResolver } from "../sim/fabric/namespace-backing.ts";
import { SimNvmeInitiator } from "../sim/fabric/sim-initiator.ts";
import { createFabric } from "../sim/spdk/fabric.ts";
import { type SimNodeDrive, type SimStorageNode, startSimStorageNode } from "./storage-node.ts";

/**
 * NVMe-oF reaches across nodes, so topology is the fabric a node sits on, not the node itself:
 * consumer Nodes and storage nodes (their RDMAStorageNode) carry the same fabric label.
 */
export const FABRIC_LABEL = "topology.storage.distort.io/fabric";

export interface StackOptions {
  kubeconfigPath: string;
  storageNodes: { name: string; drives: SimNodeDrive[] }[];
  /** Nodes that consume volumes: each runs the CSI node service. */
  consumerNodes: string[];
  /** Serve the CSI controller in the same process as the first consumer node (mode "all"). */
  csiAllInOne?: boolean;
  namespace?: string;
  logger: Logger;
  /** Short report and verification periods make the lab converge quickly. */
  fast?: boolean;
}

export interface Stack {
  conn: KubeConnection;
  namespace: string;
  dir: string;
  storage: SimStorageNode[];
  agents: RunningAgent[];
  manager: RunningManager;
  /** CSI per consumer node name; the controller lives in the first one's process. */
  csi: Map<string, RunningCsi>;
  devices(): Promise<NVMeDevice[]>;
  stop(): Promise<void>;
}

async function ensure(p: Promise<unknown>): Promise<void> {
  try {
    await p;
  } catch (err) {
    if (kubeError(err, "create").kind !== "already-exists") throw err;
  }
}

/** Resolves a namespace's bytes by asking every storage node's target until one exports it. */
function multiTargetResolver(
  nodes: SimStorageNode[],
  logger: Logger,
): { resolve: NamespaceBackingResolver; close(): Promise<void> } {
  const clients = nodes.map((n) => new SpdkClient({ socketPath: n.spdkSocket, logger }));
  const resolvers = clients.map((c) => spdkRpcBackingResolver(c));
  return {
    async resolve(subnqn, ns) {
      let last: unknown;
      for (const r of resolvers) {
        try {
          return await r(subnqn, ns);
        } catch (err) {
          last = err;
          if (!(err instanceof StorageError && err.kind === "not-found")) throw err;
        }
      }
      throw last ?? new StorageError("not-found", `no target exports ${subnqn}`);
    },
    async close() {
      await Promise.all(clients.map((c) => c.close()));
    },
  };
}

export async function startStack(o: StackOptions): Promise<Stack> {
  const namespace = o.namespace ?? "distort-system";
  const dir = mkdtempSync(join(tmpdir(), "distort-stack-"));
  const conn = connect(o.kubeconfigPath);
  const log = o.logger;
  const stops: (() => Promise<void>)[] = [];
  const stop = async () => {
    for (const s of stops.reverse())
      await s().catch((err) => log.warn("stack stop step failed", { err: String(err) }));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await installCrds(conn);
    const core = conn.api(k8s.CoreV1Api);
    await ensure(core.createNamespace({ body: { metadata: { name: namespace } } }));
    for (const name of [...o.storageNodes.map((n) => n.name), ...o.consumerNodes]) {
      await ensure(
        core.createNode({
          body: {
            metadata: {
              name,
              labels: { "kubernetes.io/hostname": name, [FABRIC_LABEL]: "lab" },
              annotations: { "volumes.kubernetes.io/controller-managed-attach-detach": "true" },
            },
          },
        }),
      );
    }

    const fabric = createFabric(join(dir, "fabric"));
    const storage: SimStorageNode[] = [];
    const agents: RunningAgent[] = [];
    for (const n of o.storageNodes) {
      const node = await startSimStorageNode({ nodeName: n.name, drives: n.drives, fabric });
      stops.push(() => node.close());
      storage.push(node);
      const env = node.agentEnv(o.kubeconfigPath, namespace, {
        DISTORT_LOG_LEVEL: "warn",
        ...(o.fast ? { DISTORT_REPORT_PERIOD_MS: "1000", DISTORT_VERIFY_PERIOD_MS: "5000" } : {}),
      });
      const agent = await runAgent(parseAgentConfig(env), log.with({ component: "agent", node: n.name }));
      stops.push(() => agent.stop());
      agents.push(agent);
    }

    const managerConfig = parseManagerConfig(
      {
        DISTORT_NAMESPACE: namespace,
        DISTORT_LEADER_ELECT: "false",
        DISTORT_HEALTH_PORT: "0",
        DISTORT_LOG_LEVEL: "warn",
        ...(o.fast
          ? { DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "200", DISTORT_PLACEMENT_BACKOFF_MAX_MS: "2000" }
          : {}),
      },
      { hostname: "lab", randomSuffix: randomUUID().slice(0, 8) },
    );
    const manager = await startManager({
      conn,
      config: managerConfig,
      clock: realClock,
      logger: log.with({ component: "manager" }),
      registry: new Registry(),
      events: new EventRecorder(conn, {
        controller: "storage.distort.io/manager",
        instance: "lab",
        logger: log,
      }),
    });
    stops.push(() => manager.stop());

    // Claim every drive the agents report (what an administrator does once per drive).
    const devClient = new ResourceClient(conn, kinds.NVMeDevice);
    const claims = new ResourceClient(conn, kinds.NVMeDeviceClaim);
    const want = o.storageNodes.flatMap((n) => n.drives.map((d) => d.serial));
    const deadline = Date.now() + 30_000;
    let devices: NVMeDevice[] = [];
    while (
      (devices = (await devClient.list()).items.filter((d) => want.includes(d.spec.serial))).length <
      want.length
    ) {
      if (Date.now() > deadline)
        throw new Error(`only ${devices.length} of ${want.length} drives were reported`);
      await Bun.sleep(100);
    }
    const storageNodes = new ResourceClient(conn, kinds.RDMAStorageNode);
    for (const n of o.storageNodes) {
      while (!(await storageNodes.get(n.name, namespace))) {
        if (Date.now() > deadline) throw new Error(`storage node ${n.name} never reported`);
        await Bun.sleep(100);
      }
      await storageNodes.mergePatch(n.name, namespace, { metadata: { labels: { [FABRIC_LABEL]: "lab" } } });
    }
    for (const d of devices) {
      await ensure(
        claims.create({
          apiVersion: "storage.distort.io/v1alpha1",
          kind: "NVMeDeviceClaim",
          metadata: { name: `drive-${d.spec.serial.toLowerCase()}`.slice(0, 63), namespace },
          spec: { serial: d.spec.serial, nodeName: d.spec.nodeName },
        } as NVMeDeviceClaim),
      );
    }

    const resolver = multiTargetResolver(storage, log);
    stops.push(() => resolver.close());
    const csi = new Map<string, RunningCsi>();
    for (const [i, nodeName] of o.consumerNodes.entries()) {
      const root = join(dir, "consumers", nodeName);
      mkdirSync(join(root, "etc", "nvme"), { recursive: true });
      writeFileSync(
        join(root, "etc", "nvme", "hostnqn"),
        `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}\n`,
      );
      const mode = o.csiAllInOne && i === 0 ? "all" : "node";
      const cfg = parseCsiConfig(
        [
          `--endpoint=unix://${join(root, "csi.sock")}`,
          `--mode=${mode}`,
          `--node-id=${nodeName}`,
          `--kubeconfig=${o.kubeconfigPath}`,
          `--namespace=${namespace}`,
          "--health-port=0",
          `--state-dir=${join(root, "state")}`,
          `--host-root=${root}`,
          `--topology-keys=${FABRIC_LABEL}`,
          "--log-level=warn",
        ],
        {},
      );
      const initiator = new SimNvmeInitiator({
        fabric,
        stateDir: join(root, "initiator"),
        exec: hostExec,
        backing: resolver.resolve,
        logger: log.with({ component: "initiator", node: nodeName }),
      });
      const running = await runCsi(cfg, log.with({ component: "csi", node: nodeName }), {
        conn,
        node: { initiator },
      });
      stops.push(() => running.stop());
      csi.set(nodeName, running);
    }

    return {
      conn,
      namespace,
      dir,
      storage,
      agents,
      manager,
      csi,
      devices: async () => (await devClient.list()).items,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
