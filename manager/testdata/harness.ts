// Integration-test harness for the manager: a namespace and label of its own on a real API
// server, builders that create labelled devices, claims, storage nodes and partitions there, and
// an in-process manager watching only that label (so tests sharing a control plane stay apart).
import * as k8s from "@kubernetes/client-node";
import {
  kinds,
  type NVMeDevice,
  type NVMeDeviceClaim,
  type NVMePartition,
  type RDMAStorageNode,
} from "../../api/index.ts";
import type { TestCluster } from "../../lab/cluster/test-support.ts";
import { realClock } from "../../lib/clock.ts";
import { KeyedMutex } from "../../lib/concurrency/keyed-mutex.ts";
import { EventRecorder } from "../../lib/kube/events.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { createLogger, silentLogger } from "../../lib/log.ts";
import { Registry } from "../../lib/metrics.ts";
import { type ManagerConfig, parseConfig } from "../config.ts";
import type { ManagerContext } from "../context.ts";
import { EventPort } from "../events.ts";
import type { Inventory } from "../inventory.ts";
import { type RunningManager, startManager } from "../manager.ts";
import { managerMetrics } from "../metrics.ts";
import {
  claim as claimFixture,
  device as deviceFixture,
  forCreate,
  type NodeOpts,
  type PartitionOpts,
  partition as partitionFixture,
  storageNode,
} from "./fixtures.ts";

export const TEST_LABEL = "storage.distort.io/test-scope";

export interface Harness {
  ns: string;
  label: Record<string, string>;
  devices: ResourceClient<NVMeDevice>;
  claims: ResourceClient<NVMeDeviceClaim>;
  partitions: ResourceClient<NVMePartition>;
  nodes: ResourceClient<RDMAStorageNode>;
  registry: Registry;
  /** Cluster-unique device name for a short test name. */
  dev(name: string): string;
  createDevice(
    name: string,
    o?: { node?: string; serial?: string; allocatable?: number },
  ): Promise<NVMeDevice>;
  patchDeviceStatus(
    name: string,
    change: (s: NonNullable<NVMeDevice["status"]>) => void,
  ): Promise<NVMeDevice>;
  createNode(nodeName: string, o?: NodeOpts): Promise<RDMAStorageNode>;
  createClaim(name: string, serial: string, nodeName?: string): Promise<NVMeDeviceClaim>;
  createPartition(name: string, o?: PartitionOpts): Promise<NVMePartition>;
  /** Environment overrides on top of the harness defaults (see config.ts for names). */
  start(env?: Record<string, string>): Promise<RunningManager>;
  /** The environment a manager process needs to watch exactly this harness's objects. */
  env(extra?: Record<string, string>): Record<string, string>;
  /**
   * A controller context over the real API server with a hand-fed inventory: lets a test run a
   * reconciler on a deliberately stale view (what a lagging or deposed manager would see).
   */
  context(inventory: Inventory): ManagerContext;
  /**
   * Events about the object named `name` (in the harness namespace, or "default" where the API
   * server keeps events about cluster-scoped objects), as "Type Reason: note".
   */
  events(name: string): Promise<string[]>;
  stop(): Promise<void>;
}

export async function harness(tc: TestCluster, prefix: string): Promise<Harness> {
  const ns = await tc.namespace(prefix);
  const label = { [TEST_LABEL]: ns };
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  const claims = new ResourceClient(tc.conn, kinds.NVMeDeviceClaim);
  const partitions = new ResourceClient(tc.conn, kinds.NVMePartition);
  const nodes = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  const registry = new Registry();
  const running: RunningManager[] = [];
  const dev = (name: string) => `${ns}-${name}`;
  const baseEnv = (extra: Record<string, string> = {}) => ({
    DISTORT_KUBECONFIG: tc.kubeconfigPath,
    DISTORT_NAMESPACE: ns,
    DISTORT_LABEL_SELECTOR: `${TEST_LABEL}=${ns}`,
    DISTORT_LEADER_ELECT: "false",
    DISTORT_HEARTBEAT_STALENESS_MS: "60000",
    DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "200",
    DISTORT_PLACEMENT_BACKOFF_MAX_MS: "2000",
    DISTORT_RESYNC_MS: "0",
    DISTORT_HEALTH_PORT: "0",
    ...extra,
  });

  return {
    ns,
    label,
    devices,
    claims,
    partitions,
    nodes,
    registry,
    dev,
    async createDevice(name, o = {}) {
      const d = deviceFixture(dev(name), {
        node: o.node ?? "node-a",
        serial: o.serial ?? `SER-${ns}-${name}`,
        allocatable: o.allocatable,
        labels: label,
      });
      return devices.create(forCreate(d));
    },
    async patchDeviceStatus(name, change) {
      const out = await updateStatus(devices, dev(name), undefined, (latest) => {
        const s = structuredClone(
          latest.status ?? { phase: "Available" as const, conditions: [], reservations: [] },
        );
        change(s);
        return s;
      });
      if (!out) throw new Error(`device ${dev(name)} not found`);
      return out;
    },
    async createNode(nodeName, o = {}) {
      const n = storageNode(nodeName, {
        heartbeat: Date.now(),
        ...o,
        namespace: ns,
        labels: { ...label, ...o.labels },
      });
      const created = await nodes.create(forCreate(n));
      return nodes.replaceStatus({ ...created, status: n.status });
    },
    async createClaim(name, serial, nodeName) {
      const c = claimFixture(ns, name, { serial, nodeName, labels: label });
      return claims.create(forCreate(c));
    },
    async createPartition(name, o = {}) {
      const p = partitionFixture(ns, name, { ...o, labels: { ...label, ...o.labels } });
      const { finalizers: _f, ...meta } = forCreate(p).metadata;
      return partitions.create({ ...forCreate(p), metadata: meta });
    },
    async start(env = {}) {
      const config: ManagerConfig = parseConfig(baseEnv(env), { hostname: "test", randomSuffix: ns });
      const logger = process.env.DISTORT_TEST_LOGS ? createLogger({ level: "debug" }) : silentLogger;
      const events = new EventRecorder(tc.conn, {
        controller: "storage.distort.io/manager",
        instance: config.identity,
        logger,
      });
      const m = await startManager({ conn: tc.conn, config, clock: realClock, logger, registry, events });
      running.push(m);
      return m;
    },
    env: baseEnv,
    context(inventory) {
      return {
        clients: { devices, claims, partitions, nodes },
        inventory,
        deviceLocks: new KeyedMutex(),
        events: new EventPort({ record: async () => {} }, silentLogger),
        clock: realClock,
        log: silentLogger,
        metrics: managerMetrics(registry),
        config: parseConfig(baseEnv(), { hostname: "test", randomSuffix: ns }),
      };
    },
    async events(name) {
      const api = tc.conn.api(k8s.EventsV1Api);
      const lists = await Promise.all(
        [ns, "default"].map((namespace) => api.listNamespacedEvent({ namespace })),
      );
      return lists
        .flatMap((l) => l.items)
        .filter((e) => e.regarding?.name === name)
        .map((e) => `${e.type} ${e.reason}: ${e.note ?? ""}`);
    },
    async stop() {
      await Promise.all(running.map((m) => m.stop()));
    },
  };
}
