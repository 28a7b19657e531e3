// Crash points: for every step of provisioning and deletion, (1) the agent process is killed
// (SIGKILL, no cleanup) right after that step and a new agent is started, and (2) the emulated
// nvmf_tgt is killed and restarted right after that step while the agent keeps running. Each time
// the system must converge with zero duplicates and zero leaks in the target.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { kinds, type NVMeDevice, type NVMeDeviceClaim, type NVMePartition } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { updateStatus } from "../lib/kube/status.ts";
import { createLogger } from "../lib/log.ts";
import { parseAgentConfig } from "./config.ts";
import { runAgent } from "./main.ts";
import { DEPROVISION_STEPS, PROVISION_STEPS, type Step } from "./partitions/controller.ts";
import { nqnFor } from "./partitions/identity.ts";

const GiB = 1024 ** 3;
const MAIN = join(import.meta.dir, "main.ts");

let tc: TestCluster;
let node: SimStorageNode;
let ns: string;
let device: NVMeDevice;
let claim: NVMeDeviceClaim;
let parts: ResourceClient<NVMePartition>;
const crashPoints: string[] = [];

const children = new Set<ReturnType<typeof Bun.spawn>>();

function spawnAgent(extra: Record<string, string> = {}) {
  const child = Bun.spawn([process.execPath, MAIN], {
    env: node.agentEnv(tc.kubeconfigPath, ns, { DISTORT_LOG_LEVEL: "error", ...extra }),
    stdout: "ignore",
    stderr: "inherit",
  });
  children.add(child);
  child.exited.then(() => children.delete(child));
  return child;
}

async function stopAgent(p: ReturnType<typeof spawnAgent>) {
  p.kill("SIGTERM");
  await Promise.race([p.exited, Bun.sleep(10_000)]);
  if (p.exitCode === null && p.signalCode === null) {
    p.kill("SIGKILL");
    await p.exited;
  }
}

/** The target holds exactly the live partitions' volumes and exports: no duplicate, no leak. */
async function assertConverged(): Promise<void> {
  const live = (await parts.list({ namespace: ns })).items;
  const s = node.emulator.state();
  const byName = new Map<string, number>();
  for (const l of s.lvols) byName.set(l.name, (byName.get(l.name) ?? 0) + 1);
  expect([...byName.values()].every((n) => n === 1)).toBe(true);
  const wantVols = live.map((p) => p.status?.externalId).sort();
  expect([...byName.keys()].sort()).toEqual(wantVols as string[]);
  const subs = s.subsystems.filter((x) => x.subtype === "NVMe");
  expect(subs.map((x) => x.nqn).sort()).toEqual(
    live.map((p) => nqnFor(p.status?.externalId as string)).sort(),
  );
  for (const sub of subs) {
    const p = live.find((x) => x.status?.nqn === sub.nqn) as NVMePartition;
    const lvol = s.lvols.find((l) => l.name === p.status?.externalId);
    expect(sub.allowAnyHost).toBe(false);
    expect(sub.namespaces.map((n) => `${n.nsid}:${n.bdevName}`)).toEqual([`1:${lvol?.uuid}`]);
    expect(sub.listeners).toHaveLength(1);
  }
}

/** The lock step only runs on an unlocked drive: clear the lock so that step is reached again. */
async function unlockDeviceFor(step: Step): Promise<void> {
  if (step !== "device-lock") return;
  await updateStatus(
    new ResourceClient(tc.conn, kinds.NVMeDevice),
    device.metadata.name,
    undefined,
    (latest) => {
      const { activeBackend: _, ...rest } = latest.status ?? { phase: "Claimed" as const, conditions: [] };
      return rest as NonNullable<NVMeDevice["status"]>;
    },
  );
  // The agent decides from its watch cache; give the watch event time to arrive.
  await Bun.sleep(500);
}

async function exported(name: string): Promise<NVMePartition> {
  return eventually(
    async () => {
      const p = await parts.get(name, ns);
      return p?.status?.state === "Exported" ? p : undefined;
    },
    30_000,
    `${name} Exported`,
  );
}

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("crash");
  node = await startSimStorageNode({
    nodeName: "node-c",
    drives: [{ serial: "SIMC0001", pciAddress: "0000:5e:00.0", sizeBytes: 8 * GiB }],
  });
  parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const reporter = spawnAgent();
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMC0001"),
    20_000,
    "device",
  );
  await stopAgent(reporter);
  claim = await claimDevice(tc.conn, device, ns);
}, 300_000);

afterAll(async () => {
  // An agent whose fault never fired must not outlive the test run.
  for (const c of children) c.kill("SIGKILL");
  console.log(`crash points tested: ${crashPoints.length} (${crashPoints.join(", ")})`);
  await node?.close();
  await tc?.stop();
});

describe("agent killed right after each step", () => {
  for (const step of PROVISION_STEPS) {
    test(`provisioning: ${step}`, async () => {
      const name = `a-${step}`;
      await unlockDeviceFor(step);
      await createPlaced(tc.conn, placedPartition(name, ns, device, claim, 64 * 1024 * 1024), device);
      // Unlocking the drive re-enqueues every partition on it and any of them may take the lock
      // first, so that step's crash is armed for whichever partition takes it.
      const fault = step === "device-lock" ? step : `${step}@${ns}/${name}`;
      const crashing = spawnAgent({ DISTORT_FAULT_CRASH_AFTER: fault });
      await Promise.race([crashing.exited, Bun.sleep(30_000)]);
      const crashed = crashing.signalCode === "SIGKILL";
      if (!crashed) await stopAgent(crashing);
      expect(crashed).toBe(true);
      const recovering = spawnAgent();
      try {
        await exported(name);
        await assertConverged();
        crashPoints.push(`agent/${step}`);
      } finally {
        await stopAgent(recovering);
      }
    }, 90_000);
  }
  for (const step of DEPROVISION_STEPS) {
    test(`deletion: ${step}`, async () => {
      const name = `a-${PROVISION_STEPS[DEPROVISION_STEPS.indexOf(step)]}`;
      await parts.delete(name, ns);
      const crashing = spawnAgent({ DISTORT_FAULT_CRASH_AFTER: `${step}@${ns}/${name}` });
      await Promise.race([crashing.exited, Bun.sleep(30_000)]);
      const crashed = crashing.signalCode === "SIGKILL";
      if (!crashed) await stopAgent(crashing);
      expect(crashed).toBe(true);
      const recovering = spawnAgent();
      try {
        await eventually(async () => !(await parts.get(name, ns)), 30_000, `${name} gone`);
        await assertConverged();
        crashPoints.push(`agent/${step}`);
      } finally {
        await stopAgent(recovering);
      }
    }, 90_000);
  }
});

describe("nvmf_tgt killed and restarted right after each step", () => {
  const fired = new Set<string>();
  let pending: { step: Step; key: string } | undefined;
  let agent: Awaited<ReturnType<typeof runAgent>>;
  beforeAll(async () => {
    const cfg = parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns, { DISTORT_VERIFY_PERIOD_MS: "1000" }));
    agent = await runAgent(cfg, createLogger({ level: "error" }), {
      async afterStep(step, key) {
        // Unlocking the drive re-enqueues every partition on it, so any of them may take the lock
        // first: a crash right after that step counts whichever partition took it.
        const id = `${step}@${step === "device-lock" ? pending?.key : key}`;
        const keyMatches = pending?.key === key || step === "device-lock";
        if (pending && pending.step === step && keyMatches && !fired.has(id)) {
          fired.add(id);
          await node.emulator.crash();
          await node.emulator.restart();
        }
      },
    });
  });
  afterAll(async () => {
    await agent?.stop();
  });

  for (const step of PROVISION_STEPS) {
    test(`provisioning: ${step}`, async () => {
      const name = `t-${step}`;
      pending = { step, key: `${ns}/${name}` };
      await unlockDeviceFor(step);
      await createPlaced(tc.conn, placedPartition(name, ns, device, claim, 64 * 1024 * 1024), device);
      await eventually(() => fired.has(`${step}@${ns}/${name}`), 30_000, "target crash fired");
      await exported(name);
      // Every earlier export was lost with the crash too: the periodic verification restores them.
      await eventually(
        async () => {
          try {
            await assertConverged();
            return true;
          } catch {
            return false;
          }
        },
        30_000,
        "convergence",
      );
      await assertConverged();
      crashPoints.push(`nvmf_tgt/${step}`);
    }, 90_000);
  }
  for (const step of DEPROVISION_STEPS) {
    test(`deletion: ${step}`, async () => {
      const name = `t-${PROVISION_STEPS[DEPROVISION_STEPS.indexOf(step)]}`;
      pending = { step, key: `${ns}/${name}` };
      await parts.delete(name, ns);
      await eventually(() => fired.has(`${step}@${ns}/${name}`), 30_000, "target crash fired");
      await eventually(async () => !(await parts.get(name, ns)), 30_000, `${name} gone`);
      await eventually(
        async () => {
          try {
            await assertConverged();
            return true;
          } catch {
            return false;
          }
        },
        30_000,
        "convergence",
      );
      await assertConverged();
      crashPoints.push(`nvmf_tgt/${step}`);
    }, 90_000);
  }
});
