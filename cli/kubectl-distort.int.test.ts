// The compiled kubectl-distort plugin against a real API server, run the way an operator runs it
// (kubectl finds it on PATH as `kubectl distort`): describe volume follows a claim through every
// link and reports a broken one, fence/unfence write and remove the annotation ControllerPublish
// reads, and support-bundle writes an archive in which no Secret value appears (grepped).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { kinds } from "../api/kinds.ts";
import type { NVMeDevice } from "../api/nvme-device.ts";
import type { NVMePartition, NVMePartitionStatus } from "../api/nvme-partition.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { RDMAStorageNode } from "../api/rdma-storage-node.ts";
import { FENCED_ANNOTATION } from "../csi/controller/fencing.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { type Condition, formatConditionTime } from "../lib/kube/conditions.ts";
import { type KubeObject, ResourceClient } from "../lib/kube/resource.ts";
import { updateStatus } from "../lib/kube/status.ts";
import type { VolumeChain } from "./describe-volume.ts";

const root = join(import.meta.dir, "..");
const GiB = 1024 ** 3;
const KUBECTL = join(homedir(), ".cache", "distort", "kube", "v1.36.1", "kubectl");
const id = randomBytes(4).toString("hex");
const nodeA = `cli-node-a-${id}`;
const nodeB = `cli-node-b-${id}`;
const serial = `CLI${id.toUpperCase()}`;
const deviceName = `cli-dev-${id}`;
const pvName = `pvc-cli-${id}`;
const SECRET_VALUE = `hunter2-${randomBytes(12).toString("hex")}`;
const DHCHAP_KEY = `DHHC-1:00:${Buffer.from(randomBytes(36)).toString("base64")}:`;
const HOST_A = "nqn.2014-08.org.nvmexpress:uuid:7d3a0a36-6c1f-4c55-9a51-1f2b3c4d5e6f";

let tc: TestCluster;
let ns: string;
let app: string;
let scratch: string;
let bin: string;
let partitionUid = "";

async function run(argv: string[], opts: { viaKubectl?: boolean } = {}) {
  const cmd = opts.viaKubectl ? [KUBECTL, "distort", ...argv] : [join(bin, "kubectl-distort"), ...argv];
  const p = Bun.spawn(cmd, {
    cwd: scratch,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, KUBECONFIG: tc.kubeconfigPath },
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, stdout, stderr };
}

function cond(type: string, status: "True" | "False", reason: string, message = ""): Condition {
  return { type, status, reason, message, lastTransitionTime: formatConditionTime(new Date()) };
}

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

async function core(path: string, method: string, body: unknown): Promise<Record<string, unknown>> {
  const res = await tc.conn.request(path, {
    method,
    body: JSON.stringify(body),
    contentType: "application/json",
  });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return (await res.json()) as Record<string, unknown>;
}

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), "kubectl-distort-"));
  bin = join(scratch, "bin");
  mkdirSync(bin);
  const build = Bun.spawn([process.execPath, "scripts/build-cli.ts", join(bin, "kubectl-distort")], {
    cwd: root,
    stdout: "pipe",
    stderr: "pipe",
  });
  if ((await build.exited) !== 0) throw new Error(`build failed: ${await new Response(build.stderr).text()}`);
  tc = await testCluster();
  ns = await tc.namespace("cli-system");
  app = await tc.namespace("cli-app");

  await createWithStatus(new ResourceClient(tc.conn, kinds.RDMAStorageNode), {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "RDMAStorageNode",
    metadata: { name: nodeA, namespace: ns },
    spec: { nodeName: nodeA },
    status: {
      rdmaIP: "192.168.100.10",
      transport: "rdma",
      servedTransports: "tcp",
      totalBytes: 32 * GiB,
      freeBytes: 31 * GiB,
      total: "32Gi",
      free: "31Gi",
      exportCount: 1,
      spdkVersion: "v25.05.1",
      lastHeartbeatTime: new Date().toISOString(),
      conditions: [
        cond("Ready", "True", "RdmaEndpointReady", "192.168.100.10 on eth1"),
        cond("NVMeInventoryReady", "True", "InventoryComplete"),
      ],
    },
  } satisfies RDMAStorageNode);
  const parts = new ResourceClient(tc.conn, kinds.NVMePartition);
  const partition = await parts.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name: pvName, namespace: ns },
    spec: {
      sizeBytes: GiB,
      nodeName: nodeA,
      deviceSerial: serial,
      backend: "spdk",
      volumeManager: "spdk-lvol",
      targetOptions: { transport: "tcp", dhchapSecretRef: { name: "chap", key: "key" } },
    },
  } as NVMePartition);
  partitionUid = partition.metadata.uid ?? "";
  await updateStatus(
    parts,
    pvName,
    ns,
    (): NVMePartitionStatus => ({
      state: "Exported",
      externalId: `vol-${id}`,
      nqn: `nqn.2026-02.io.distort:volume-vol-${id}`,
      portalIP: "192.168.100.10",
      portalPort: 4420,
      transport: "tcp",
      allocatedBytes: GiB,
      capacity: "1Gi",
      conditions: [
        cond("Scheduled", "True", "Placed"),
        cond("Ready", "True", "Exported", "listening on tcp 192.168.100.10:4420"),
      ],
    }),
  );
  await createWithStatus(new ResourceClient(tc.conn, kinds.NVMeDevice), {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDevice",
    metadata: { name: deviceName },
    spec: {
      nodeName: nodeA,
      pciAddress: "0000:3b:00.0",
      serial,
      model: "CLI TEST DRIVE",
      allocatableBytes: 34015805440,
      numaNode: 0,
    },
    status: {
      phase: "Claimed",
      claimRef: { namespace: ns, name: "drive", uid: `claim-${id}` },
      freeBytes: 34015805440 - GiB,
      allocatable: "31.7Gi",
      free: "30.7Gi",
      activeBackend: "spdk",
      reservations: [{ uid: partitionUid, namespace: ns, name: pvName, bytes: GiB }],
      conditions: [cond("Present", "True", "BoundToSpdk")],
    },
  } satisfies NVMeDevice);
  const atts = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  await createWithStatus(atts, {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: `${pvName}-att`, namespace: ns },
    spec: {
      partitionName: pvName,
      partitionUID: partitionUid,
      nodeId: `${nodeA}/${HOST_A}`,
      hostNQN: HOST_A,
      attachmentId: "att-1",
    },
    status: {
      observedAttachmentId: "att-1",
      conditions: [cond("AccessReady", "True", "HostAllowed", `target admits ${HOST_A}`)],
    },
  } satisfies NVMeVolumeAttachment);
  // Another node's attachment: fence of nodeA must leave it alone.
  await atts.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeVolumeAttachment",
    metadata: { name: `other-${id}`, namespace: ns },
    spec: {
      partitionName: "other",
      partitionUID: "00000000-0000-4000-8000-000000000000",
      nodeId: nodeB,
      hostNQN: HOST_A,
      attachmentId: "att-9",
    },
  } satisfies NVMeVolumeAttachment);

  await core("/api/v1/persistentvolumes", "POST", {
    metadata: { name: pvName },
    spec: {
      capacity: { storage: "1Gi" },
      accessModes: ["ReadWriteOnce"],
      persistentVolumeReclaimPolicy: "Delete",
      storageClassName: "distort-tcp",
      claimRef: { namespace: app, name: "data" },
      csi: { driver: "storage.distort.io", volumeHandle: `${ns}/${pvName}/${partitionUid}` },
    },
  });
  const pvc = await core(`/api/v1/namespaces/${app}/persistentvolumeclaims`, "POST", {
    metadata: { name: "data", namespace: app },
    spec: {
      accessModes: ["ReadWriteOnce"],
      resources: { requests: { storage: "1Gi" } },
      storageClassName: "distort-tcp",
      volumeName: pvName,
    },
  });
  await core(`/api/v1/namespaces/${app}/persistentvolumeclaims/data/status`, "PUT", {
    ...pvc,
    status: { phase: "Bound", accessModes: ["ReadWriteOnce"], capacity: { storage: "1Gi" } },
  });
  await core("/apis/storage.k8s.io/v1/volumeattachments", "POST", {
    metadata: { name: `csi-${id}` },
    spec: { attacher: "storage.distort.io", nodeName: nodeA, source: { persistentVolumeName: pvName } },
  });
  // What the bundle must not give away: a Secret's value, echoed into a ConfigMap and an Event
  // the way a careless log line or annotation would.
  await core(`/api/v1/namespaces/${ns}/secrets`, "POST", {
    metadata: { name: "chap", namespace: ns },
    stringData: { key: DHCHAP_KEY, password: SECRET_VALUE },
  });
  await core(`/api/v1/namespaces/${ns}/configmaps`, "POST", {
    metadata: { name: "careless", namespace: ns },
    data: { note: `the password is ${SECRET_VALUE}`, key: DHCHAP_KEY },
  });
  await core(`/api/v1/namespaces/${ns}/events`, "POST", {
    metadata: { name: `leak-${id}`, namespace: ns },
    involvedObject: {
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "NVMePartition",
      name: pvName,
      namespace: ns,
      uid: partitionUid,
    },
    reason: "Leaky",
    message: `connect failed with secret ${SECRET_VALUE}`,
    type: "Warning",
    firstTimestamp: new Date().toISOString(),
    lastTimestamp: new Date().toISOString(),
    count: 1,
    source: { component: "test" },
  });
}, 300_000);

afterAll(async () => {
  if (tc) {
    await new ResourceClient(tc.conn, kinds.NVMeDevice).delete(deviceName).catch(() => {});
    await tc.conn.request(`/api/v1/persistentvolumes/${pvName}`, { method: "DELETE" }).catch(() => {});
    await tc.conn
      .request(`/apis/storage.k8s.io/v1/volumeattachments/csi-${id}`, { method: "DELETE" })
      .catch(() => {});
  }
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  await tc?.stop();
});

test("describe volume follows PVC -> PV -> partition -> device -> node -> subsystem -> hosts, through kubectl", async () => {
  const r = await run(["describe", "volume", "data", "-n", app], { viaKubectl: true });
  expect(r.stderr).toBe("");
  process.stderr.write(`--- kubectl distort describe volume data -n ${app}\n${r.stdout}`);
  expect(r.code).toBe(0);
  const order = [
    "PersistentVolumeClaim",
    "PersistentVolume",
    "NVMePartition",
    "NVMeDevice",
    "RDMAStorageNode",
    "Subsystem",
    "NVMeVolumeAttachment",
    "VolumeAttachment",
  ];
  const at = order.map((k) => r.stdout.search(new RegExp(`^${k} `, "m")));
  expect(at.every((i) => i >= 0)).toBe(true);
  expect([...at].sort((a, b) => a - b)).toEqual(at);
  expect(r.stdout).toContain(
    `PersistentVolumeClaim ${app}/data\n  phase=Bound  capacity=1Gi  storageClass=distort-tcp  volumeMode=Filesystem  volume=${pvName}`,
  );
  expect(r.stdout).toContain(`allocatable=31.7 GiB  free=30.7 GiB`);
  expect(r.stdout).toContain(
    `Subsystem nqn.2026-02.io.distort:volume-vol-${id}\n  tcp 192.168.100.10:4420\n  host ${HOST_A}  node=${nodeA}/${HOST_A}  admitted`,
  );
  expect(r.stdout).toContain("    Ready=True Exported: listening on tcp 192.168.100.10:4420");
  expect(r.stdout).toContain("No problems found.");

  const json = await run(["describe", "volume", "data", "-n", app, "-o", "json"]);
  const chain = JSON.parse(json.stdout) as VolumeChain;
  expect(chain.healthy).toBe(true);
  expect(chain.links.map((l) => l.kind)).toEqual([
    "PersistentVolumeClaim",
    "PersistentVolume",
    "NVMePartition",
    "NVMeDevice",
    "RDMAStorageNode",
    "NVMeVolumeAttachment",
    "VolumeAttachment",
  ]);
  expect(chain.subsystem?.hosts).toEqual([
    { hostNQN: HOST_A, node: `${nodeA}/${HOST_A}`, attachment: `${pvName}-att`, enforced: true },
  ]);
  const yaml = await run(["describe", "volume", "data", "-n", app, "-o", "yaml"]);
  expect(yaml.stdout).toContain("kind: DistortVolume\n");

  // A revoked ACL shows as a problem and exit code 1.
  await updateStatus(new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment), `${pvName}-att`, ns, (a) => ({
    ...a.status,
    conditions: [cond("AccessReady", "False", "HostAllowFailed", "nvmf_subsystem_add_host: -5")],
  }));
  const sick = await run(["describe", "volume", "data", "-n", app]);
  expect(sick.code).toBe(1);
  expect(sick.stdout).toContain(`  ! AccessReady=False HostAllowFailed: nvmf_subsystem_add_host: -5`);
  expect(sick.stdout).toContain(
    `Problems:\n  - NVMeVolumeAttachment ${pvName}-att: AccessReady=False HostAllowFailed: nvmf_subsystem_add_host: -5`,
  );

  const missing = await run(["describe", "volume", "nope", "-n", app]);
  expect(missing).toEqual({
    code: 4,
    stdout: "",
    stderr: `kubectl distort describe: PersistentVolumeClaim ${app}/nope not found\n`,
  });
  const usage = await run(["describe", "volume"]);
  expect(usage.code).toBe(2);
  expect(usage.stderr).toContain("missing a PVC name");
}, 120_000);

test("fence annotates only the node's attachments, idempotently; unfence removes it", async () => {
  const atts = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const dry = await run(["fence", nodeA, "-n", ns, "--dry-run"]);
  expect(dry.stdout).toContain(`${ns}/${pvName}-att (partition ${pvName}): would fence`);
  expect((await atts.get(`${pvName}-att`, ns))?.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();

  const fenced = await run(["fence", nodeA, "-n", ns]);
  expect(fenced.code).toBe(0);
  expect(fenced.stdout).toContain(`${ns}/${pvName}-att (partition ${pvName}): fenced`);
  expect((await atts.get(`${pvName}-att`, ns))?.metadata.annotations?.[FENCED_ANNOTATION]).toBe("true");
  expect((await atts.get(`other-${id}`, ns))?.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();
  const again = await run(["fence", nodeA, "-n", ns, "-o", "json"]);
  expect(JSON.parse(again.stdout)).toEqual({
    kind: "DistortFence",
    node: nodeA,
    attachments: [
      {
        namespace: ns,
        name: `${pvName}-att`,
        partition: pvName,
        nodeId: `${nodeA}/${HOST_A}`,
        outcome: "unchanged",
      },
    ],
  });
  const described = await run(["describe", "volume", "data", "-n", app]);
  expect(described.stdout).toContain(
    `node ${nodeA}/${HOST_A} is fenced; the next publish on another node takes the volume over`,
  );

  const unfenced = await run(["unfence", nodeA, "-n", ns]);
  expect(unfenced.stdout).toContain(": unfenced");
  expect((await atts.get(`${pvName}-att`, ns))?.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();
  const none = await run(["fence", `no-such-node-${id}`, "-A"]);
  expect(none.stdout).toBe(`node no-such-node-${id} holds no NVMeVolumeAttachment: nothing to fence\n`);
}, 60_000);

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? walk(p) : [p];
  });
}

test("support-bundle: objects, events and secrets' keys, but no secret value anywhere", async () => {
  const out = join(scratch, "bundle.tar.gz");
  const r = await run(["support-bundle", "-n", ns, "--output-path", out]);
  expect(r.code).toBe(0);
  expect(r.stdout).toBe(`${out}\n`);
  const dir = join(scratch, "extracted");
  mkdirSync(dir);
  const tar = Bun.spawnSync(["tar", "-xzf", out, "-C", dir]);
  expect(tar.exitCode).toBe(0);
  const [top] = readdirSync(dir);
  const base = join(dir, top as string);
  const files = walk(base)
    .map((f) => f.slice(base.length + 1))
    .sort();
  for (const f of [
    "manifest.json",
    "distort/nvmepartitions.yaml",
    "distort/nvmedevices.yaml",
    "distort/rdmastoragenodes.yaml",
    "distort/nvmevolumeattachments.yaml",
    "kubernetes/persistentvolumes.yaml",
    "kubernetes/persistentvolumeclaims.yaml",
    "kubernetes/volumeattachments.yaml",
    "kubernetes/distort-events.yaml",
    `${ns}/secrets.yaml`,
    `${ns}/configmaps.yaml`,
    `${ns}/events.yaml`,
  ]) {
    expect(files).toContain(f);
  }
  expect(readFileSync(join(base, "distort/nvmepartitions.yaml"), "utf8")).toContain(`name: ${pvName}`);
  expect(readFileSync(join(base, "kubernetes/persistentvolumeclaims.yaml"), "utf8")).toContain("name: data");
  const secrets = readFileSync(join(base, `${ns}/secrets.yaml`), "utf8");
  expect(secrets).toContain("name: chap");
  expect(secrets).toContain("password: <redacted>");
  expect(readFileSync(join(base, "kubernetes/distort-events.yaml"), "utf8")).toContain(
    "connect failed with secret <redacted>",
  );
  // The grep: neither the value, its base64, nor the DH-HMAC-CHAP key appears in any file.
  const grep = Bun.spawnSync([
    "grep",
    "-r",
    "-l",
    "-F",
    "-e",
    SECRET_VALUE,
    "-e",
    Buffer.from(SECRET_VALUE).toString("base64"),
    "-e",
    DHCHAP_KEY.slice(10, 40),
    base,
  ]);
  expect(grep.stdout.toString()).toBe("");
  expect(grep.exitCode).toBe(1);
  expect(existsSync(join(base, "manifest.json"))).toBe(true);

  const asDir = join(scratch, "bundle-dir");
  expect((await run(["support-bundle", "-n", ns, "--output-path", asDir])).code).toBe(0);
  expect(readFileSync(join(asDir, `${ns}/configmaps.yaml`), "utf8")).toContain("the password is <redacted>");
}, 120_000);

test("kubectl get distort prints quantities and the transports a node serves", async () => {
  const p = Bun.spawn(
    [KUBECTL, "--kubeconfig", tc.kubeconfigPath, "get", "nvmedevices,rdmastoragenodes", "-A"],
    { stdout: "pipe", stderr: "pipe" },
  );
  const text = await new Response(p.stdout).text();
  await p.exited;
  process.stderr.write(
    `--- kubectl get nvmedevices,rdmastoragenodes -A (this test's rows)\n${text
      .split("\n")
      .filter((l) => l.startsWith("NAME") || l.startsWith("NAMESPACE") || l.includes(id))
      .join("\n")}\n`,
  );
  expect(text).toMatch(
    new RegExp(`${deviceName}\\s+${nodeA}\\s+${serial}\\s+31\\.7Gi\\s+30\\.7Gi\\s+Claimed`),
  );
  expect(text).toMatch(
    new RegExp(`${nodeA}\\s+${nodeA}\\s+192\\.168\\.100\\.10\\s+tcp\\s+True\\s+31Gi\\s+1`),
  );
}, 30_000);

test("preflight in the compiled binary reads a storage node's /sys and /proc under --host-root", async () => {
  const hostRoot = join(scratch, "host");
  const files: Record<string, string> = {
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "512\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "512\n",
    "proc/mounts":
      "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\nconfigfs /sys/kernel/config configfs rw 0 0\n",
    "sys/devices/system/cpu/online": "0-7\n",
    "sys/kernel/config/nvmet/ports/.keep": "",
    "sys/module/nvmet/refcnt": "0\n",
    "sys/module/nvmet_tcp/refcnt": "0\n",
    "sys/module/vfio_pci/refcnt": "0\n",
    "sys/kernel/iommu_groups/0/type": "DMA\n",
  };
  for (const [p, text] of Object.entries(files)) {
    mkdirSync(join(hostRoot, p, ".."), { recursive: true });
    await Bun.write(join(hostRoot, p), text);
  }
  const r = await run(
    [
      "preflight",
      "--role",
      "spdk,kernel-target",
      "--host-root",
      hostRoot,
      "--mem-size-mb",
      "1024",
      "--volumes",
      "100",
      "--core-mask",
      "0x3",
      "--spdk-drives",
    ],
    { viaKubectl: true },
  );
  process.stderr.write(
    `--- kubectl distort preflight --role spdk,kernel-target --mem-size-mb 1024 --volumes 100 --core-mask 0x3 --spdk-drives\n${r.stdout}`,
  );
  expect(r.code).toBe(0);
  expect(r.stdout).toContain(
    "WARN  hugepages         nvmf_tgt -s 1024 MiB is below DISTORT's estimate of 1212 MiB for 100 volumes",
  );
  expect(r.stdout).toContain("PASS  cpu-cores         core mask 0x3: 2 of 8 online cores");
  expect(r.stdout).toContain("PASS  iommu             IOMMU enabled (1 groups)");
  expect(r.stdout).toContain(
    "PASS  configfs          configfs mounted with nvmet at /sys/kernel/config/nvmet",
  );
  expect(
    (
      await run([
        "preflight",
        "--role",
        "spdk,kernel-target",
        "--host-root",
        hostRoot,
        "--mem-size-mb",
        "1024",
        "--volumes",
        "100",
        "--strict",
      ])
    ).code,
  ).toBe(3);
  const short = await run(["preflight", "--role", "spdk", "--host-root", hostRoot, "--mem-size-mb", "2048"]);
  expect(short.code).toBe(1);
  expect(short.stdout).toContain(
    "FAIL  hugepages         1024 MiB reserved (512 x 2M (512 free)); nvmf_tgt -s needs 2048 MiB",
  );
}, 60_000);
