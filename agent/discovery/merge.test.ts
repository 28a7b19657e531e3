// Assembling the two sources: one device per serial (SPDK wins), filters before duplicate checks,
// failed sources contributing health only, and `complete` only when both sources are ok.
import { expect, test } from "bun:test";
import type { DeviceFilter } from "./device-filter.ts";
import type { SourceController, SourceScan } from "./inventory.ts";
import { assembleInventory } from "./merge.ts";

const GiB = 1024 ** 3;
const ctrl = (
  source: "kernel" | "spdk",
  controller: string,
  serial: string,
  pci: string,
  gib = 100,
): SourceController => ({
  source,
  controller,
  serial,
  pciAddress: pci,
  model: `${source} model`,
  numaNode: 0,
  namespace1Bytes: gib * GiB,
  allocatableBytes: gib * GiB - GiB,
  ...(source === "kernel" ? { blockDevice: `${controller}n1` } : { bdev: `${controller}n1` }),
});
const scan = (
  source: "kernel" | "spdk",
  controllers: SourceController[],
  extra: Partial<SourceScan> = {},
): SourceScan => ({
  source,
  found: controllers.length,
  controllers,
  problems: [],
  skipped: [],
  ...extra,
});

interface Row {
  name: string;
  kernel: SourceScan;
  spdk: SourceScan;
  filter?: DeviceFilter;
  devices: [serial: string, backend: string, pci: string][];
  kernelState: string;
  spdkState: string;
  complete: boolean;
  problems?: [string, string, string][];
  skipped?: [string, string][];
}

const rows: Row[] = [
  {
    name: "disjoint sources, both ok",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")]),
    spdk: scan("spdk", [ctrl("spdk", "Nvme0", "S1", "0000:81:00.0")]),
    devices: [
      ["K1", "kernel", "0000:3b:00.0"],
      ["S1", "spdk", "0000:81:00.0"],
    ],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
  },
  {
    name: "the same serial at the same address from both sources is one SPDK device",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "X1", "0000:3b:00.0", 100)]),
    spdk: scan("spdk", [ctrl("spdk", "Nvme0", "X1", "0000:3b:00.0", 100)]),
    devices: [["X1", "spdk", "0000:3b:00.0"]],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
  },
  {
    name: "the same serial at two addresses is two drives that cannot be told apart",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "X1", "0000:3b:00.0")]),
    spdk: scan("spdk", [
      ctrl("spdk", "Nvme0", "X1", "0000:81:00.0"),
      ctrl("spdk", "Nvme1", "S2", "0000:82:00.0"),
    ]),
    devices: [["S2", "spdk", "0000:82:00.0"]],
    kernelState: "degraded",
    spdkState: "degraded",
    complete: false,
    problems: [
      ["kernel", "nvme0", "DuplicateSerial"],
      ["spdk", "Nvme0", "DuplicateSerial"],
    ],
  },
  {
    name: "duplicate serial inside one source is resolved by excluding one copy by address",
    kernel: scan("kernel", [
      ctrl("kernel", "nvme0", "DUP", "0000:3b:00.0"),
      ctrl("kernel", "nvme1", "DUP", "0000:3c:00.0"),
    ]),
    spdk: scan("spdk", []),
    filter: { excluded: ["0000:3c:00.0"] },
    devices: [["DUP", "kernel", "0000:3b:00.0"]],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
    skipped: [["nvme1", "Excluded"]],
  },
  {
    name: "without the exclusion both copies are rejected",
    kernel: scan("kernel", [
      ctrl("kernel", "nvme0", "DUP", "0000:3b:00.0"),
      ctrl("kernel", "nvme1", "DUP", "0000:3c:00.0"),
    ]),
    spdk: scan("spdk", []),
    devices: [],
    kernelState: "degraded",
    spdkState: "ok",
    complete: false,
    problems: [
      ["kernel", "nvme0", "DuplicateSerial"],
      ["kernel", "nvme1", "DuplicateSerial"],
    ],
  },
  {
    name: "allowed list applies to both sources; filtered drives keep the scan complete",
    kernel: scan("kernel", [
      ctrl("kernel", "nvme0", "K1", "0000:3b:00.0"),
      ctrl("kernel", "nvme1", "K2", "0000:3c:00.0"),
    ]),
    spdk: scan("spdk", [ctrl("spdk", "Nvme0", "S1", "0000:81:00.0")]),
    filter: { allowed: ["K2", "0000:81:00.0"] },
    devices: [
      ["K2", "kernel", "0000:3c:00.0"],
      ["S1", "spdk", "0000:81:00.0"],
    ],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
    skipped: [["nvme0", "NotAllowed"]],
  },
  {
    name: "a broken drive excluded by its address no longer degrades its source",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")], {
      found: 2,
      problems: [
        {
          source: "kernel",
          controller: "nvme1",
          reason: "AttributeUnreadable",
          message: "EIO",
          pciAddress: "0000:3c:00.0",
        },
      ],
    }),
    spdk: scan("spdk", []),
    filter: { excluded: ["0000:3C:00.0"] },
    devices: [["K1", "kernel", "0000:3b:00.0"]],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
    skipped: [["nvme1", "Excluded"]],
  },
  {
    name: "a broken drive of unknown serial is not assumed to be outside the allowed list",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")], {
      found: 2,
      problems: [
        {
          source: "kernel",
          controller: "nvme1",
          reason: "AttributeUnreadable",
          message: "EIO",
          pciAddress: "0000:3c:00.0",
        },
      ],
    }),
    spdk: scan("spdk", []),
    filter: { allowed: ["K1"] },
    devices: [["K1", "kernel", "0000:3b:00.0"]],
    kernelState: "degraded",
    spdkState: "ok",
    complete: false,
    problems: [["kernel", "nvme1", "AttributeUnreadable"]],
  },
  {
    name: "a failed SPDK source keeps the kernel's devices",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")]),
    spdk: scan("spdk", [], { failure: { reason: "RpcFailed", message: "connection refused" } }),
    devices: [["K1", "kernel", "0000:3b:00.0"]],
    kernelState: "ok",
    spdkState: "failed",
    complete: false,
  },
  {
    name: "a failed kernel source keeps SPDK's devices",
    kernel: scan("kernel", [], { failure: { reason: "MountCheckFailed", message: "lsblk" } }),
    spdk: scan("spdk", [ctrl("spdk", "Nvme0", "S1", "0000:81:00.0")]),
    devices: [["S1", "spdk", "0000:81:00.0"]],
    kernelState: "failed",
    spdkState: "ok",
    complete: false,
  },
  {
    name: "a node without SPDK is complete",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")]),
    spdk: scan("spdk", [], { notConfigured: true }),
    devices: [["K1", "kernel", "0000:3b:00.0"]],
    kernelState: "ok",
    spdkState: "ok",
    complete: true,
  },
  {
    name: "a source's own problems degrade it but keep its valid controllers",
    kernel: scan("kernel", [ctrl("kernel", "nvme0", "K1", "0000:3b:00.0")], {
      found: 2,
      problems: [{ source: "kernel", controller: "nvme1", reason: "SerialMissing", message: "empty" }],
    }),
    spdk: scan("spdk", []),
    devices: [["K1", "kernel", "0000:3b:00.0"]],
    kernelState: "degraded",
    spdkState: "ok",
    complete: false,
    problems: [["kernel", "nvme1", "SerialMissing"]],
  },
];

test.each(rows)("$name", (row) => {
  const r = assembleInventory(row.kernel, row.spdk, row.filter);
  expect(r.devices.map((d) => [d.serial, d.activeBackend, d.pciAddress])).toEqual(row.devices);
  expect(r.kernel.state).toBe(row.kernelState as never);
  expect(r.spdk.state).toBe(row.spdkState as never);
  expect(r.complete).toBe(row.complete);
  expect(r.problems.map((p) => [p.source, p.controller, p.reason])).toEqual(row.problems ?? []);
  expect(r.skipped.map((s) => [s.controller, s.reason])).toEqual(row.skipped ?? []);
});

test("a merged device names both controllers and takes SPDK's facts", () => {
  const k = { ...ctrl("kernel", "nvme0", "X1", "0000:3b:00.0", 100), model: "kernel says" };
  const s = { ...ctrl("spdk", "Nvme0", "X1", "0000:3b:00.0", 100), model: "spdk says" };
  const [d] = assembleInventory(scan("kernel", [k]), scan("spdk", [s])).devices;
  expect(d).toEqual({
    serial: "X1",
    pciAddress: "0000:3b:00.0",
    model: "spdk says",
    numaNode: 0,
    namespace1Bytes: 100 * GiB,
    allocatableBytes: 99 * GiB,
    activeBackend: "spdk",
    kernel: { controller: "nvme0", blockDevice: "nvme0n1" },
    spdk: { controller: "Nvme0", bdev: "Nvme0n1" },
  });
});

test.each([
  ["one kind of problem names it", ["Namespace1Missing"], "Namespace1Missing"],
  ["several kinds are summarized", ["Namespace1Missing", "SerialMissing"], "ControllersRejected"],
])("degraded health reason: %s", (_name, reasons, want) => {
  const problems = reasons.map((reason, i) => ({
    source: "spdk" as const,
    controller: `Nvme${i}`,
    reason,
    message: "m",
  }));
  const r = assembleInventory(scan("kernel", []), scan("spdk", [], { problems, found: reasons.length }));
  expect(r.spdk).toMatchObject({ state: "degraded", reason: want });
  expect(r.spdk.message).toContain("Nvme0: m");
});

test("health reasons of failed and ok sources carry through", () => {
  const r = assembleInventory(
    scan("kernel", [], { failure: { reason: "SysfsUnreadable", message: "EIO" } }),
    scan("spdk", [], { notConfigured: true }),
  );
  expect(r.kernel).toEqual({ state: "failed", reason: "SysfsUnreadable", message: "EIO" });
  expect(r.spdk).toMatchObject({ state: "ok", reason: "NotConfigured" });
});
