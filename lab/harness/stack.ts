// The whole of DISTORT on one machine, assembled from the real modules: storage nodes (simulated
// drives + emulated nvmf_tgt + agent), the manager, and CSI (controller + node services) whose
// node side stages volumes the host daemon shows as loop devices. Used by the conformance run
// (csi-sanity), integration tests and benches; every part is the production code path except the
// hardware. The emulated nvmf_tgt and the NVMe-oF host daemon run as processes of their own
// (lab/harness/fabric-processes.ts): every block goes through the fabric and the target, and a
// test's synchronous I/O on a mounted volume cannot block what must answer it. Each component
// talks to the API server as its own chart ServiceAccount (the chart's RBAC applied, a token
// minted per ServiceAccount), so a missing grant fails the run; the admin connection is kept for
// what an administrator does (CRDs, namespace, Nodes, drive claims).

import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { DescMethodUnary, DescService } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import * as k8s from "@kubernetes/client-node";
import { parseAgentConfig } from "../../agent/config.ts";
import { type RunningAgent, runAgent } from "../../agent/main.ts";
import { kinds, type NVMeDevice, type NVMeDeviceClaim } from "../../api/index.ts";
import { parseCsiConfig } from "../../csi/config.ts";
import { type RunningCsi, runCsi } from "../../csi/main.ts";
import { Identity, Node } from "../../gen/csi/v1/csi_pb.ts";
import { realClock } from "../../lib/clock.ts";
import { GrpcCallError, GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import { register, serveGrpc } from "../../lib/grpc/server.ts";
import { connect, type KubeConnection } from "../../lib/kube/connection.ts";
import { EventRecorder } from "../../lib/kube/events.ts";
import { kubeError, ResourceClient } from "../../lib/kube/resource.ts";
import type { Logger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import { parseConfig as parseManagerConfig } from "../../manager/config.ts";
import { type RunningManager, startManager } from "../../manager/manager.ts";
import { installCrds } from "../cluster/crds.ts";
import { ProcessTable } from "../procs.ts";
import { startHostProcess, startTargetProcess } from "./fabric-processes.ts";
import {
  applyChartRbac,
  type ChartComponent,
  type ComponentIdentity,
  writeComponentKubeconfigs,
} from "./rbac.ts";
import { buildDriveSysfs, type SimNodeDrive } from "./storage-node.ts";

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
  /**
   * Serve the CSI controller in the same process as the first consumer node (mode "all"). With
   * chart identities the controller and the node service have two ServiceAccounts, so the
   * controller then runs as its own CSI instance (mode "controller", own socket) instead.
   */
  csiAllInOne?: boolean;
  /**
   * Whose credentials the components use: each its own chart ServiceAccount's token (the
   * default: RBAC proved, not assumed), or the admin kubeconfig for all of them.
   */
  identities?: StackIdentities;
  namespace?: string;
  logger: Logger;
  /** Short report and verification periods make the lab converge quickly. */
  fast?: boolean;
}

export type StackIdentities = "chart-service-accounts" | "admin";

/** The components the stack runs; each gets a ServiceAccount identity under chart identities. */
const STACK_COMPONENTS: ChartComponent[] = ["manager", "agent", "csi-controller", "csi-node"];

export interface Stack {
  /** The admin connection (setup, claims, inspection by tests). */
  conn: KubeConnection;
  identities: StackIdentities;
  /** Per component, under chart identities: its ServiceAccount and kubeconfig. Empty for admin. */
  identity: Map<ChartComponent, ComponentIdentity>;
  namespace: string;
  dir: string;
  storage: StackStorageNode[];
  agents: RunningAgent[];
  /** The target and host daemon processes ("nvmf_tgt/<node>", "nvme-host/<node>"), for fault tests. */
  procs: ProcessTable;
  manager: RunningManager;
  /** CSI per consumer node name; with csiAllInOne and admin identities the first also serves the controller. */
  csi: Map<string, RunningCsi>;
  /** The CSI instance serving the Controller service, when csiAllInOne. */
  csiController?: RunningCsi;
  /**
   * With csiAllInOne: the endpoint to dial for Identity and Node as if the plugin were one
   * process. The first consumer node's socket in mode "all"; with a separate controller, a front
   * that forwards Node to that socket and whose Identity also advertises the controller service
   * (csi-sanity reads CONTROLLER_SERVICE from the node endpoint only).
   */
  csiPluginEndpoint?: string;
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

/** A storage node of the stack: its emulated nvmf_tgt's process and RPC socket, and its drives. */
export interface StackStorageNode {
  nodeName: string;
  dir: string;
  /** The node's host root (the sysfs tree of its drives), the agent's DISTORT_HOST_ROOT. */
  hostRoot: string;
  spdkSocket: string;
  /** Process name of its nvmf_tgt in Stack.procs. */
  target: string;
  drives: SimNodeDrive[];
}

export async function startStack(o: StackOptions): Promise<Stack> {
  const namespace = o.namespace ?? "distort-system";
  const dir = mkdtempSync(join(tmpdir(), "distort-stack-"));
  const conn = connect(o.kubeconfigPath);
  const identities = o.identities ?? "chart-service-accounts";
  const log = o.logger;
  const stops: (() => Promise<void>)[] = [];
  // Pushed first, so it runs last: targets and host daemons outlive the agents and CSI nodes.
  const procs = new ProcessTable(dir);
  stops.push(() => procs.stopAll());
  const stop = async () => {
    for (const s of stops.reverse())
      await s().catch((err) => log.warn("stack stop step failed", { err: String(err) }));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await installCrds(conn);
    const core = conn.api(k8s.CoreV1Api);
    await ensure(core.createNamespace({ body: { metadata: { name: namespace } } }));
    const identity = new Map<ChartComponent, ComponentIdentity>();
    if (identities === "chart-service-accounts") {
      // Cluster-scoped RBAC is named after the release: one release per namespace.
      const release = namespace === "distort-system" ? "distort" : `distort-${namespace}`;
      const rbac = await applyChartRbac(conn, { namespace, release });
      stops.push(() => rbac.removeClusterScoped());
      const kubeconfigs = join(dir, "identities");
      mkdirSync(kubeconfigs, { recursive: true, mode: 0o700 });
      for (const [c, id] of await writeComponentKubeconfigs(conn, rbac, kubeconfigs, STACK_COMPONENTS))
        identity.set(c, id);
    }
    /** The kubeconfig a component runs with: its own ServiceAccount's, or the admin one. */
    const kubeconfigOf = (c: ChartComponent) => identity.get(c)?.kubeconfigPath ?? o.kubeconfigPath;
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

    const fabricDir = join(dir, "fabric");
    mkdirSync(fabricDir, { recursive: true });
    const storage: StackStorageNode[] = [];
    const agents: RunningAgent[] = [];
    for (const [i, n] of o.storageNodes.entries()) {
      // One portal address per node: on a shared fabric an address has exactly one listener.
      const portal = `127.0.0.${i + 1}`;
      const nd = join(dir, "storage", n.name);
      const hostRoot = join(nd, "host");
      const drives = n.drives.map((d) => ({ ...d, model: d.model ?? "DISTORT SIM NVMe" }));
      await buildDriveSysfs(hostRoot, drives);
      const drivesFile = join(nd, "drives.json");
      writeFileSync(drivesFile, JSON.stringify(drives));
      const spdkSocket = join(nd, "spdk.sock");
      const target = `nvmf_tgt/${n.name}`;
      await startTargetProcess(procs, {
        name: target,
        socketPath: spdkSocket,
        dataDir: join(nd, "drives"),
        fabricDir,
        drivesFile,
        hostAddresses: [portal],
      });
      storage.push({ nodeName: n.name, dir: nd, hostRoot, spdkSocket, target, drives: n.drives });
      const env = {
        PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
        HOME: process.env.HOME ?? "/root",
        NODE_NAME: n.name,
        KUBECONFIG: kubeconfigOf("agent"),
        DISTORT_NAMESPACE: namespace,
        DISTORT_BACKENDS: "spdk",
        DISTORT_SPDK_SOCKET: spdkSocket,
        DISTORT_HOST_ROOT: hostRoot,
        DISTORT_KEY_DIR: join(nd, "keys"),
        DISTORT_PORTAL_ADDRESS: portal,
        DISTORT_PORTAL_PORT: "4420",
        DISTORT_HEALTH_PORT: "0",
        DISTORT_REPORT_PERIOD_MS: "1000",
        DISTORT_VERIFY_PERIOD_MS: o.fast ? "5000" : "1000",
        DISTORT_LOG_LEVEL: "warn",
      };
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
    const managerConn = connect(kubeconfigOf("manager"));
    const manager = await startManager({
      conn: managerConn,
      config: managerConfig,
      clock: realClock,
      logger: log.with({ component: "manager" }),
      registry: new Registry(),
      events: new EventRecorder(managerConn, {
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
    for (;;) {
      devices = (await devClient.list()).items.filter((d) => want.includes(d.spec.serial));
      if (devices.length >= want.length) break;
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

    const csi = new Map<string, RunningCsi>();
    let csiController: RunningCsi | undefined;
    const csiArgs = (socket: string, mode: string, kubeconfig: string) => [
      `--endpoint=unix://${socket}`,
      `--mode=${mode}`,
      `--kubeconfig=${kubeconfig}`,
      `--namespace=${namespace}`,
      "--health-port=0",
      "--log-level=warn",
      // No attach/detach controller writes these Nodes' status.volumesAttached here, so the node
      // service's sweep would take every staged volume for one kubelet forgot.
      "--staging-sweep-ms=0",
    ];
    // csi-controller and csi-node are two ServiceAccounts: one process cannot be both.
    const separateController = o.csiAllInOne === true && identity.has("csi-controller");
    if (separateController) {
      const root = join(dir, "csi-controller");
      mkdirSync(root, { recursive: true });
      const kubeconfig = kubeconfigOf("csi-controller");
      const cfg = parseCsiConfig(csiArgs(join(root, "csi.sock"), "controller", kubeconfig), {});
      csiController = await runCsi(cfg, log.with({ component: "csi", service: "controller" }), {
        conn: connect(kubeconfig),
      });
      const running = csiController;
      stops.push(() => running.stop());
    }
    for (const [i, nodeName] of o.consumerNodes.entries()) {
      const root = join(dir, "consumers", nodeName);
      mkdirSync(join(root, "etc", "nvme"), { recursive: true });
      mkdirSync(join(root, "run"), { recursive: true });
      writeFileSync(
        join(root, "etc", "nvme", "hostnqn"),
        `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}\n`,
      );
      const mode = o.csiAllInOne && i === 0 && !separateController ? "all" : "node";
      // Mode "all" happens only with admin identities, where every kubeconfig is the admin one.
      const kubeconfig = kubeconfigOf("csi-node");
      const cfg = parseCsiConfig(
        [
          ...csiArgs(join(root, "csi.sock"), mode, kubeconfig),
          `--node-id=${nodeName}`,
          `--state-dir=${join(root, "state")}`,
          `--host-root=${root}`,
          `--topology-keys=${FABRIC_LABEL}`,
        ],
        {},
      );
      // The node's NVMe-oF host ("the kernel"): FUSE namespace files under loop devices, every
      // block a command over the fabric to the target.
      const initiator = await startHostProcess(procs, {
        name: `nvme-host/${nodeName}`,
        fabricDir,
        stateDir: join(root, "var", "lib", "nvme-host"),
        socketPath: join(root, "run", "nvme-host.sock"),
      });
      const running = await runCsi(cfg, log.with({ component: "csi", node: nodeName }), {
        conn: connect(kubeconfig),
        node: { initiator },
      });
      stops.push(() => running.stop());
      csi.set(nodeName, running);
      if (mode === "all") csiController = running;
    }
    let csiPluginEndpoint = o.csiAllInOne ? csiController?.address : undefined;
    const firstNode = o.consumerNodes[0] === undefined ? undefined : csi.get(o.consumerNodes[0]);
    if (separateController && csiController && firstNode) {
      const front = await serveCsiPluginFront({
        socketPath: join(dir, "csi-plugin", "csi.sock"),
        node: firstNode.address,
        controller: csiController.address,
        logger: log.with({ component: "csi-plugin-front" }),
      });
      stops.push(() => front.close());
      csiPluginEndpoint = front.address;
    }

    return {
      conn,
      identities,
      identity,
      namespace,
      dir,
      storage,
      agents,
      procs,
      manager,
      csi,
      ...(csiController ? { csiController } : {}),
      ...(csiPluginEndpoint ? { csiPluginEndpoint } : {}),
      devices: async () => (await devClient.list()).items,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** A remote call's gRPC status, handed on unchanged (gRPC and Connect codes share numbers). */
function relay(err: unknown): never {
  if (err instanceof GrpcCallError) throw new ConnectError(err.details, err.code);
  throw err;
}

/** Every unary method of `service`, forwarded to the same method on `client`. */
function forwardAll(
  service: DescService,
  client: GrpcJsClient,
): Record<string, (req: never) => Promise<unknown>> {
  const impl: Record<string, (req: never) => Promise<unknown>> = {};
  for (const m of service.methods)
    if (m.methodKind === "unary") {
      const unary = m as DescMethodUnary;
      impl[m.localName] = (req) => client.unary(unary, req).catch(relay);
    }
  return impl;
}

/**
 * Serves one plugin endpoint over a node-mode and a controller-mode CSI instance: Node forwards
 * to the node socket; Identity answers with the node's plugin info, the union of both instances'
 * capabilities and ready only when both are. Lab-only glue for conformance tools that expect the
 * controller to be advertised on the node endpoint; the services themselves run unchanged.
 */
async function serveCsiPluginFront(o: {
  socketPath: string;
  node: string;
  controller: string;
  logger: Logger;
}): Promise<{ address: string; close(): Promise<void> }> {
  const node = new GrpcJsClient(o.node);
  const controller = new GrpcJsClient(o.controller);
  const both = <T>(call: (c: GrpcJsClient) => Promise<T>) =>
    Promise.all([call(node), call(controller)]).catch(relay);
  const server = await serveGrpc({
    socketPath: o.socketPath,
    logger: o.logger,
    shutdownGraceMs: 1000,
    services: [
      register(Identity, {
        getPluginInfo: () => node.unary(Identity.method.getPluginInfo, {}).catch(relay),
        getPluginCapabilities: async () => {
          const all = (await both((c) => c.unary(Identity.method.getPluginCapabilities, {}))).flatMap(
            (r) => r.capabilities,
          );
          const key = (c: (typeof all)[number]) => `${c.type.case}:${c.type.value?.type}`;
          return { capabilities: all.filter((c, i) => all.findIndex((x) => key(x) === key(c)) === i) };
        },
        probe: async () => {
          const answers = await both((c) => c.unary(Identity.method.probe, {}));
          return { ready: answers.every((a) => a.ready !== false) };
        },
      }),
      register(Node, forwardAll(Node, node)),
    ],
  });
  return {
    address: server.address,
    async close() {
      await server.close();
      node.close();
      controller.close();
    },
  };
}
