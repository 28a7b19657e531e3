// KernelTarget over a plain directory through the production hostFs: the exact configfs tree it
// writes for a reference export, the commands it runs, and what it refuses before writing.
import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec, ExecResult } from "../../../lib/exec.ts";
import { hostFs } from "../../../lib/fs.ts";
import type { ExportSpec } from "../types.ts";
import { KernelTarget } from "./kernel-target.ts";
import { scratchDir } from "./testdata/scratch.ts";
import { listTree } from "./testdata/tree.ts";

const NVMET = "/sys/kernel/config/nvmet";
const NQN = "nqn.2026-02.io.distort:volume-vol-3f2a9c";
const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";

const spec: ExportSpec = {
  nqn: NQN,
  volume: { externalId: "vol-3f2a9c", backendPath: "/dev/nvme0n1p2", sizeBytes: 8 << 20 },
  transport: "rdma",
  address: "192.168.100.7",
  port: 4420,
  serialNumber: "3f2a9c0d11e24b7a",
};

/** The whole tree nvmet must end up with for `spec` and hosts H1, H2: every path, value and link. */
const REFERENCE = [
  "hosts/",
  `hosts/${H2}/`,
  `hosts/${H1}/`,
  "ports/",
  "ports/1/",
  'ports/1/addr_adrfam = "ipv4"',
  'ports/1/addr_traddr = "192.168.100.7"',
  'ports/1/addr_trsvcid = "4420"',
  'ports/1/addr_trtype = "rdma"',
  "ports/1/subsystems/",
  `ports/1/subsystems/${NQN} -> ${NVMET}/subsystems/${NQN}`,
  "subsystems/",
  `subsystems/${NQN}/`,
  `subsystems/${NQN}/allowed_hosts/`,
  `subsystems/${NQN}/allowed_hosts/${H2} -> ${NVMET}/hosts/${H2}`,
  `subsystems/${NQN}/allowed_hosts/${H1} -> ${NVMET}/hosts/${H1}`,
  `subsystems/${NQN}/attr_allow_any_host = "0"`,
  `subsystems/${NQN}/attr_serial = "3f2a9c0d11e24b7a"`,
  `subsystems/${NQN}/namespaces/`,
  `subsystems/${NQN}/namespaces/1/`,
  `subsystems/${NQN}/namespaces/1/device_path = "/dev/nvme0n1p2"`,
  `subsystems/${NQN}/namespaces/1/enable = "1"`,
];

class RecordingExec implements Exec {
  calls: string[][] = [];
  fail = new Map<string, ExecResult>();
  async run(argv: readonly string[]): Promise<ExecResult> {
    this.calls.push([...argv]);
    return this.fail.get(argv.join(" ")) ?? { code: 0, stdout: "", stderr: "" };
  }
}

let root: string;
let exec: RecordingExec;
let target: KernelTarget;

beforeEach(async () => {
  root = await scratchDir("kernel-target-");
  // What loading nvmet leaves in configfs; the rest is the writer's.
  for (const d of ["subsystems", "ports", "hosts"]) await mkdir(join(root, NVMET, d), { recursive: true });
  exec = new RecordingExec();
  target = new KernelTarget({ fs: hostFs(root), exec });
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

test("a reference export produces exactly the tree nvmet expects", async () => {
  expect(await target.ensureExport(spec)).toEqual(["subsystem", "namespace", "port", "port-link"]);
  expect(await target.reconcileHosts(NQN, [H1, H2])).toEqual([
    `host:${H2}`,
    `allow:${H2}`,
    `host:${H1}`,
    `allow:${H1}`,
  ]);
  expect(await listTree(root, NVMET)).toEqual(REFERENCE);
  expect(exec.calls).toEqual([
    ["modprobe", "nvmet"],
    ["modprobe", "nvmet-rdma"],
  ]);
});

test("every call repeated changes nothing and reports nothing", async () => {
  await target.ensureExport(spec);
  await target.setHosts(NQN, [H1, H2]);
  expect(await target.ensureExport(spec)).toEqual([]);
  expect(await target.reconcileHosts(NQN, [H2, H1, H1])).toEqual([]);
  expect(await listTree(root, NVMET)).toEqual(REFERENCE);
  // A fresh instance (an agent restart) agrees and loads the modules once more.
  const again = new KernelTarget({ fs: hostFs(root), exec });
  expect(await again.ensureExport(spec)).toEqual([]);
  expect(exec.calls.filter((c) => c[1] === "nvmet")).toHaveLength(2);
});

test("an IPv6 portal over TCP gets adrfam ipv6 and the tcp module", async () => {
  await target.ensureExport({ ...spec, transport: "tcp", address: "fd00::7", port: 4421 });
  const tree = await listTree(root, `${NVMET}/ports/1`);
  expect(tree).toEqual([
    'addr_adrfam = "ipv6"',
    'addr_traddr = "fd00::7"',
    'addr_trsvcid = "4421"',
    'addr_trtype = "tcp"',
    "subsystems/",
    `subsystems/${NQN} -> ${NVMET}/subsystems/${NQN}`,
  ]);
  expect(exec.calls).toEqual([
    ["modprobe", "nvmet"],
    ["modprobe", "nvmet-tcp"],
  ]);
});

test("inspectExport reads the export back component by component", async () => {
  expect(await target.inspectExport(NQN)).toBeUndefined();
  await target.ensureExport(spec);
  await target.setHosts(NQN, [H2, H1]);
  expect(await target.inspectExport(NQN)).toEqual({
    nqn: NQN,
    namespace: "/dev/nvme0n1p2",
    listeners: [{ transport: "rdma", address: "192.168.100.7", port: 4420 }],
    hosts: [H2, H1].sort(),
  });
});

test.each<[string, Partial<ExportSpec>]>([
  ["a malformed NQN", { nqn: "nqn.2026-02.io.distort" }],
  ["a :uuid: NQN without a UUID", { nqn: "nqn.2014-08.org.nvmexpress:uuid:volume-1" }],
  ["a host name for an address", { address: "storage-0.example" }],
  ["port 0", { port: 0 }],
  ["a 21-byte serial", { serialNumber: "x".repeat(21) }],
  ["a serial with a trailing space", { serialNumber: "abc " }],
  ["a relative backend path", { volume: { ...spec.volume, backendPath: "nvme0n1p2" } }],
  ["a backend path with a newline", { volume: { ...spec.volume, backendPath: "/dev/a\n/dev/b" } }],
  ["an unknown transport", { transport: "fc" as "tcp" }],
])("%s is refused as invalid before anything is written", async (_name, over) => {
  const err = await target.ensureExport({ ...spec, ...over }).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("invalid");
  expect(await listTree(root, NVMET)).toEqual(["hosts/", "ports/", "subsystems/"]);
  expect(exec.calls).toEqual([]);
});

test("setHosts refuses a malformed host NQN and changes nothing", async () => {
  await target.ensureExport(spec);
  await target.setHosts(NQN, [H1]);
  const before = await listTree(root, NVMET);
  const err = await target
    .setHosts(NQN, [H2, "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid"])
    .catch((e: unknown) => e);
  expect((err as StorageError).kind).toBe("invalid");
  expect(await listTree(root, NVMET)).toEqual(before);
});

test("setHosts on a subsystem that does not exist is not-found", async () => {
  const err = await target.setHosts(NQN, [H1]).catch((e: unknown) => e);
  expect((err as StorageError).kind).toBe("not-found");
});

test("a failing modprobe is unavailable and writes nothing", async () => {
  exec.fail.set("modprobe nvmet-rdma", {
    code: 1,
    stdout: "",
    stderr: "modprobe: FATAL: Module nvmet-rdma not found",
  });
  const err = await target.ensureExport(spec).catch((e: unknown) => e);
  expect((err as StorageError).kind).toBe("unavailable");
  expect((err as StorageError).message).toContain("Module nvmet-rdma not found");
  expect(await listTree(root, NVMET)).toEqual(["hosts/", "ports/", "subsystems/"]);
  // A later retry tries again rather than remembering the failure.
  exec.fail.clear();
  await target.ensureExport(spec);
  expect(exec.calls.map((c) => c.join(" "))).toEqual([
    "modprobe nvmet",
    "modprobe nvmet-rdma",
    "modprobe nvmet-rdma",
  ]);
});

test("without configfs mounted the target is unavailable", async () => {
  await rm(join(root, "sys"), { recursive: true });
  const err = await target.ensureExport(spec).catch((e: unknown) => e);
  expect((err as StorageError).kind).toBe("unavailable");
  expect((err as StorageError).message).toContain("configfs");
});
