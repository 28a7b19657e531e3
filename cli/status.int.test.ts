// `distort status` against a real API server, run as a subprocess the way a user runs it: the
// objects of one namespace are listed, an unhealthy condition turns the exit code to 1, and an
// unreachable server gives exit code 2 with a message naming it.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kinds } from "../api/kinds.ts";
import type { NVMeDevice } from "../api/nvme-device.ts";
import type { NVMePartition, NVMePartitionStatus } from "../api/nvme-partition.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { RDMAStorageNode } from "../api/rdma-storage-node.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { type Condition, formatConditionTime, setCondition } from "../lib/kube/conditions.ts";
import { type KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import { updateStatus } from "../lib/kube/status.ts";
import type { StatusReport } from "./status-table.ts";

const root = join(import.meta.dir, "..");
const GiB = 1024 ** 3;

let tc: TestCluster;
let ns: string;
let scratch: string;
const id = randomBytes(4).toString("hex");
const nodeName = `status-node-${id}`;
const serial = `STATUS${id.toUpperCase()}`;
const deviceName = `status-dev-${id}`;
let partitionUid = "";

beforeAll(async () => {
  tc = await testCluster();
  ns = await tc.namespace("status");
  scratch = mkdtempSync(join(tmpdir(), "distort-status-"));
}, 300_000);

afterAll(async () => {
  // NVMeDevice is cluster-scoped: the namespace does not isolate it from other files' tests.
  if (tc) await new ResourceClient(tc.conn, kinds.NVMeDevice).delete(deviceName).catch(() => {});
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await tc?.stop();
});

/** Creates `obj` without its status, then writes the status through the /status subresource. */
async function createWithStatus<T extends KubeObject & { status?: unknown }>(
  client: ResourceClient<T>,
  obj: T,
): Promise<T> {
  const { status, ...spec } = obj;
  const created = await client.create(spec as T);
  const stored = await updateStatus(client, created.metadata.name, created.metadata.namespace, () => status);
  if (!stored) throw new Error(`${obj.kind} ${obj.metadata.name} vanished`);
  return stored;
}

function ok(type: string, reason: string, message = ""): Condition {
  return { type, status: "True", reason, message, lastTransitionTime: formatConditionTime(new Date()) };
}

async function runStatus(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const p = Bun.spawn([process.execPath, "cli/status.ts", ...args], {
    cwd: root,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, KUBECONFIG: "" },
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, stdout, stderr };
}

test("lists a namespace's node, device, partition and attachment; exit code follows health", async () => {
  const now = new Date();
  await createWithStatus(new ResourceClient(tc.conn, kinds.RDMAStorageNode), {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name: nodeName, namespace: ns },
    spec: { nodeName },
    status: {
      rdmaIP: "192.168.100.10",
      transport: "rdma",
      totalBytes: 100 * GiB,
      freeBytes: 90 * GiB,
      exportCount: 1,
      lastHeartbeatTime: now.toISOString(),
      conditions: [ok("Ready", "RdmaEndpointReady"), ok("NVMeInventoryReady", "InventoryComplete")],
    },
  } satisfies RDMAStorageNode);

  const partClient = new ResourceClient(tc.conn, kinds.NVMePartition);
  const partition = await partClient.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: "pvc-status", namespace: ns },
    spec: {
      sizeBytes: 10 * GiB,
      nodeName,
      deviceSerial: serial,
      backend: "spdk",
      volumeManager: "partition",
    },
  } satisfies NVMePartition);
  partitionUid = partition.metadata.uid ?? "";
  await updateStatus(
    partClient,
    "pvc-status",
    ns,
    (): NVMePartitionStatus => ({
      state: "Exported",
      externalId: `vol-${id}`,
      volumeHandle: `${ns}/pvc-status`,
      nqn: `nqn.2026-02.io.distort:volume-vol-${id}`,
      portalIP: "192.168.100.10",
      portalPort: 4420,
      transport: "rdma",
      allocatedBytes: 10 * GiB,
      conditions: [ok("Ready", "Exported", "listening on rdma")],
    }),
  );

  await createWithStatus(new ResourceClient(tc.conn, kinds.NVMeDevice), {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDevice",
    metadata: { name: deviceName },
    spec: {
      nodeName,
      pciAddress: "0000:3b:00.0",
      serial,
      model: "STATUS TEST DRIVE",
      allocatableBytes: 100 * GiB,
      numaNode: 0,
    },
    status: {
      phase: "Claimed",
      claimRef: { namespace: ns, name: "drive", uid: `claim-${id}` },
      freeBytes: 90 * GiB,
      activeBackend: "spdk",
      reservations: [{ uid: partitionUid, namespace: ns, name: "pvc-status", bytes: 10 * GiB }],
      conditions: [ok("Present", "BoundToSpdk")],
    },
  } satisfies NVMeDevice);

  await createWithStatus(new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment), {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: `va-${partitionUid}`, namespace: ns },
    spec: {
      partitionName: "pvc-status",
      partitionUID: partitionUid,
      nodeId: "worker-1",
      hostNQN: "nqn.2014-08.org.nvmexpress:uuid:7d3a0a36-6c1f-4c55-9a51-1f2b3c4d5e6f",
      attachmentId: "att-1",
    },
    status: { observedAttachmentId: "att-1", conditions: [ok("AccessReady", "HostAllowed")] },
  } satisfies NVMeVolumeAttachment);

  const healthy = await runStatus("--kubeconfig", tc.kubeconfigPath, "-n", ns);
  expect(healthy.stderr).toBe("");
  expect(healthy.stdout).toMatch(
    new RegExp(`${ns}/${nodeName}\\s+${nodeName}\\s+True\\s+yes\\s+\\d+s\\s+spdk\\s+1\\n`),
  );
  expect(healthy.stdout).toMatch(
    new RegExp(
      `${nodeName}\\s+${serial}\\s+STATUS TEST DRIVE\\s+100\\.0GiB\\s+10\\.0GiB\\s+90\\.0GiB\\s+Claimed\\s+${ns}/drive\\s+1\\s+ok\\n`,
    ),
  );
  expect(healthy.stdout).toMatch(
    new RegExp(
      `${ns}/pvc-status\\s+10\\.0GiB\\s+${nodeName}\\s+${serial}\\s+spdk\\s+Exported\\s+rdma://192\\.168\\.100\\.10:4420\\s+worker-1\\s+${ns}/pvc-status\\s+`,
    ),
  );
  expect(healthy.stdout).toMatch(
    new RegExp(`${ns}/va-${partitionUid}\\s+pvc-status\\s+worker-1\\s+Ready\\s+`),
  );
  expect(healthy.stdout).toContain("UNHEALTHY\n(none)\n");
  expect(healthy.stdout).toContain(
    "TOTAL: 1 device (1 Claimed), 100.0GiB claimed, 90.0GiB free; 1 partition (1 Exported); 1 attachment; 0 unhealthy",
  );
  expect(healthy.code).toBe(0);

  const failure = "device not found by a complete scan";
  await updateStatus(partClient, "pvc-status", ns, (p) => ({
    ...p.status!,
    conditions: setCondition(
      p.status?.conditions ?? [],
      { type: "Ready", status: "False", reason: "DeviceNotFound", message: failure },
      new Date(),
    ),
  }));
  const sick = await runStatus("--kubeconfig", tc.kubeconfigPath, "--namespace", ns);
  expect(sick.stdout).toMatch(
    new RegExp(
      `\\nNVMePartition\\s+${ns}/pvc-status\\s+Ready=False\\s+DeviceNotFound\\s+\\d+s\\s+${failure}\\n`,
    ),
  );
  expect(sick.code).toBe(1);

  const json = await runStatus("--kubeconfig", tc.kubeconfigPath, "-n", ns, "-o", "json");
  expect(json.code).toBe(1);
  const doc = JSON.parse(json.stdout) as StatusReport;
  expect(doc.namespace).toBe(ns);
  expect(doc.healthy).toBe(false);
  expect(doc.devices.map((d) => [d.name, d.serial, d.reservedBytes])).toEqual([
    [deviceName, serial, 10 * GiB],
  ]);
  expect(doc.partitions.map((p) => [p.name, p.phase, p.attachedTo])).toEqual([
    ["pvc-status", "Exported", ["worker-1"]],
  ]);
  expect(doc.attachments.map((a) => a.phase)).toEqual(["Ready"]);
  expect(doc.unhealthy.map((u) => [u.kind, u.name, u.type, u.reason])).toEqual([
    ["NVMePartition", "pvc-status", "Ready", "DeviceNotFound"],
  ]);
}, 60_000);

test("an unreachable API server exits 2 and says which server", async () => {
  const kubeconfig = join(scratch, "unreachable");
  writeFileSync(
    kubeconfig,
    [
      "apiVersion: v1",
      "kind: Config",
      "clusters:",
      "- name: gone",
      "  cluster:",
      "    server: https://127.0.0.1:1",
      "users:",
      "- name: u",
      "  user:",
      "    token: t",
      "contexts:",
      "- name: gone",
      "  context:",
      "    cluster: gone",
      "    user: u",
      "current-context: gone",
      "",
    ].join("\n"),
  );
  const r = await runStatus("--kubeconfig", kubeconfig);
  expect(r.code).toBe(2);
  expect(r.stdout).toBe("");
  expect(r.stderr).toBe(
    "distort status: cannot reach the API server at https://127.0.0.1:1: connection refused\n",
  );
}, 30_000);

test("usage errors exit 2 before contacting anything", async () => {
  const both = await runStatus("--kubeconfig", tc.kubeconfigPath, "-n", ns, "-A");
  expect(both.code).toBe(2);
  expect(both.stderr).toContain("--namespace and --all-namespaces cannot be used together");
  const missing = await runStatus("--kubeconfig", join(scratch, "no-such-file"));
  expect(missing.code).toBe(2);
  expect(missing.stderr).toContain("does not exist");
}, 30_000);
