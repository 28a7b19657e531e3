// SPDK discovery from raw replies: PCIe controllers joined to their namespace-1 bdev, recorded
// NVMe/TCP controllers ignored, a controller without namespace 1 a problem, malformed entries
// isolated, and a failed RPC or a non-array reply failing the source.
import { expect, test } from "bun:test";
import { parseSpdkInventory, type SpdkInventorySource, scanSpdk } from "./spdk-source.ts";
import {
  lvolBdev,
  RECORDED_TCP_BDEV_NS1,
  RECORDED_TCP_BDEV_NS2,
  RECORDED_TCP_CONTROLLERS,
  recordedResult,
  type SpdkDrive,
  spdkBdevs,
  spdkControllers,
} from "./testdata/spdk-replies.ts";

const drive = (n: number, extra: Partial<SpdkDrive> = {}): SpdkDrive => ({
  name: `Nvme${n}`,
  pciAddress: `0000:${(0x81 + n).toString(16)}:00.0`,
  serial: `PHLJ00${n}`,
  model: "INTEL SSDPE2KX040T8",
  namespaces: [{ nsid: 1, blockSize: 4096, numBlocks: 976_754_646 }],
  ...extra,
});

const recordedTcp = () => ({
  controllers: recordedResult(RECORDED_TCP_CONTROLLERS) as unknown[],
  bdevs: [
    ...(recordedResult(RECORDED_TCP_BDEV_NS1) as unknown[]),
    ...(recordedResult(RECORDED_TCP_BDEV_NS2) as unknown[]),
  ],
});

test("a PCIe drive: serial and model from the namespace 1 bdev, size = num_blocks x block_size", () => {
  const d = drive(0, { numaId: 1 });
  const r = parseSpdkInventory(spdkControllers([d]), spdkBdevs([d], [lvolBdev()]));
  expect(r.problems).toEqual([]);
  expect(r.controllers).toEqual([
    {
      source: "spdk",
      controller: "Nvme0",
      serial: "PHLJ000",
      pciAddress: "0000:81:00.0",
      model: "INTEL SSDPE2KX040T8",
      numaNode: 1,
      namespace1Bytes: 976_754_646 * 4096,
      allocatableBytes: 3_960_777_736_192, // 4000787030016 - 40007870301, floored to 4 MiB
      bdev: "Nvme0n1",
    },
  ]);
});

test("recorded v25.05.1 NVMe/TCP controllers and their bdevs are someone else's storage", () => {
  const rec = recordedTcp();
  const r = parseSpdkInventory(rec.controllers, rec.bdevs);
  expect(r).toEqual({ controllers: [], problems: [], skipped: [], found: 0 });
});

interface Row {
  name: string;
  drives: SpdkDrive[];
  mangle?: (controllers: unknown[], bdevs: unknown[]) => void;
  advertised: string[];
  problems?: [string, string][];
  skipped?: string[][];
}

const rows: Row[] = [
  {
    name: "local drives next to recorded remote controllers",
    drives: [drive(0), drive(1)],
    mangle: (c, b) => {
      const rec = recordedTcp();
      c.push(...rec.controllers);
      b.push(...rec.bdevs);
    },
    advertised: ["Nvme0", "Nvme1"],
  },
  {
    name: "a controller without namespace 1 (only NSID 2) is degraded, its serial named",
    drives: [drive(0), drive(1, { namespaces: [{ nsid: 2, blockSize: 512, numBlocks: 1_000_000 }] })],
    advertised: ["Nvme0"],
    problems: [["Nvme1", "Namespace1Missing"]],
  },
  {
    name: "a controller with no namespace bdevs at all is degraded",
    drives: [drive(0), drive(1, { namespaces: [] })],
    advertised: ["Nvme0"],
    problems: [["Nvme1", "Namespace1Missing"]],
  },
  {
    name: "namespace 1 is chosen by NSID among several",
    drives: [
      drive(0, {
        namespaces: [
          { nsid: 3, blockSize: 512, numBlocks: 2_000_000 },
          { nsid: 1, blockSize: 512, numBlocks: 4_000_000 },
        ],
      }),
    ],
    advertised: ["Nvme0"],
  },
  {
    name: "a malformed controller entry is isolated",
    drives: [drive(0), drive(1)],
    mangle: (c) => {
      (c[1] as { ctrlrs: unknown }).ctrlrs = "oops";
    },
    advertised: ["Nvme0"],
    problems: [["Nvme1", "ControllerMalformed"]],
  },
  {
    name: "a malformed NVMe bdev is isolated and its controller lacks namespace 1",
    drives: [drive(0), drive(1)],
    mangle: (_c, b) => {
      (b[1] as { num_blocks: unknown }).num_blocks = "many";
    },
    advertised: ["Nvme0"],
    problems: [
      ["Nvme1n1", "BdevMalformed"],
      ["Nvme1", "Namespace1Missing"],
    ],
  },
  {
    name: "an empty serial from SPDK is rejected",
    drives: [drive(0, { serial: "" }), drive(1)],
    advertised: ["Nvme1"],
    problems: [["Nvme0", "SerialMissing"]],
  },
  {
    name: "failed and disabled controllers are absent; one being detached is in flux",
    drives: [
      drive(0, { state: "failed" }),
      drive(1, { state: "disabled" }),
      drive(2, { state: "deleting" }),
      drive(3),
    ],
    advertised: ["Nvme3"],
    problems: [["Nvme2", "ControllerInTransition"]],
    skipped: [
      ["Nvme0", "ControllerFailed", "PHLJ000"],
      ["Nvme1", "ControllerDisabled", "PHLJ001"],
    ],
  },
  {
    name: "trtype and traddr are compared case-insensitively",
    drives: [drive(0, { pciAddress: "0000:81:00.0" })],
    mangle: (c, b) => {
      const ctrl = c[0] as { ctrlrs: { trid: { trtype: string; traddr: string } }[] };
      const path = ctrl.ctrlrs[0];
      if (path) path.trid = { trtype: "pcie", traddr: "0000:81:00.0".toUpperCase() };
      const bdev = b[0] as { driver_specific: { nvme: { trid: { trtype: string } }[] } };
      const p = bdev.driver_specific.nvme[0];
      if (p) p.trid.trtype = "PCIE";
    },
    advertised: ["Nvme0"],
  },
];

test.each(rows)("$name", (row) => {
  const c = spdkControllers(row.drives);
  const b = spdkBdevs(row.drives);
  row.mangle?.(c, b);
  const r = parseSpdkInventory(c, b);
  expect(r.controllers.map((x) => x.controller)).toEqual(row.advertised);
  expect(r.problems.map((p) => [p.controller, p.reason])).toEqual(row.problems ?? []);
  expect(r.skipped.map((s) => [s.controller, s.reason, ...(s.serial ? [s.serial] : [])])).toEqual(
    row.skipped ?? [],
  );
  for (const x of r.controllers) expect(x.namespace1Bytes).toBeGreaterThan(0);
});

test("namespace 1 by NSID: the size is that namespace's", () => {
  const d = drive(0, {
    namespaces: [
      { nsid: 3, blockSize: 512, numBlocks: 2_000_000 },
      { nsid: 1, blockSize: 512, numBlocks: 4_000_000 },
    ],
  });
  const [c] = parseSpdkInventory(spdkControllers([d]), spdkBdevs([d])).controllers;
  expect(c?.namespace1Bytes).toBe(4_000_000 * 512);
  expect(c?.bdev).toBe("Nvme0n1");
});

const source = (controllers: () => Promise<unknown>, bdevs: () => Promise<unknown>): SpdkInventorySource => ({
  listControllers: controllers,
  getBdevs: bdevs,
});

test.each<[string, SpdkInventorySource | undefined, string | undefined, number]>([
  ["no SPDK on this node", undefined, undefined, 0],
  [
    "bdev_nvme_get_controllers fails",
    source(
      () => Promise.reject(new Error("connection refused")),
      async () => [],
    ),
    "RpcFailed",
    0,
  ],
  [
    "bdev_get_bdevs fails",
    source(
      async () => [],
      () => Promise.reject(new Error("timeout")),
    ),
    "RpcFailed",
    0,
  ],
  [
    "controllers reply is not an array",
    source(
      async () => ({ name: "Nvme0" }),
      async () => [],
    ),
    "ReplyMalformed",
    0,
  ],
  [
    "bdevs reply is not an array",
    source(
      async () => [],
      async () => null,
    ),
    "ReplyMalformed",
    0,
  ],
  [
    "healthy",
    source(
      async () => spdkControllers([drive(0)]),
      async () => spdkBdevs([drive(0)]),
    ),
    undefined,
    1,
  ],
])("scanSpdk: %s", async (_name, src, failure, advertised) => {
  const scan = await scanSpdk(src);
  expect(scan.failure?.reason).toBe(failure);
  expect(scan.controllers.length).toBe(advertised);
  expect(scan.notConfigured === true).toBe(src === undefined);
});

const versioned = (reply: () => Promise<unknown>): SpdkInventorySource => ({
  listControllers: async () => spdkControllers([drive(0)]),
  getBdevs: async () => spdkBdevs([drive(0)]),
  getVersion: reply,
});
const versionReply = (major: number, minor: number, patch: number) => ({
  version: `SPDK v${major}.${String(minor).padStart(2, "0")}.${patch} git sha1 0123456789`,
  fields: { major, minor, patch, suffix: "", commit: "0123456789" },
});

test("scanSpdk reads the target's version and records it with the drives", async () => {
  const scan = await scanSpdk(versioned(async () => versionReply(25, 5, 1)));
  expect(scan.failure).toBeUndefined();
  expect(scan.version).toBe("v25.05.1");
  expect(scan.controllers.length).toBe(1);
});

test("scanSpdk refuses a target older than the minimum: no drives, the version and why", async () => {
  const scan = await scanSpdk(versioned(async () => versionReply(24, 9, 0)));
  expect(scan.failure?.reason).toBe("SpdkVersionUnsupported");
  expect(scan.failure?.message).toContain("SPDK v24.09.0");
  expect(scan.failure?.message).toContain("v25.05.0 or newer");
  expect(scan.version).toBe("v24.09.0");
  expect(scan.controllers.length).toBe(0);
});

test("scanSpdk: a failing or malformed spdk_get_version is a failed source", async () => {
  expect((await scanSpdk(versioned(() => Promise.reject(new Error("closed"))))).failure?.reason).toBe(
    "RpcFailed",
  );
  expect((await scanSpdk(versioned(async () => ({ version: "x" })))).failure?.reason).toBe("ReplyMalformed");
});
