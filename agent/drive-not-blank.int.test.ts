// The agent against the real kube-apiserver and the nvmf_tgt emulator, on a drive that still holds
// someone's filesystem (made with the real mkfs.ext4): a partition placed on it stays Pending with
// Ready=False DriveNotBlank and a Warning Event, and no lvstore, lvol or subsystem is created.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { kinds, type NVMeDevice } from "../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import {
  claimDevice,
  createPlaced,
  placedPartition,
  type SimStorageNode,
  startSimStorageNode,
} from "../lab/harness/storage-node.ts";
import { hostExec, runChecked } from "../lib/exec.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { parseAgentConfig } from "./config.ts";
import { type RunningAgent, runAgent } from "./main.ts";

const GiB = 1024 ** 3;
const PCI = "0000:3b:00.0";

let tc: TestCluster;
let node: SimStorageNode;
let agent: RunningAgent;
let ns: string;
let device: NVMeDevice;

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("not-blank");
  node = await startSimStorageNode({
    nodeName: "node-nb",
    drives: [{ serial: "SIMNB001", pciAddress: PCI, sizeBytes: GiB }],
  });
  // The drive's bytes as an earlier user left them: an ext4 filesystem over the whole namespace.
  const image = join(node.dir, "drives", "drives", `${PCI.replaceAll(":", "_")}.img`);
  await runChecked(hostExec, ["mkfs.ext4", "-q", "-F", "-L", "someones-data", image], { timeoutMs: 60_000 });
  agent = await runAgent(
    parseAgentConfig(node.agentEnv(tc.kubeconfigPath, ns)),
    createLogger({ level: (process.env.DISTORT_TEST_LOG as "info") ?? "warn" }),
  );
  const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
  device = await eventually(
    async () => (await devices.list()).items.find((d) => d.spec.serial === "SIMNB001"),
    15_000,
    "NVMeDevice reported",
  );
}, 300_000);

afterAll(async () => {
  await agent?.stop();
  await node?.close();
  await tc?.stop();
});

test("a partition on a drive holding a filesystem waits with DriveNotBlank and nothing is created", async () => {
  const claim = await claimDevice(tc.conn, device, ns);
  await createPlaced(tc.conn, placedPartition("p-nb", ns, device, claim, 64 * 1024 * 1024), device);
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const pending = await eventually(
    async () => {
      const p = await parts.get("p-nb", ns);
      return p?.status?.conditions?.find((c) => c.type === "Ready")?.reason === "DriveNotBlank"
        ? p
        : undefined;
    },
    20_000,
    "DriveNotBlank",
  );
  expect(pending.status?.state).toBe("Pending");
  expect(pending.status?.conditions?.find((c) => c.type === "Ready")?.message).toContain(
    "a filesystem (ext4)",
  );
  const events = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: ns });
  expect(events.items.some((e) => e.reason === "DriveNotBlank" && e.type === "Warning")).toBe(true);
  const s = node.emulator.state();
  expect(s.lvstores).toEqual([]);
  expect(s.lvols).toEqual([]);
  expect(s.subsystems.filter((x) => x.nqn.includes("volume"))).toEqual([]);
}, 60_000);
