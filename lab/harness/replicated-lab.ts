// Storage nodes for replicated-volume integration tests, run inside the test process: a control
// plane (the suite's or one of its own), one simulated node per entry (sysfs drives and an emulated
// nvmf_tgt) on a shared loopback TCP fabric, and an agent per node exporting on its own address.
// Also the manager's step that declares a volume's copies current, which these tests play by hand.

import { join } from "node:path";
import { parseAgentConfig } from "../../agent/config.ts";
import { type AgentHooks, type RunningAgent, runAgent } from "../../agent/main.ts";
import type { NVMeDevice, NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { kinds } from "../../api/index.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { createLogger } from "../../lib/log.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { eventually, type TestCluster, testCluster } from "../cluster/test-support.ts";
import type { SimFabric } from "../sim/spdk/emulator.ts";
import { createTcpFabric } from "../sim/spdk/fabric.ts";
import {
  placeOnReportedDrive,
  type SimNodeDrive,
  type SimStorageNode,
  startSimStorageNode,
} from "./storage-node.ts";

/** One storage node of the lab. */
export interface ReplicatedLabNode {
  name: string;
  /** Its one host address: the emulated target listens there, the agent exports there. */
  address: string;
  drives: SimNodeDrive[];
}

export interface ReplicatedLabOptions {
  /** Prefix of the test namespace (a unique suffix is added). */
  namespacePrefix: string;
  nodes: readonly ReplicatedLabNode[];
  /** The NVMe-oF port every agent exports on (DISTORT_PORTAL_PORT). */
  port: number;
  /** More agent environment, the same on every node. */
  agentEnv?: Record<string, string>;
  /** A kubeconfig of a node's agent's own (e.g. through a proxy the test can cut); absent: the control plane's. */
  kubeconfigFor?: (nodeName: string) => string | undefined;
  /** Runs once the control plane is up, before the first node starts (e.g. to write kubeconfigFor's files). */
  beforeNodes?: (tc: TestCluster) => void | Promise<void>;
  /** Step hooks of one node's agent, asked again each time that agent starts. */
  hooks?: (nodeName: string) => AgentHooks | undefined;
  /**
   * Nodes whose agent runs as a child process (agent/main.ts, its environment as the others'),
   * so a test can SIGKILL it by PID while the node's emulated nvmf_tgt, in this process, goes
   * on. Hooks do not reach such an agent.
   */
  childAgents?: readonly string[];
}

/** A node's agent; `pid` is set when it runs as a child process. */
export type LabAgent = RunningAgent & { pid?: number; exited?: Promise<number> };

export interface ReplicatedLab {
  tc: TestCluster;
  /** The namespace the agents serve and the tests create their objects in. */
  ns: string;
  fabric: SimFabric;
  /** In the order of the options' nodes. */
  nodes: SimStorageNode[];
  /** The running agent of each node, by index; startAgent replaces an entry. */
  agents: LabAgent[];
  /** Starts node i's agent again (after agents[i].stop()) and makes it agents[i]. */
  startAgent(i: number): Promise<LabAgent>;
  /** Stops every agent, then every node, then the control plane if this lab started it. */
  close(): Promise<void>;
}

/**
 * Starts the lab: the control plane and namespace first, then per node its simulated hardware and
 * its agent, one node after the other. A failure part-way stops what had started and rethrows.
 */
export async function startReplicatedLab(o: ReplicatedLabOptions): Promise<ReplicatedLab> {
  const tc = await testCluster();
  const fabric = createTcpFabric();
  const nodes: SimStorageNode[] = [];
  const agents: LabAgent[] = [];
  const starts: (() => Promise<LabAgent>)[] = [];
  const close = async () => {
    for (const a of agents) await a.stop();
    for (const n of nodes) await n.close();
    await tc.stop();
  };
  try {
    const ns = await tc.namespace(o.namespacePrefix);
    await o.beforeNodes?.(tc);
    for (const spec of o.nodes) {
      const node = await startSimStorageNode({
        nodeName: spec.name,
        drives: spec.drives,
        fabric,
        hostAddresses: [spec.address],
      });
      nodes.push(node);
      const env = node.agentEnv(o.kubeconfigFor?.(spec.name) ?? tc.kubeconfigPath, ns, {
        DISTORT_PORTAL_ADDRESS: spec.address,
        DISTORT_PORTAL_PORT: String(o.port),
        ...o.agentEnv,
      });
      const cfg = parseAgentConfig(env);
      const start = o.childAgents?.includes(spec.name)
        ? () => spawnAgent(env, spec.name)
        : () =>
            runAgent(
              cfg,
              createLogger({
                level: (process.env.DISTORT_TEST_LOG as "info") ?? "error",
                fields: { node: spec.name },
              }),
              o.hooks?.(spec.name),
            );
      starts.push(start);
      agents.push(await start());
    }
    return {
      tc,
      ns,
      fabric,
      nodes,
      agents,
      async startAgent(i) {
        const start = starts[i];
        if (!start) throw new Error(`no node ${i} in this lab`);
        const agent = await start();
        agents[i] = agent;
        return agent;
      },
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * Starts an agent as a child process (this checkout's agent/main.ts) and resolves once it is
 * ready (/readyz on a health port of its own) or rejects when it exits first or takes over 60 s.
 * The port is drawn below Linux's ephemeral range (32768 up); an agent that exits before it is
 * ready (another process took the port first) is started again on another, twice at most.
 * stop() is SIGTERM, then SIGKILL after 10 s.
 */
async function spawnAgent(env: Record<string, string>, node: string): Promise<LabAgent> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await spawnAgentOnce(env, node, 20000 + Math.floor(Math.random() * 12000));
    } catch (err) {
      if (!(err instanceof AgentExitedEarly) || attempt >= 3) throw err;
    }
  }
}

class AgentExitedEarly extends Error {}

async function spawnAgentOnce(env: Record<string, string>, node: string, port: number): Promise<LabAgent> {
  const child = Bun.spawn([process.execPath, join(import.meta.dir, "../../agent/main.ts")], {
    env: {
      ...env,
      DISTORT_HEALTH_PORT: String(port),
      DISTORT_LOG_LEVEL: (process.env.DISTORT_TEST_LOG as string | undefined) ?? "error",
    },
    stdout: "ignore",
    stderr: "inherit",
  });
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    await Promise.race([child.exited, Bun.sleep(10_000)]);
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await child.exited;
    }
  };
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new AgentExitedEarly(
        `agent of ${node} exited before it was ready (${child.exitCode ?? child.signalCode}), health port ${port}`,
      );
    const ready = await fetch(`http://127.0.0.1:${port}/readyz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ready) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`agent of ${node} not ready within 60 s`);
    }
    await Bun.sleep(200);
  }
  return { healthPort: port, pid: child.pid, exited: child.exited, stop };
}

/**
 * The manager's declaration that replicated volume `name`'s copies are all current: data
 * generation 1, each copy Online at generation 1 on its node and drive (`devices[i]` holds
 * `copies[i]`). Nothing is served before it.
 */
export async function declareCopiesCurrent(
  lab: Pick<ReplicatedLab, "tc" | "ns">,
  name: string,
  copies: readonly NVMePartition[],
  devices: readonly NVMeDevice[],
): Promise<void> {
  const parts = new ResourceClient(lab.tc.conn, kinds.NVMePartition);
  await updateStatus(parts, name, lab.ns, (latest) => ({
    ...(latest.status ?? { conditions: [] }),
    state: latest.status?.state ?? ("Placed" as const),
    dataGeneration: 1,
    replicas: copies.map((c, i) => ({
      name: c.metadata.name,
      uid: c.metadata.uid as string,
      nodeName: c.spec.nodeName as string,
      deviceSerial: devices[i]?.spec.serial as string,
      state: "Online" as const,
      generation: 1,
    })),
  }));
}

/** A replicated volume served by one node of the lab, as serveReplicatedVolume made it. */
export interface ServedVolume {
  uid: string;
  /** The volume as it was once Exported. */
  served: NVMePartition;
  copies: NVMePartition[];
  devices: NVMeDevice[];
}

/**
 * Creates replicated volume `name` (spdk, partition volume manager, tcp) with one copy per
 * `copies` entry (the drive's serial and the copy's name), waits until every copy is Exported,
 * then plays the manager: admits `servingNode`'s nexus host on each copy, names it the serving
 * node, declares the copies current, and waits until the volume is Exported. With `consumer`,
 * the consumer's attachment record is made and waited for (its lifetime `att-1`). Needs only a
 * control plane and a namespace whose storage nodes run agents (a ReplicatedLab, or a test's own).
 */
export async function serveReplicatedVolume(
  lab: Pick<ReplicatedLab, "tc" | "ns">,
  o: {
    name: string;
    sizeBytes: number;
    copies: readonly (readonly [serial: string, copyName: string])[];
    servingNode: string;
    spec?: Partial<NVMePartition["spec"]>;
    consumer?: { hostNQN: string; nodeId: string };
  },
): Promise<ServedVolume> {
  const { tc, ns } = lab;
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vol = await parts.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: o.name, namespace: ns },
    spec: {
      sizeBytes: o.sizeBytes,
      replicas: o.copies.length,
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "tcp" },
      ...o.spec,
    },
  } as NVMePartition);
  const uid = vol.metadata.uid as string;
  const devices: NVMeDevice[] = [];
  for (const [serial, copyName] of o.copies) {
    devices.push(
      await placeOnReportedDrive(tc.conn, ns, serial, [copyName], o.sizeBytes, (p) => {
        p.spec.replicaOf = { name: o.name, uid };
      }),
    );
  }
  const copies = await eventually(
    async () => {
      const got = await Promise.all(o.copies.map(([, n]) => parts.get(n, ns)));
      return got.every((p) => p?.status?.state === "Exported") ? (got as NVMePartition[]) : undefined;
    },
    30_000,
    "every copy Exported",
  );
  const nexusHost = nexusHostNqnFor(o.servingNode);
  for (const c of copies) {
    await vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name: attachmentNameFor(c.metadata.name, c.metadata.uid as string), namespace: ns },
      spec: {
        partitionName: c.metadata.name,
        partitionUID: c.metadata.uid as string,
        nodeId: `${o.servingNode}/${nexusHost}`,
        hostNQN: nexusHost,
        attachmentId: `nexus-${c.metadata.name}`,
      },
    } as NVMeVolumeAttachment);
  }
  await parts.mergePatch(o.name, ns, { metadata: { uid }, spec: { nodeName: o.servingNode } });
  await declareCopiesCurrent(lab, o.name, copies, devices);
  const served = await eventually(
    async () => {
      const p = await parts.get(o.name, ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    "volume Exported",
  );
  if (o.consumer) {
    const vaName = attachmentNameFor(o.name, uid);
    await vas.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMeVolumeAttachment",
      metadata: { name: vaName, namespace: ns },
      spec: {
        partitionName: o.name,
        partitionUID: uid,
        nodeId: o.consumer.nodeId,
        hostNQN: o.consumer.hostNQN,
        attachmentId: "att-1",
      },
    } as NVMeVolumeAttachment);
    await eventually(
      async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === "att-1",
      20_000,
      "consumer admitted",
    );
  }
  return { uid, served, copies, devices };
}
