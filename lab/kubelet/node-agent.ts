// The kubelet stand-in's side of its Node: registers the Node (labels, attach-detach annotation,
// ready status the scheduler accepts) and its CSINode, renews the node Lease, refreshes the Ready
// heartbeat and reports node.status.volumesInUse. All Node status writes go through one queue.
import { readFileSync, statfsSync } from "node:fs";
import { release } from "node:os";
import * as k8s from "@kubernetes/client-node";
import { errorMessage } from "../../lib/errors.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import type { Logger } from "../../lib/log.ts";
import pkg from "../../package.json" with { type: "json" };
import { sha256Hex, uniqueNamePrefix } from "./naming.ts";

/** The version this stand-in reports: the control plane's, so skew checks see a matching kubelet. */
export const KUBELET_VERSION = "v1.36.1";
/** Where node Leases live. */
export const LEASE_NAMESPACE = "kube-node-lease";
/** Tells the attach-detach controller to attach this node's volumes (kubelet does not). */
export const ATTACH_DETACH_ANNOTATION = "volumes.kubernetes.io/controller-managed-attach-detach";
/** The annotation kubelet keeps of driver -> CSI node id on the Node. */
export const CSI_NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid";

/** What NodeGetInfo and Identity told about the driver on this node. */
export interface DriverInfo {
  name: string;
  nodeId: string;
  /** accessible_topology segments; they become Node labels and CSINode topology keys. */
  topology: Record<string, string>;
  /** max_volumes_per_node; 0 leaves CSINode allocatable unset. */
  maxVolumes: number;
}

/** The Node a NodeAgent keeps, and the driver it reports. */
export interface NodeAgentOptions {
  conn: KubeConnection;
  nodeName: string;
  rootDir: string;
  /** Extra Node labels (--label k=v). */
  labels: Record<string, string>;
  driver: DriverInfo;
  logger: Logger;
  /** Lease renewal period. Default 10 s. */
  leaseRenewMs?: number;
  /** Ready heartbeat period. Default 40 s. */
  heartbeatMs?: number;
  /** Volume names (kubernetes.io/csi/<driver>^<handle>) this kubelet has in use right now. */
  volumesInUse: () => Iterable<string>;
}

const GOARCH: Record<string, string> = {
  x64: "amd64",
  arm64: "arm64",
  arm: "arm",
  ppc64: "ppc64le",
  s390x: "s390x",
};

/** The labels kubelet puts on its Node: hostname, os, arch, --label ones and the driver's topology. Pure. */
export function nodeLabels(
  nodeName: string,
  extra: Record<string, string>,
  topology: Record<string, string>,
): Record<string, string> {
  return {
    "kubernetes.io/hostname": nodeName,
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": GOARCH[process.arch] ?? process.arch,
    ...extra,
    ...topology,
  };
}

/** MicroTime as the API server parses it (RFC 3339 with six fractional digits). */
export function microTime(ms = Date.now()): string {
  return new Date(ms).toISOString().replace(/Z$/, "000Z");
}

function isoSeconds(ms = Date.now()): string {
  return `${new Date(ms).toISOString().slice(0, 19)}Z`;
}

function readTrimmed(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8").trim();
  } catch {
    return undefined;
  }
}

/** Capacity of the filesystem holding the kubelet root, as kubelet reports ephemeral-storage. */
function ephemeralStorage(rootDir: string): string {
  try {
    const s = statfsSync(rootDir);
    return String(s.blocks * s.bsize);
  } catch {
    return "100Gi";
  }
}

type Condition = { type: string; status: string; reason: string; message: string };

const CONDITIONS: Condition[] = [
  {
    type: "MemoryPressure",
    status: "False",
    reason: "KubeletHasSufficientMemory",
    message: "kubelet has sufficient memory available",
  },
  {
    type: "DiskPressure",
    status: "False",
    reason: "KubeletHasNoDiskPressure",
    message: "kubelet has no disk pressure",
  },
  {
    type: "PIDPressure",
    status: "False",
    reason: "KubeletHasSufficientPID",
    message: "kubelet has sufficient PID available",
  },
  { type: "Ready", status: "True", reason: "KubeletReady", message: "kubelet is posting ready status" },
];

/**
 * The Node status kubelet posts: capacity, conditions with a fresh heartbeat (a condition keeps
 * its lastTransitionTime while its status is unchanged), addresses, nodeInfo and volumesInUse.
 * `previous` is the stored status. Pure apart from the clock value passed in.
 */
export function nodeStatusBody(o: {
  nodeName: string;
  previous: k8s.V1NodeStatus | undefined;
  nowMs: number;
  ephemeralStorage: string;
  volumesInUse: string[];
  nodeInfo: k8s.V1NodeSystemInfo;
}): Record<string, unknown> {
  const now = isoSeconds(o.nowMs);
  const resources = { cpu: "2", memory: "8Gi", pods: "110", "ephemeral-storage": o.ephemeralStorage };
  const conditions = CONDITIONS.map((c) => {
    const before = o.previous?.conditions?.find((p) => p.type === c.type);
    const since =
      before?.status === c.status && before.lastTransitionTime
        ? new Date(before.lastTransitionTime).toISOString().replace(/\.\d{3}Z$/, "Z")
        : now;
    return { ...c, lastHeartbeatTime: now, lastTransitionTime: since };
  });
  return {
    capacity: resources,
    allocatable: resources,
    conditions,
    addresses: [
      { type: "InternalIP", address: "127.0.0.1" },
      { type: "Hostname", address: o.nodeName },
    ],
    daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
    nodeInfo: o.nodeInfo,
    volumesInUse: o.volumesInUse,
  };
}

/**
 * Keeps one Node registered and fresh. Status writes are serialized; each reads the Node first,
 * so entries of volumesInUse that belong to other drivers are kept as they are.
 */
export class NodeAgent {
  private readonly core: k8s.CoreV1Api;
  private readonly storage: k8s.StorageV1Api;
  private readonly coordination: k8s.CoordinationV1Api;
  private readonly log: Logger;
  private queue: Promise<unknown> = Promise.resolve();
  private timers: ReturnType<typeof setInterval>[] = [];
  private lastInUse: string | undefined;
  private nodeUid: string | undefined;
  private stopped = false;
  private readonly nodeInfo: k8s.V1NodeSystemInfo;

  constructor(private readonly o: NodeAgentOptions) {
    this.core = o.conn.api(k8s.CoreV1Api);
    this.storage = o.conn.api(k8s.StorageV1Api);
    this.coordination = o.conn.api(k8s.CoordinationV1Api);
    this.log = o.logger;
    const machine = sha256Hex(`distort-lab-node:${o.nodeName}`).slice(0, 32);
    this.nodeInfo = {
      machineID: machine,
      systemUUID: `${machine.slice(0, 8)}-${machine.slice(8, 12)}-${machine.slice(12, 16)}-${machine.slice(16, 20)}-${machine.slice(20, 32)}`,
      bootID: readTrimmed("/proc/sys/kernel/random/boot_id") ?? machine,
      kernelVersion: release(),
      osImage: "DISTORT lab node",
      containerRuntimeVersion: `distort-lab://${pkg.version}`,
      kubeletVersion: KUBELET_VERSION,
      kubeProxyVersion: "",
      operatingSystem: "linux",
      architecture: GOARCH[process.arch] ?? process.arch,
    };
  }

  /**
   * Creates the Node or patches the existing one (labels, annotations), posts its status, then
   * the Lease and the CSINode. Idempotent; throws when the API server refuses a write.
   */
  async register(): Promise<void> {
    const { nodeName, driver } = this.o;
    const labels = nodeLabels(nodeName, this.o.labels, driver.topology);
    const existing = await this.readNode();
    const ids = { ...parseNodeIds(existing?.metadata?.annotations?.[CSI_NODE_ID_ANNOTATION]) };
    ids[driver.name] = driver.nodeId;
    const annotations = { [ATTACH_DETACH_ANNOTATION]: "true", [CSI_NODE_ID_ANNOTATION]: JSON.stringify(ids) };
    let node: k8s.V1Node;
    if (existing === undefined) {
      try {
        node = await this.core.createNode({ body: { metadata: { name: nodeName, labels, annotations } } });
        this.log.info(`node ${nodeName} registered`);
      } catch (err) {
        if (kubeError(err, "create node").kind !== "already-exists")
          throw kubeError(err, `create node ${nodeName}`);
        node = await this.patchNodeMeta(labels, annotations);
      }
    } else {
      node = await this.patchNodeMeta(labels, annotations);
      this.log.info(`node ${nodeName} already existed; labels and annotations updated`);
    }
    this.nodeUid = node.metadata?.uid;
    await this.postStatus();
    await this.renewLease();
    await this.registerCsiNode();
  }

  /** Starts the Lease and heartbeat loops. Failures are logged and retried on the next tick. */
  start(): void {
    const every = (ms: number, what: string, fn: () => Promise<void>) => {
      this.timers.push(
        setInterval(() => {
          if (this.stopped) return;
          fn().catch((err) =>
            this.log.warn(`${what} failed; retrying next period`, { err: errorMessage(err) }),
          );
        }, ms),
      );
    };
    every(this.o.leaseRenewMs ?? 10_000, "lease renewal", () => this.renewLease());
    every(this.o.heartbeatMs ?? 40_000, "node status heartbeat", () => this.postStatus());
  }

  /**
   * Writes volumesInUse when it differs from what was last written; resolves once the write is
   * stored (callers wait for it before relying on the attach-detach controller seeing it).
   */
  async flushVolumesInUse(): Promise<void> {
    if (this.lastInUse === JSON.stringify(this.currentInUse())) return;
    await this.postStatus();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    await this.queue.catch(() => {});
  }

  private currentInUse(): string[] {
    return [...new Set(this.o.volumesInUse())].sort();
  }

  private async readNode(): Promise<k8s.V1Node | undefined> {
    try {
      return await this.core.readNode({ name: this.o.nodeName });
    } catch (err) {
      const e = kubeError(err, `get node ${this.o.nodeName}`);
      if (e.kind === "not-found") return undefined;
      throw e;
    }
  }

  private async patchNodeMeta(labels: Record<string, string>, annotations: Record<string, string>) {
    try {
      return await this.core.patchNode(
        { name: this.o.nodeName, body: { metadata: { labels, annotations } } },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
      );
    } catch (err) {
      throw kubeError(err, `patch node ${this.o.nodeName}`);
    }
  }

  /** One status write, queued behind any other. */
  private postStatus(): Promise<void> {
    const run = async () => {
      const node = await this.readNode();
      if (node === undefined) throw new Error(`node ${this.o.nodeName} does not exist`);
      const ours = uniqueNamePrefix(this.o.driver.name);
      const inUse = this.currentInUse();
      const others = (node.status?.volumesInUse ?? []).filter((n) => !n.startsWith(ours));
      const body = nodeStatusBody({
        nodeName: this.o.nodeName,
        previous: node.status,
        nowMs: Date.now(),
        ephemeralStorage: ephemeralStorage(this.o.rootDir),
        volumesInUse: [...others, ...inUse].sort(),
        nodeInfo: this.nodeInfo,
      });
      try {
        await this.core.patchNodeStatus(
          { name: this.o.nodeName, body: { status: body } },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.StrategicMergePatch),
        );
      } catch (err) {
        throw kubeError(err, `update status of node ${this.o.nodeName}`);
      }
      this.lastInUse = JSON.stringify(inUse);
    };
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => {});
    return p;
  }

  private ownerRef(): k8s.V1OwnerReference[] {
    return this.nodeUid ? [{ apiVersion: "v1", kind: "Node", name: this.o.nodeName, uid: this.nodeUid }] : [];
  }

  /** Renews (or creates) the Lease named after the node in kube-node-lease. */
  async renewLease(): Promise<void> {
    const name = this.o.nodeName;
    const spec = { holderIdentity: name, leaseDurationSeconds: 40, renewTime: microTime() };
    try {
      await this.coordination.patchNamespacedLease(
        { name, namespace: LEASE_NAMESPACE, body: { spec } },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
      );
      return;
    } catch (err) {
      if (kubeError(err, "renew lease").kind !== "not-found") throw kubeError(err, `renew lease ${name}`);
    }
    await this.ensureLeaseNamespace();
    try {
      await this.coordination.createNamespacedLease({
        namespace: LEASE_NAMESPACE,
        body: {
          metadata: { name, namespace: LEASE_NAMESPACE, ownerReferences: this.ownerRef() },
          spec: { ...spec, renewTime: new k8s.V1MicroTime() },
        },
      });
    } catch (err) {
      const e = kubeError(err, `create lease ${name}`);
      if (e.kind !== "already-exists") throw e;
    }
  }

  private async ensureLeaseNamespace(): Promise<void> {
    try {
      await this.core.createNamespace({ body: { metadata: { name: LEASE_NAMESPACE } } });
    } catch (err) {
      const e = kubeError(err, `create namespace ${LEASE_NAMESPACE}`);
      if (e.kind !== "already-exists") throw e;
    }
  }

  /** Creates or updates the CSINode: this driver's entry replaced, other drivers' kept. */
  private async registerCsiNode(): Promise<void> {
    const { driver, nodeName } = this.o;
    const entry: k8s.V1CSINodeDriver = {
      name: driver.name,
      nodeID: driver.nodeId,
      topologyKeys: Object.keys(driver.topology).sort(),
      ...(driver.maxVolumes > 0 ? { allocatable: { count: driver.maxVolumes } } : {}),
    };
    for (let attempt = 0; ; attempt++) {
      let existing: k8s.V1CSINode | undefined;
      try {
        existing = await this.storage.readCSINode({ name: nodeName });
      } catch (err) {
        const e = kubeError(err, `get csinode ${nodeName}`);
        if (e.kind !== "not-found") throw e;
      }
      try {
        if (existing === undefined) {
          await this.storage.createCSINode({
            body: {
              metadata: { name: nodeName, ownerReferences: this.ownerRef() },
              spec: { drivers: [entry] },
            },
          });
        } else {
          const drivers = (existing.spec?.drivers ?? []).filter((d) => d.name !== driver.name);
          const refs = existing.metadata?.ownerReferences?.length
            ? existing.metadata.ownerReferences
            : this.ownerRef();
          await this.storage.replaceCSINode({
            name: nodeName,
            body: {
              ...existing,
              metadata: { ...existing.metadata, ownerReferences: refs },
              spec: { drivers: [...drivers, entry] },
            },
          });
        }
        this.log.info(`CSINode ${nodeName} lists driver ${driver.name} (node id ${driver.nodeId})`);
        return;
      } catch (err) {
        const e = kubeError(err, `write csinode ${nodeName}`);
        if ((e.kind === "conflict" || e.kind === "already-exists") && attempt < 5) continue;
        throw e;
      }
    }
  }
}

/** The driver -> node id map of the csi.volume.kubernetes.io/nodeid annotation; {} when absent or malformed. */
export function parseNodeIds(text: string | undefined): Record<string, string> {
  if (!text) return {};
  try {
    const v = JSON.parse(text) as unknown;
    if (v === null || typeof v !== "object" || Array.isArray(v)) return {};
    return Object.fromEntries(
      Object.entries(v).filter((e): e is [string, string] => typeof e[1] === "string"),
    );
  } catch {
    return {};
  }
}
