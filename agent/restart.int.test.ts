// The agent supervising an emulated nvmf_tgt that is SIGKILLed: every export comes back, and the
// expected repairs are reported once for the node (TargetRestarted on its RDMAStorageNode), not
// per partition; an export that drifts without a restart still gets its own ExportRepaired. A
// partition's QoS limits are re-applied on the restarted target, and follow spec.qos changes live.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
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
  pciAddress: "0000:5e:00.0",
  serial: "SIMR0001",
  model: "DISTORT SIM NVMe",
  sizeBytes: 8 * 2 ** 30,
};
const NODE = "node-r";
const PARTS = ["r0", "r1", "r2"];
/** r0's spec.qos. */
const R0_QOS = { rwIosPerSec: 4000, wMBytesPerSec: 30 };

let tc: TestCluster;
let dir: string;
let ns: string;
let agent: RunningAgent;
let spdk: SpdkClient;
let m: SpdkMethods;
let parts: ResourceClient<NVMePartition>;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("restart");
  dir = mkdtempSync(join(tmpdir(), "distort-restart-"));
  const { hostRoot, dataDir, drivesFile } = await emulatedDriveFiles(dir, DRIVE);
  const socketPath = join(dir, "spdk.sock");
  const cfg = parseAgentConfig({
    NODE_NAME: NODE,
    KUBECONFIG: tc.kubeconfigPath,
    DISTORT_NAMESPACE: ns,
    DISTORT_BACKENDS: "spdk",
    DISTORT_SPDK_SOCKET: socketPath,
    DISTORT_NVMF_TGT: `${process.execPath} ${EMULATOR} --sim-data-dir ${dataDir} --sim-drives ${drivesFile}`,
    DISTORT_HOST_ROOT: hostRoot,
    DISTORT_KEY_DIR: join(dir, "keys"),
    DISTORT_PORTAL_ADDRESS: "127.0.0.1",
    DISTORT_PORTAL_PORT: "4420",
    DISTORT_HEALTH_PORT: "0",
    DISTORT_REPORT_PERIOD_MS: "1000",
    DISTORT_VERIFY_PERIOD_MS: "1000",
  });
  agent = await runAgent(cfg, createLogger({ level: "error" }));
  spdk = new SpdkClient({ socketPath, logger: silentLogger, reconnect: { initialMs: 50, maxMs: 200 } });
  m = new SpdkMethods(spdk);
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  await placeOnReportedDrive(tc.conn, ns, DRIVE.serial, PARTS, 8 * 2 ** 20, (p) => {
    if (p.metadata.name === "r0") p.spec.qos = R0_QOS;
  });
  await eventually(
    async () => (await parts.list({ namespace: ns })).items.every((p) => p.status?.state === "Exported"),
    30_000,
    "every partition Exported",
  );
}, 120_000);

afterAll(async () => {
  await spdk?.close();
  await agent?.stop();
  await tc?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function events(reason: string): Promise<k8s.EventsV1Event[]> {
  const list = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
  return list.items.filter((e) => e.reason === reason);
}

/** NQNs the target serves completely (namespace 1 and a listener). */
async function servedNqns(): Promise<string[]> {
  const subs = await m.nvmfGetSubsystems(undefined, { timeoutMs: 2000 });
  return subs
    .filter((s) => s.namespaces?.some((n) => n.nsid === 1) && s.listen_addresses.length === 1)
    .map((s) => s.nqn)
    .sort();
}

/** The assigned_rate_limits of partition `name`'s bdev on the target now. */
async function targetLimits(name: string): Promise<unknown> {
  const p = (await parts.get(name, ns)) as NVMePartition;
  const [b] = await m.bdevGetBdevs({ name: p.status?.backendPath as string }, { timeoutMs: 2000 });
  return b?.assigned_rate_limits;
}
const R0_ON_TARGET = {
  rw_ios_per_sec: 4000,
  rw_mbytes_per_sec: 0,
  r_mbytes_per_sec: 0,
  w_mbytes_per_sec: 30,
};

test("spec.qos is on the target and reported in status before any restart", async () => {
  expect(await targetLimits("r0")).toEqual(R0_ON_TARGET);
  expect((await parts.get("r0", ns))?.status?.qos).toEqual({
    rwIosPerSec: 4000,
    rwMBytesPerSec: 0,
    rMBytesPerSec: 0,
    wMBytesPerSec: 30,
  });
  expect((await parts.get("r1", ns))?.status?.qos).toEqual({
    rwIosPerSec: 0,
    rwMBytesPerSec: 0,
    rMBytesPerSec: 0,
    wMBytesPerSec: 0,
  });
});

/** The pid of the emulated nvmf_tgt the agent's supervisor spawned for this test. */
function targetPid(): number {
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, "utf8");
      if (cmd.includes(EMULATOR) && cmd.includes(dir)) return Number(name);
    } catch {
      // exited while looked at
    }
  }
  throw new Error("no nvmf_tgt emulator process for this test");
}

test("a SIGKILLed target: every export back, one TargetRestarted for the node, no ExportRepaired per partition", async () => {
  const nqns = (await parts.list({ namespace: ns })).items.map((p) => p.status?.nqn as string).sort();
  expect(await servedNqns()).toEqual(nqns);
  process.kill(targetPid(), "SIGKILL");
  const [summary] = await eventually(
    async () => {
      const e = await events("TargetRestarted");
      return e.length > 0 ? e : undefined;
    },
    30_000,
    "the TargetRestarted Event",
  );
  expect(await servedNqns()).toEqual(nqns);
  expect(summary?.type).toBe("Warning");
  expect(summary?.regarding).toMatchObject({ kind: "RDMAStorageNode", name: NODE, namespace: ns });
  expect(summary?.note).toContain(`${PARTS.length} of ${PARTS.length} repaired`);
  // The restarted target knew no limits: the replay put r0's back.
  await eventually(
    async () =>
      JSON.stringify(await targetLimits("r0").catch(() => undefined)) === JSON.stringify(R0_ON_TARGET),
    15_000,
    "r0's limits back on the restarted target",
  );
  // A few verify periods later: still one summary, and no partition was reported on its own.
  await Bun.sleep(2500);
  expect(await events("TargetRestarted")).toHaveLength(1);
  expect(await events("ExportRepaired")).toEqual([]);
  const all = (await parts.list({ namespace: ns })).items;
  expect(all.every((p) => p.status?.state === "Exported")).toBe(true);
}, 60_000);

test("an export that drifts without a restart is still reported on its partition", async () => {
  const p = (await parts.get("r1", ns)) as NVMePartition;
  const nqn = p.status?.nqn as string;
  await m.nvmfSubsystemRemoveListener({
    nqn,
    listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.1", trsvcid: "4420" },
  });
  const [drift] = await eventually(
    async () => {
      const e = await events("ExportRepaired");
      return e.length > 0 ? e : undefined;
    },
    15_000,
    "the ExportRepaired Event",
  );
  expect(drift?.type).toBe("Warning");
  expect(drift?.regarding).toMatchObject({ kind: "NVMePartition", name: "r1" });
  expect(drift?.note).toContain("listener");
  expect((await servedNqns()).includes(nqn)).toBe(true);
  expect(await events("TargetRestarted")).toHaveLength(1);
}, 30_000);

test("a spec.qos change is applied online and reported in status", async () => {
  await parts.mergePatch("r2", ns, { spec: { qos: { rMBytesPerSec: 70 } } });
  await eventually(
    async () => (await parts.get("r2", ns))?.status?.qos?.rMBytesPerSec === 70,
    15_000,
    "r2's status.qos at 70 MiB/s read",
  );
  expect(await targetLimits("r2")).toEqual({
    rw_ios_per_sec: 0,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 70,
    w_mbytes_per_sec: 0,
  });
  // Removing spec.qos lifts every limit.
  await parts.jsonPatch("r2", ns, [{ op: "remove", path: "/spec/qos" }]);
  await eventually(
    async () => (await parts.get("r2", ns))?.status?.qos?.rMBytesPerSec === 0,
    15_000,
    "r2 unlimited again",
  );
  expect(await targetLimits("r2")).toEqual({
    rw_ios_per_sec: 0,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 0,
    w_mbytes_per_sec: 0,
  });
}, 40_000);
