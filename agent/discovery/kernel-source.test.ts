// Kernel discovery over simulated sysfs trees: PCIe only, namespace 1 found by NSID (also through
// multipath path disks), mounted and dead controllers skipped, a bad controller isolated, and the
// whole source failed when sysfs or lsblk cannot be trusted.
import { afterAll, expect, test } from "bun:test";
import { unlink } from "node:fs/promises";
import { join } from "node:path";
import { buildSysfs, type SimController } from "../../lab/sim/sysfs/build-sysfs.ts";
import { type ScratchRoot, scratchRoot } from "../../lab/sim/sysfs/scratch-root.ts";
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { hostFs } from "../../lib/fs.ts";
import { scanKernel, visibleDiskName } from "./kernel-source.ts";

const GiB = 1024 ** 3;
const roots: ScratchRoot[] = [];
afterAll(async () => {
  await Promise.all(roots.map((r) => r.remove()));
});
async function emptyRoot(): Promise<string> {
  const r = await scratchRoot("distort-kernel");
  roots.push(r);
  return r.path;
}
async function sim(controllers: SimController[]) {
  return buildSysfs(await emptyRoot(), { controllers });
}

const pcie = (n: number, extra: Partial<SimController> = {}): SimController => ({
  name: `nvme${n}`,
  transport: "pcie",
  pciAddress: `0000:${(0x3b + n).toString(16)}:00.0`,
  serial: `SN${n}`,
  model: "SAMSUNG MZQL23T8HCLS",
  numaNode: n % 2,
  ns1Bytes: (n + 1) * 100 * GiB,
  ...extra,
});

interface Row {
  name: string;
  controllers: SimController[];
  advertised: [controller: string, serial: string, blockDevice: string, ns1Bytes: number][];
  problems?: [controller: string, reason: string][];
  skipped?: string[][];
}

const rows: Row[] = [
  {
    name: "PCIe drives advertised, NVMe-oF controllers never",
    controllers: [
      pcie(0),
      pcie(1),
      {
        name: "nvme2",
        transport: "tcp",
        serial: "SPDK00000000000001",
        model: "SPDK bdev Controller",
        ns1Bytes: GiB,
      },
      { name: "nvme3", transport: "rdma", serial: "REMOTE", model: "Linux", ns1Bytes: GiB },
    ],
    advertised: [
      ["nvme0", "SN0", "nvme0n1", 100 * GiB],
      ["nvme1", "SN1", "nvme1n1", 200 * GiB],
    ],
  },
  {
    name: "a mounted drive is skipped, with its serial",
    controllers: [pcie(0, { mounted: "/" }), pcie(1)],
    advertised: [["nvme1", "SN1", "nvme1n1", 200 * GiB]],
    skipped: [["nvme0", "Mounted", "SN0"]],
  },
  {
    name: "multipath: namespace 1 read through the hidden path disk, reported as the head disk",
    controllers: [pcie(4, { multipath: true })],
    advertised: [["nvme4", "SN4", "nvme4n1", 500 * GiB]],
  },
  {
    name: "namespace 1 is found by NSID, not by the disk's trailing number",
    controllers: [
      pcie(0, {
        namespaces: [
          { nsid: 2, bytes: 10 * GiB },
          { nsid: 1, bytes: 20 * GiB },
        ],
      }),
    ],
    advertised: [["nvme0", "SN0", "nvme0n2", 20 * GiB]],
  },
  {
    name: "a mount on another namespace still keeps the controller out",
    controllers: [
      pcie(0, {
        namespaces: [
          { nsid: 2, bytes: 10 * GiB },
          { nsid: 1, bytes: 20 * GiB },
        ],
        mounted: true,
      }),
    ],
    advertised: [],
    skipped: [["nvme0", "Mounted", "SN0"]],
  },
  {
    name: "a controller without namespace 1 is a problem, not a guess",
    controllers: [pcie(0, { ns1Bytes: undefined, namespaces: [{ nsid: 2, bytes: GiB }] }), pcie(1)],
    advertised: [["nvme1", "SN1", "nvme1n1", 200 * GiB]],
    problems: [["nvme0", "Namespace1Missing"]],
  },
  {
    name: "one bad controller among good ones",
    controllers: [pcie(0), pcie(1, { serial: "" }), pcie(2, { pciAddress: "0000:3d:00" }), pcie(3)],
    advertised: [
      ["nvme0", "SN0", "nvme0n1", 100 * GiB],
      ["nvme3", "SN3", "nvme3n1", 400 * GiB],
    ],
    problems: [
      ["nvme1", "SerialMissing"],
      ["nvme2", "PciAddressInvalid"],
    ],
  },
  {
    name: "a serial cut inside a multi-byte character by the 20-byte field is not exact",
    controllers: [pcie(0, { serial: "ABCDEFGHIJKLMNOPQRSシ" })],
    advertised: [],
    problems: [["nvme0", "SerialInvalid"]],
  },
  {
    name: "inner spaces of a serial survive; the padding does not",
    controllers: [pcie(0, { serial: "S4EW NX0R" })],
    advertised: [["nvme0", "S4EW NX0R", "nvme0n1", 100 * GiB]],
  },
  {
    name: "dead controllers are absent; controllers being deleted are in flux",
    controllers: [
      pcie(0, { state: "dead" }),
      pcie(1, { state: "deleting" }),
      pcie(2, { state: "resetting" }),
    ],
    advertised: [["nvme2", "SN2", "nvme2n1", 300 * GiB]],
    problems: [["nvme1", "ControllerInTransition"]],
    skipped: [["nvme0", "ControllerDead", "SN0"]],
  },
  {
    name: "a namespace 1 too small for one allocation unit",
    controllers: [pcie(0, { ns1Bytes: 4 * 1024 * 1024 })],
    advertised: [],
    problems: [["nvme0", "CapacityInvalid"]],
  },
];

test.each(rows)("$name", async (row) => {
  const s = await sim(row.controllers);
  const scan = await scanKernel(s.fs, s.exec);
  expect(scan.failure).toBeUndefined();
  expect(scan.controllers.map((c) => [c.controller, c.serial, c.blockDevice, c.namespace1Bytes])).toEqual(
    row.advertised,
  );
  expect(scan.problems.map((p) => [p.controller, p.reason])).toEqual(row.problems ?? []);
  expect(scan.skipped.map((k) => [k.controller, k.reason, ...(k.serial ? [k.serial] : [])])).toEqual(
    row.skipped ?? [],
  );
  for (const c of scan.controllers) {
    expect(c.pciAddress).toMatch(/^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/);
    expect(c.model).toBe("SAMSUNG MZQL23T8HCLS");
  }
});

test("facts: normalized address, NUMA node, capacity after reserve", async () => {
  const s = await sim([pcie(1, { pciAddress: "0000:5E:00.1" })]);
  const [c] = (await scanKernel(s.fs, s.exec)).controllers;
  expect(c).toEqual({
    source: "kernel",
    controller: "nvme1",
    serial: "SN1",
    pciAddress: "0000:5e:00.1",
    model: "SAMSUNG MZQL23T8HCLS",
    numaNode: 1,
    namespace1Bytes: 200 * GiB,
    allocatableBytes: 202_752 * 1024 ** 2,
    blockDevice: "nvme1n1",
  });
});

test("an unreadable controller is a problem; the others are still reported", async () => {
  const s = await sim([pcie(0), pcie(1)]);
  await unlink(join(s.root, "sys/class/nvme/nvme0/serial"));
  const scan = await scanKernel(s.fs, s.exec);
  expect(scan.failure).toBeUndefined();
  expect(scan.controllers.map((c) => c.controller)).toEqual(["nvme1"]);
  expect(scan.problems.map((p) => [p.controller, p.reason, p.pciAddress])).toEqual([
    ["nvme0", "AttributeUnreadable", "0000:3b:00.0"],
  ]);
});

test("no nvme class (driver not loaded) is a complete, empty answer without lsblk", async () => {
  const root = await emptyRoot();
  const exec: Exec = {
    run: async () => {
      throw new Error("lsblk must not run");
    },
  };
  const scan = await scanKernel(hostFs(root), exec);
  expect(scan).toEqual({ source: "kernel", controllers: [], problems: [], skipped: [], found: 0 });
});

test("only fabrics controllers: lsblk is not needed", async () => {
  const s = await sim([{ name: "nvme0", transport: "tcp", serial: "R", model: "M", ns1Bytes: GiB }]);
  const scan = await scanKernel(s.fs, {
    run: async () => {
      throw new Error("lsblk must not run");
    },
  });
  expect(scan.failure).toBeUndefined();
  expect(scan.found).toBe(0);
});

test.each<[string, (fs: HostFs, exec: Exec) => [HostFs, Exec], string]>([
  [
    "sysfs class unreadable",
    (fs, exec) => [
      {
        ...fs,
        readdir: async (p) => {
          if (p === "/sys/class/nvme") throw Object.assign(new Error("EIO: i/o error"), { code: "EIO" });
          return fs.readdir(p);
        },
      },
      exec,
    ],
    "SysfsUnreadable",
  ],
  [
    "lsblk fails",
    (fs) => [
      fs,
      { run: async () => ({ code: 1, stdout: "", stderr: "lsblk: cannot open /proc/self/mountinfo" }) },
    ],
    "MountCheckFailed",
  ],
  [
    "lsblk missing",
    (fs) => [fs, { run: () => Promise.reject(new Error("cannot run lsblk")) }],
    "MountCheckFailed",
  ],
  [
    "lsblk prints garbage",
    (fs) => [fs, { run: async () => ({ code: 0, stdout: "{", stderr: "" }) }],
    "MountCheckFailed",
  ],
])("%s: the source fails and offers nothing", async (_name, wrap, reason) => {
  const s = await sim([pcie(0), pcie(1)]);
  const [fs, exec] = wrap(s.fs, s.exec);
  const scan = await scanKernel(fs, exec);
  expect(scan.failure?.reason).toBe(reason);
  expect(scan.controllers).toEqual([]);
});

test.each([
  ["nvme0n1", "nvme0n1"],
  ["nvme2c5n3", "nvme2n3"],
  ["sda", "sda"],
])("visibleDiskName(%p) = %p", (disk, want) => {
  expect(visibleDiskName(disk)).toBe(want);
});
