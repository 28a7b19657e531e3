// The agent with nvmf_tgt in a process of its own (DISTORT_NVMF_TGT_EXTERNAL, the chart's
// separate target DaemonSet), against the real kube-apiserver and the emulator started here with
// --wait-for-rpc: the agent initialises and adopts it; an agent replaced as in an upgrade leaves
// every subsystem served the whole time (sampled while no agent runs) and starts nothing; a target
// killed and started again empty is adopted anew and every export comes back without an agent
// restart, with TargetRestarted on the node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { kinds, type NVMePartition } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { emulatedDriveFiles, placeOnReportedDrive } from "../lab/harness/storage-node.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";

const EMULATOR = join(import.meta.dir, "..", "lab", "sim", "spdk", "nvmf-tgt.ts");
const DRIVE = {
  pciAddress: "0000:5f:00.0",
  serial: "SIMX0001",
  model: "DISTORT SIM NVMe",
  sizeBytes: 4 * 2 ** 30,
};
const NODE = "node-x";
const PARTS = ["x0", "x1", "x2"];

let tc: TestCluster;
let dir: string;
let ns: string;
let socketPath: string;
let dataDir: string;
let drivesFile: string;
let target: Subprocess | undefined;
let agent: RunningAgent | undefined;
let spdk: SpdkClient;
let m: SpdkMethods;
let parts: ResourceClient<NVMePartition>;
let agentEnv: Record<string, string>;

/** Starts the emulator as the target container would: waiting for framework_start_init. */
function startTarget(): Subprocess {
  return Bun.spawn(
    [
      process.execPath,
      EMULATOR,
      "-m",
      "0x1",
      "-r",
      socketPath,
      "--wait-for-rpc",
      "--sim-data-dir",
      dataDir,
      "--sim-drives",
      drivesFile,
    ],
    { stdout: "ignore", stderr: "ignore", stdin: "ignore" },
  );
}

/** NQNs the target serves completely (namespace 1 and a listener). */
async function servedNqns(): Promise<string[]> {
  const subs = await m.nvmfGetSubsystems(undefined, { timeoutMs: 2000 });
  return subs
    .filter((s) => s.namespaces?.some((n) => n.nsid === 1) && s.listen_addresses.length >= 1)
    .map((s) => s.nqn)
    .sort();
}

async function exportedNqns(): Promise<string[]> {
  const items = (await parts.list({ namespace: ns })).items;
  return items
    .filter((p) => p.status?.state === "Exported")
    .map((p) => p.status?.nqn as string)
    .sort();
}

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("external-target");
  dir = mkdtempSync(join(tmpdir(), "distort-ext-"));
  const files = await emulatedDriveFiles(dir, DRIVE);
  const hostRoot = files.hostRoot;
  dataDir = files.dataDir;
  drivesFile = files.drivesFile;
  socketPath = join(dir, "spdk.sock");
  agentEnv = {
    NODE_NAME: NODE,
    KUBECONFIG: tc.kubeconfigPath,
    DISTORT_NAMESPACE: ns,
    DISTORT_BACKENDS: "spdk",
    DISTORT_SPDK_SOCKET: socketPath,
    DISTORT_NVMF_TGT_EXTERNAL: "true",
    DISTORT_SPDK_CORE_MASK: "0x1",
    DISTORT_HOST_ROOT: hostRoot,
    DISTORT_KEY_DIR: join(dir, "keys"),
    DISTORT_PORTAL_ADDRESS: "127.0.0.1",
    DISTORT_PORTAL_PORT: "4420",
    DISTORT_HEALTH_PORT: "0",
    DISTORT_REPORT_PERIOD_MS: "1000",
    // Long enough that only a detected restart, not the periodic pass, can bring exports back
    // within the bounds below.
    DISTORT_VERIFY_PERIOD_MS: "600000",
  };
  // The agent comes first, as a DaemonSet Pod may: it waits for the target.
  const starting = runAgent(parseAgentConfig(agentEnv), createLogger({ level: "error" }));
  await Bun.sleep(1500);
  target = startTarget();
  agent = await starting;
  spdk = new SpdkClient({ socketPath, logger: silentLogger, reconnect: { initialMs: 50, maxMs: 200 } });
  m = new SpdkMethods(spdk);
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  await placeOnReportedDrive(tc.conn, ns, DRIVE.serial, PARTS, 8 * 2 ** 20);
  await eventually(
    async () => (await exportedNqns()).length === PARTS.length || undefined,
    30_000,
    "every partition Exported",
  );
}, 180_000);

afterAll(async () => {
  await spdk?.close();
  await agent?.stop();
  target?.kill("SIGKILL");
  await target?.exited;
  await tc?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("the agent initialised the target it found waiting, and serves every export on it", async () => {
  const [reactors] = await Promise.all([m.frameworkGetReactors({ timeoutMs: 2000 })]);
  expect(reactors.pid).toBe(target?.pid);
  expect(await servedNqns()).toEqual(await exportedNqns());
});

test("an agent replaced as in an upgrade: the target keeps serving throughout and is not restarted", async () => {
  const before = await servedNqns();
  const pid = target?.pid;
  await agent?.stop();
  agent = undefined;
  // No agent now: the target is untouched and still serves every subsystem, sampled for a while.
  for (let i = 0; i < 10; i++) {
    expect(target?.exitCode).toBeNull();
    expect(await servedNqns()).toEqual(before);
    await Bun.sleep(200);
  }
  agent = await runAgent(parseAgentConfig(agentEnv), createLogger({ level: "error" }));
  const reactors = await m.frameworkGetReactors({ timeoutMs: 2000 });
  expect(reactors.pid).toBe(pid);
  expect(await servedNqns()).toEqual(before);
  // The new agent verified the exports; it did not re-create them (no target restart seen).
  await Bun.sleep(2000);
  const restarts = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
  expect(restarts.items.filter((e) => e.reason === "TargetRestarted")).toEqual([]);
}, 60_000);

test("a target killed and started again empty is adopted anew: every export back without an agent restart", async () => {
  const want = await exportedNqns();
  target?.kill("SIGKILL");
  await target?.exited;
  target = startTarget();
  const t0 = Date.now();
  await eventually(
    async () => {
      try {
        const served = await servedNqns();
        return served.length === want.length && served.every((n, i) => n === want[i]) ? served : undefined;
      } catch {
        return undefined;
      }
    },
    30_000,
    "every export served by the new target",
  );
  const took = Date.now() - t0;
  // Far inside the 10-minute verify period: the supervisor saw the new target.
  expect(took).toBeLessThan(30_000);
  const reactors = await m.frameworkGetReactors({ timeoutMs: 2000 });
  expect(reactors.pid).toBe(target.pid);
  await eventually(
    async () => {
      const list = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
      return list.items.find((e) => e.reason === "TargetRestarted");
    },
    15_000,
    "TargetRestarted reported",
  );
}, 60_000);
