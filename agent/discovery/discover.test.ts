// Discovery end to end on a simulated host and SPDK replies: the partial-failure table. A failed
// source never discards the other source's drives or the valid drives of its own.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { buildSysfs, type SimController, type SimSysfs } from "../../lab/sim/sysfs/build-sysfs.ts";
import { type ScratchRoot, scratchRoot } from "../../lab/sim/sysfs/scratch-root.ts";
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { createLogger } from "../../lib/log.ts";
import { type DiscoveryOptions, discoverDevices } from "./discover.ts";
import type { SpdkInventorySource } from "./spdk-source.ts";
import { type SpdkDrive, spdkBdevs, spdkControllers } from "./testdata/spdk-replies.ts";

const GiB = 1024 ** 3;
const kernelDrives: SimController[] = [
  {
    name: "nvme0",
    transport: "pcie",
    pciAddress: "0000:3b:00.0",
    serial: "K0",
    model: "M",
    ns1Bytes: 100 * GiB,
  },
  {
    name: "nvme1",
    transport: "pcie",
    pciAddress: "0000:3c:00.0",
    serial: "K1",
    model: "M",
    ns1Bytes: 200 * GiB,
  },
  {
    name: "nvme2",
    transport: "pcie",
    pciAddress: "0000:3d:00.0",
    serial: "",
    model: "M",
    ns1Bytes: 50 * GiB,
  },
  { name: "nvme3", transport: "tcp", serial: "REMOTE", model: "Linux", ns1Bytes: 10 * GiB },
];
const spdkDrive = (n: number, extra: Partial<SpdkDrive> = {}): SpdkDrive => ({
  name: `Nvme${n}`,
  pciAddress: `0000:8${n}:00.0`,
  serial: `S${n}`,
  model: "M",
  namespaces: [{ nsid: 1, blockSize: 512, numBlocks: 200_000_000 }],
  ...extra,
});

let root: ScratchRoot;
let sim: SimSysfs;
beforeAll(async () => {
  root = await scratchRoot("distort-discover");
  sim = await buildSysfs(root.path, { controllers: kernelDrives });
});
afterAll(async () => {
  await root.remove();
});

const spdkOf = (drives: SpdkDrive[]): SpdkInventorySource => ({
  listControllers: async () => spdkControllers(drives),
  getBdevs: async () => spdkBdevs(drives),
});
const throwing: SpdkInventorySource = {
  listControllers: () => Promise.reject(new Error("connect ENOENT /var/tmp/spdk.sock")),
  getBdevs: () => Promise.reject(new Error("connect ENOENT /var/tmp/spdk.sock")),
};
const badFs = (fs: HostFs): HostFs => ({
  ...fs,
  readdir: () => Promise.reject(Object.assign(new Error("EIO"), { code: "EIO" })),
});
const badExec: Exec = { run: () => Promise.reject(new Error("cannot run lsblk")) };

interface Row {
  name: string;
  spdk?: SpdkInventorySource;
  fs?: (fs: HostFs) => HostFs;
  exec?: Exec;
  options?: DiscoveryOptions;
  serials: string[];
  kernel: [state: string, reason: string];
  spdkHealth: [state: string, reason: string];
  complete: boolean;
}

const rows: Row[] = [
  {
    name: "both sources readable; the empty-serial kernel drive degrades the kernel source only",
    spdk: spdkOf([spdkDrive(1)]),
    serials: ["K0", "K1", "S1"],
    kernel: ["degraded", "SerialMissing"],
    spdkHealth: ["ok", "Scanned"],
    complete: false,
  },
  {
    name: "the bad drive excluded by address: complete",
    spdk: spdkOf([spdkDrive(1)]),
    options: { filter: { excluded: ["0000:3d:00.0"] } },
    serials: ["K0", "K1", "S1"],
    kernel: ["ok", "Scanned"],
    spdkHealth: ["ok", "Scanned"],
    complete: true,
  },
  {
    name: "SPDK source throws: kernel drives kept",
    spdk: throwing,
    options: { filter: { excluded: ["0000:3d:00.0"] } },
    serials: ["K0", "K1"],
    kernel: ["ok", "Scanned"],
    spdkHealth: ["failed", "RpcFailed"],
    complete: false,
  },
  {
    name: "kernel sysfs throws: SPDK drives kept",
    spdk: spdkOf([spdkDrive(1), spdkDrive(2)]),
    fs: badFs,
    serials: ["S1", "S2"],
    kernel: ["failed", "SysfsUnreadable"],
    spdkHealth: ["ok", "Scanned"],
    complete: false,
  },
  {
    name: "kernel mount check throws: SPDK drives kept, no kernel drive offered",
    spdk: spdkOf([spdkDrive(1)]),
    exec: badExec,
    serials: ["S1"],
    kernel: ["failed", "MountCheckFailed"],
    spdkHealth: ["ok", "Scanned"],
    complete: false,
  },
  {
    name: "an SPDK controller without namespace 1 degrades SPDK; the rest stay",
    spdk: spdkOf([
      spdkDrive(1),
      spdkDrive(2, { namespaces: [{ nsid: 2, blockSize: 512, numBlocks: 1000 }] }),
    ]),
    options: { filter: { excluded: ["0000:3d:00.0"] } },
    serials: ["K0", "K1", "S1"],
    kernel: ["ok", "Scanned"],
    spdkHealth: ["degraded", "Namespace1Missing"],
    complete: false,
  },
  {
    name: "both sources fail: nothing, incomplete",
    spdk: throwing,
    exec: badExec,
    serials: [],
    kernel: ["failed", "MountCheckFailed"],
    spdkHealth: ["failed", "RpcFailed"],
    complete: false,
  },
  {
    name: "a drive seen by both (mid-rebind) is one SPDK device",
    spdk: spdkOf([spdkDrive(0, { serial: "K1", pciAddress: "0000:3c:00.0" })]),
    options: { filter: { excluded: ["0000:3d:00.0"] } },
    serials: ["K0", "K1"],
    kernel: ["ok", "Scanned"],
    spdkHealth: ["ok", "Scanned"],
    complete: true,
  },
  {
    name: "no SPDK on the node",
    options: { filter: { excluded: ["0000:3d:00.0"] } },
    serials: ["K0", "K1"],
    kernel: ["ok", "Scanned"],
    spdkHealth: ["ok", "NotConfigured"],
    complete: true,
  },
];

test.each(rows)("$name", async (row) => {
  const lines: string[] = [];
  const logger = createLogger({ sink: (l) => lines.push(l), level: "debug" });
  const r = await discoverDevices(
    {
      fs: row.fs ? row.fs(sim.fs) : sim.fs,
      exec: row.exec ?? sim.exec,
      ...(row.spdk ? { spdk: row.spdk } : {}),
      logger,
    },
    row.options,
  );
  expect(r.devices.map((d) => d.serial).sort()).toEqual(row.serials);
  expect([r.kernel.state, r.kernel.reason]).toEqual(row.kernel);
  expect([r.spdk.state, r.spdk.reason]).toEqual(row.spdkHealth);
  expect(r.complete).toBe(row.complete);
  // Every problem and failed source is logged with its reason.
  const warned = lines.map((l) => JSON.parse(l)).filter((l) => l.level === "warn");
  expect(warned.length).toBe(
    r.problems.length + [r.kernel, r.spdk].filter((h) => h.state === "failed").length,
  );
});

test("the mid-rebind device names both controllers", async () => {
  const r = await discoverDevices(
    {
      fs: sim.fs,
      exec: sim.exec,
      spdk: spdkOf([spdkDrive(0, { serial: "K1", pciAddress: "0000:3c:00.0" })]),
      logger: createLogger({ sink: () => {} }),
    },
    { filter: { excluded: ["0000:3d:00.0"] } },
  );
  const k1 = r.devices.find((d) => d.serial === "K1");
  expect(k1).toMatchObject({
    activeBackend: "spdk",
    kernel: { controller: "nvme1" },
    spdk: { controller: "Nvme0" },
  });
});
