// The chaos run's world, every DISTORT part a process of its own so that a fault is a real kill -9:
// per storage node an emulated nvmf_tgt (lab/sim/spdk/nvmf-tgt.ts over file-backed drives, joined
// to the others by a unix-socket fabric) and an agent (agent/main.ts); one manager
// (manager/main.ts, no leader election). The control plane is the caller's (a real kube-apiserver
// and etcd). Processes are started and killed by PID only; logs go to <dir>/logs.
import { closeSync, mkdirSync, openSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { kinds, type NVMeDeviceClaim } from "../../api/index.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { spdkAnswers, targetArgv } from "../harness/fabric-processes.ts";
import { buildDriveSysfs, type SimNodeDrive } from "../harness/storage-node.ts";

const ROOT = join(import.meta.dir, "..", "..");
const BUN = process.execPath;
const GiB = 1024 ** 3;

export interface WorldOptions {
  dir: string;
  kubeconfigPath: string;
  namespace: string;
  conn: KubeConnection;
  /** Storage nodes (each one drive). */
  nodes: number;
  /** Listener port of every node (each node has its own address). */
  port: number;
  /** Manager: a storage node's heartbeat older than this counts it down. */
  stalenessMs: number;
  /** Agent: how long a lost copy may hold the raid's writes before it is recorded Faulted. */
  degradeAfterMs: number;
  /** Agent: the rebuild bandwidth cap (MB/s), so that rebuilds last long enough to be hit. */
  rebuildMbPerSec: number;
  /** A third octet of its own on 127.x.y.z, so that no other test's addresses are in the way. */
  addressOctet: number;
  logLevel?: "debug" | "info" | "warn" | "error";
}

export interface WorldNode {
  name: string;
  address: string;
  serial: string;
  hostRoot: string;
  spdkSocket: string;
}

type Proc = ReturnType<typeof Bun.spawn>;

/** One supervised child: started, killed with SIGKILL, started again, each by its PID. */
class Child {
  #proc: Proc | undefined;
  starts = 0;
  constructor(
    readonly name: string,
    private readonly argv: string[],
    private readonly env: Record<string, string>,
    private readonly logPath: string,
  ) {}

  get running(): boolean {
    return this.#proc !== undefined && this.#proc.exitCode === null && this.#proc.signalCode === null;
  }

  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  start(): void {
    if (this.running) throw new Error(`${this.name} already runs (pid ${this.#proc?.pid})`);
    const fd = openSync(this.logPath, "a");
    try {
      this.#proc = Bun.spawn(this.argv, { env: this.env, stdout: fd, stderr: fd, stdin: "ignore" });
    } finally {
      closeSync(fd);
    }
    this.starts++;
  }

  /** kill -9 and wait for it to be gone (at most 10 s). */
  async kill(): Promise<void> {
    const p = this.#proc;
    if (!p || !this.running) return;
    p.kill("SIGKILL");
    await Promise.race([p.exited, Bun.sleep(10_000)]);
    if (this.running) throw new Error(`${this.name} (pid ${p.pid}) still runs 10 s after SIGKILL`);
  }

  /** True when it ended without being killed by us (a crash of its own). */
  exitedOnItsOwn(): string | undefined {
    const p = this.#proc;
    if (!p || this.running) return undefined;
    if (p.signalCode === "SIGKILL") return undefined;
    return `exit ${p.exitCode ?? p.signalCode}`;
  }
}

export interface World {
  dir: string;
  fabricDir: string;
  nodes: WorldNode[];
  /** kill -9 of node i's agent / nvmf_tgt; their restarts. */
  killAgent(i: number): Promise<void>;
  startAgent(i: number): Promise<void>;
  killTarget(i: number): Promise<void>;
  startTarget(i: number): Promise<void>;
  killManager(): Promise<void>;
  startManager(): Promise<void>;
  /** Children that ended without a kill of ours (crashes), by name. */
  unexpectedExits(): string[];
  /** Ends every child (SIGKILL, by PID). */
  stop(): Promise<void>;
}

/** Waits until `ok` (bounded by `ms`); throws `what` otherwise. */
async function until(ok: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await ok().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await Bun.sleep(100);
  }
}

/**
 * Starts the targets, agents and the manager, and claims every node's drive into the namespace
 * (the manager's claim controller binds them). Resolves once every target answers RPCs.
 */
export async function startWorld(o: WorldOptions): Promise<World> {
  const logs = join(o.dir, "logs");
  const fabricDir = join(o.dir, "f");
  mkdirSync(logs, { recursive: true });
  mkdirSync(fabricDir, { recursive: true });
  const nodes: WorldNode[] = [];
  const targets: Child[] = [];
  const agents: Child[] = [];
  const common = {
    PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
    HOME: process.env.HOME ?? "/root",
    DISTORT_LOG_LEVEL: o.logLevel ?? "warn",
  };
  for (let i = 0; i < o.nodes; i++) {
    const name = `chaos-${String.fromCharCode(97 + i)}`;
    const address = `127.0.${o.addressOctet}.${i + 1}`;
    const serial = `SIMCHAOS${i}${o.addressOctet}`.slice(0, 20);
    const dir = join(o.dir, name);
    const hostRoot = join(dir, "host");
    const dataDir = join(dir, "data");
    mkdirSync(dataDir, { recursive: true });
    const drive: SimNodeDrive & { model: string } = {
      serial,
      pciAddress: "0000:3c:00.0",
      sizeBytes: 2 * GiB,
      model: "DISTORT SIM NVMe",
    };
    await buildDriveSysfs(hostRoot, [drive]);
    const drivesFile = join(dataDir, "drives.json");
    writeFileSync(drivesFile, JSON.stringify([drive]));
    const spdkSocket = join(dir, "spdk.sock");
    nodes.push({ name, address, serial, hostRoot, spdkSocket });
    targets.push(
      new Child(
        `nvmf_tgt/${name}`,
        targetArgv({ socketPath: spdkSocket, dataDir, fabricDir, drivesFile, hostAddresses: [address] }),
        common,
        join(logs, `nvmf_tgt-${name}.log`),
      ),
    );
    agents.push(
      new Child(
        `agent/${name}`,
        [BUN, join(ROOT, "agent/main.ts")],
        {
          ...common,
          NODE_NAME: name,
          KUBECONFIG: o.kubeconfigPath,
          DISTORT_NAMESPACE: o.namespace,
          DISTORT_BACKENDS: "spdk",
          DISTORT_SPDK_SOCKET: spdkSocket,
          DISTORT_HOST_ROOT: hostRoot,
          DISTORT_KEY_DIR: join(dir, "keys"),
          DISTORT_PORTAL_ADDRESS: address,
          DISTORT_PORTAL_PORT: String(o.port),
          DISTORT_HEALTH_PORT: "0",
          DISTORT_REPORT_PERIOD_MS: "1000",
          DISTORT_VERIFY_PERIOD_MS: "1000",
          DISTORT_NEXUS_DEGRADE_AFTER_MS: String(o.degradeAfterMs),
          DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: String(o.rebuildMbPerSec),
        },
        join(logs, `agent-${name}.log`),
      ),
    );
  }
  const manager = new Child(
    "manager",
    [BUN, join(ROOT, "manager/main.ts")],
    {
      ...common,
      DISTORT_KUBECONFIG: o.kubeconfigPath,
      DISTORT_NAMESPACE: o.namespace,
      DISTORT_LEADER_ELECT: "false",
      DISTORT_HEARTBEAT_STALENESS_MS: String(o.stalenessMs),
      DISTORT_PLACEMENT_BACKOFF_INITIAL_MS: "200",
      DISTORT_PLACEMENT_BACKOFF_MAX_MS: "2000",
      DISTORT_HEALTH_PORT: "0",
    },
    join(logs, "manager.log"),
  );
  const all = [...targets, ...agents, manager];
  const startTarget = async (i: number) => {
    const t = targets[i] as Child;
    t.start();
    await until(() => spdkAnswers((nodes[i] as WorldNode).spdkSocket), 30_000, `${t.name} answering`);
  };
  const world: World = {
    dir: o.dir,
    fabricDir,
    nodes,
    killAgent: (i) => (agents[i] as Child).kill(),
    startAgent: async (i) => (agents[i] as Child).start(),
    killTarget: (i) => (targets[i] as Child).kill(),
    startTarget,
    killManager: () => manager.kill(),
    startManager: async () => manager.start(),
    unexpectedExits: () =>
      all.flatMap((c) => {
        const why = c.exitedOnItsOwn();
        return why ? [`${c.name} ${why}`] : [];
      }),
    async stop() {
      for (const c of all) await c.kill().catch(() => {});
    },
  };
  try {
    for (let i = 0; i < o.nodes; i++) await startTarget(i);
    for (let i = 0; i < o.nodes; i++) await world.startAgent(i);
    await world.startManager();
    const claims = new ResourceClient(o.conn, kinds.NVMeDeviceClaim);
    for (const n of nodes)
      await claims.create({
        apiVersion: "storage.distort.io/v1alpha1",
        kind: "NVMeDeviceClaim",
        metadata: { name: `claim-${n.name}`, namespace: o.namespace },
        spec: { serial: n.serial, nodeName: n.name },
      } as NVMeDeviceClaim);
  } catch (err) {
    await world.stop();
    throw err;
  }
  return world;
}
