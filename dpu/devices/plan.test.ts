// The pure decisions of CreateDevice: attach params per portal, missing paths, controller
// conflicts, record mismatches and what to do with a block device's content; plus device names.
import { describe, expect, test } from "bun:test";
import { AccessMode } from "../../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import type { DeviceContent } from "../../lib/host/blkid.ts";
import type { NvmeController } from "../../lib/spdk/schemas.ts";
import { VolumeContextKeys as K } from "../../lib/volume-context.ts";
import { mountDirFor, NAME_PREFIX, namesFor } from "./names.ts";
import {
  attachParamsFor,
  controllerConflict,
  missingPortals,
  planFilesystem,
  recordMismatch,
} from "./plan.ts";
import { ALTERNATE_PORTALS_KEY, parseCreateDevice } from "./request.ts";
import type { DeviceRecord } from "./state-store.ts";

const NQN = "nqn.2026-02.io.distort:pv-1";
const HOST = "nqn.2014-08.org.nvmexpress:uuid:3b0c8a52-5d1e-4c7b-9a44-0d2f6e8b1c37";
const spec = (ctx: Record<string, string> = {}, params: Record<string, string> = {}) =>
  parseCreateDevice({
    volumeId: "vol-1",
    accessModes: [AccessMode.RWO],
    volumeMode: "Block",
    publishContext: {},
    volumeContext: {
      [K.nqn]: NQN,
      [K.portalIP]: "10.0.0.1",
      [K.portalPort]: "4420",
      [K.transport]: "tcp",
      ...ctx,
    },
    storageParameters: params,
  });
const names = namesFor("vol-1");
const ctx = { names, hostNqn: HOST, trtypes: { tcp: "NVDA_TCP", rdma: "RDMA" } };

function ctrl(
  name: string,
  paths: { traddr: string; trsvcid?: string; subnqn?: string; host?: string }[],
): NvmeController {
  return {
    name,
    ctrlrs: paths.map((p) => ({
      trid: { trtype: "TCP", traddr: p.traddr, trsvcid: p.trsvcid ?? "4420", subnqn: p.subnqn ?? NQN },
      host: { nqn: p.host ?? HOST },
    })),
  } as NvmeController;
}

describe("names", () => {
  test("are deterministic, distinct per volume, short and valid SPDK names", () => {
    expect(namesFor("vol-1")).toEqual(names);
    expect(namesFor("vol-2").controller).not.toBe(names.controller);
    expect(names.controller).toMatch(new RegExp(`^${NAME_PREFIX}[0-9a-f]{20}$`));
    expect(names.bdev).toBe(`${names.controller}n1`);
    expect(names.fsdev).toBe(`${names.controller}_fs`);
    expect(names.key).toBe(`${names.controller}_dhchap`);
    // Any volume id, however odd, yields the same safe alphabet.
    expect(namesFor("ns/päth with spaces\t").controller).toMatch(/^[a-z0-9_]+$/);
    expect(mountDirFor("/var/lib/x", names)).toBe(`/var/lib/x/${names.controller}`);
  });
});

describe("attachParamsFor", () => {
  test("one portal: no multipath key; reconnect settings, host NQN and SNAP's trtype", () => {
    expect(attachParamsFor(spec(), ctx)).toEqual([
      {
        name: names.controller,
        trtype: "NVDA_TCP",
        adrfam: "ipv4",
        traddr: "10.0.0.1",
        trsvcid: "4420",
        subnqn: NQN,
        hostnqn: HOST,
        ctrlr_loss_timeout_sec: 600,
        reconnect_delay_sec: 10,
        fast_io_fail_timeout_sec: 0,
      },
    ]);
  });

  test("several portals: one controller name, each path with multipath and the key", () => {
    const s = spec(
      { [ALTERNATE_PORTALS_KEY]: "[fd00::2]:4421" },
      { "storage.distort.io/multipath": "failover" },
    );
    const out = attachParamsFor(s, { ...ctx, dhchapKey: names.key });
    expect(out.map((p) => [p.name, p.adrfam, p.traddr, p.trsvcid, p.multipath, p.dhchap_key])).toEqual([
      [names.controller, "ipv4", "10.0.0.1", "4420", "failover", names.key],
      [names.controller, "ipv6", "fd00::2", "4421", "failover", names.key],
    ]);
  });
});

describe("missingPortals and controllerConflict", () => {
  const two = spec({ [ALTERNATE_PORTALS_KEY]: "fd00::2" });
  test("no controller: every portal; a partial one: the rest; alternate trids count", () => {
    expect(missingPortals(two, undefined).map((p) => p.address)).toEqual(["10.0.0.1", "fd00::2"]);
    expect(
      missingPortals(two, ctrl(names.controller, [{ traddr: "10.0.0.1" }])).map((p) => p.address),
    ).toEqual(["fd00::2"]);
    expect(
      missingPortals(two, ctrl(names.controller, [{ traddr: "10.0.0.1" }, { traddr: "FD00::2" }])),
    ).toEqual([]);
    const withAlt = ctrl(names.controller, [{ traddr: "10.0.0.1" }]);
    (withAlt.ctrlrs[0] as Record<string, unknown>).alternate_trids = [
      { trtype: "TCP", traddr: "fd00::2", trsvcid: "4420", subnqn: NQN },
    ];
    expect(missingPortals(two, withAlt)).toEqual([]);
    // Another port or subsystem is another path.
    expect(
      missingPortals(two, ctrl(names.controller, [{ traddr: "10.0.0.1", trsvcid: "4421" }])).length,
    ).toBe(2);
  });

  test("conflicts", () => {
    expect(controllerConflict(two, ctx, [])).toBeUndefined();
    expect(controllerConflict(two, ctx, [ctrl(names.controller, [{ traddr: "10.0.0.1" }])])).toBeUndefined();
    expect(
      controllerConflict(two, ctx, [
        ctrl(names.controller, [{ traddr: "10.0.0.1", subnqn: "nqn.2026-02.io.distort:other" }]),
      ]),
    ).toContain("is connected to nqn.2026-02.io.distort:other");
    expect(
      controllerConflict(two, ctx, [
        ctrl(names.controller, [{ traddr: "10.0.0.1", host: "nqn.2016-06.io.spdk:other" }]),
      ]),
    ).toContain("connected as host nqn.2016-06.io.spdk:other");
    expect(controllerConflict(two, ctx, [ctrl("nvme_foreign", [{ traddr: "fd00::2" }])])).toContain(
      "nvme_foreign already reaches",
    );
    // A foreign controller for the same subsystem as another host is no conflict (another identity).
    expect(
      controllerConflict(two, ctx, [
        ctrl("nvme_foreign", [{ traddr: "fd00::2", host: "nqn.2016-06.io.spdk:x" }]),
      ]),
    ).toBeUndefined();
  });
});

describe("recordMismatch", () => {
  const record = (over: Partial<DeviceRecord> = {}): DeviceRecord => ({
    version: 1,
    volumeId: "vol-1",
    deviceName: names.bdev,
    phase: "ready",
    accessModes: [AccessMode.RWO],
    volumeMode: "Block",
    nqn: NQN,
    publishContext: {},
    volumeContext: {},
    storageParameters: {},
    createdAt: "t",
    updatedAt: "t",
    ...over,
  });
  test("same modes and subsystem match, whatever else changed", () => {
    expect(
      recordMismatch(
        record(),
        spec({ [K.portalIP]: "10.9.9.9" }, { "storage.distort.io/reconnectDelaySec": "3" }),
      ),
    ).toBeUndefined();
  });
  test("access modes, volume mode and subsystem are identity", () => {
    expect(recordMismatch(record({ accessModes: [AccessMode.ROX] }), spec())).toContain(
      "access modes ROX (requested RWO)",
    );
    expect(recordMismatch(record({ volumeMode: "Filesystem" }), spec())).toContain(
      "volume mode Filesystem (requested Block)",
    );
    expect(recordMismatch(record({ nqn: "nqn.2026-02.io.distort:pv-9" }), spec())).toContain(
      "subsystem nqn.2026-02.io.distort:pv-9",
    );
  });
});

describe("planFilesystem", () => {
  const opts = { defaultFsType: "ext4" as const, readonly: false, volumeId: "v" };
  const cases: [
    string,
    DeviceContent,
    Partial<typeof opts> & { fsType?: "ext4" | "xfs" },
    object | string,
  ][] = [
    ["blank: format with the default", { kind: "blank" }, {}, { format: "ext4", mountAs: "ext4" }],
    [
      "blank: format with the parameter",
      { kind: "blank" },
      { fsType: "xfs" },
      { format: "xfs", mountAs: "xfs" },
    ],
    [
      "blank and read-only: refuse",
      { kind: "blank" },
      { readonly: true },
      "holds no filesystem and is read-only",
    ],
    ["xfs: mount as is", { kind: "filesystem", fsType: "xfs" }, {}, { mountAs: "xfs" }],
    [
      "xfs, read-only: mount as is",
      { kind: "filesystem", fsType: "xfs" },
      { readonly: true },
      { mountAs: "xfs" },
    ],
    [
      "xfs but ext4 asked: refuse",
      { kind: "filesystem", fsType: "xfs" },
      { fsType: "ext4" },
      "already holds xfs",
    ],
    ["btrfs: refuse", { kind: "filesystem", fsType: "btrfs" }, {}, "holds a btrfs filesystem"],
    [
      "a partition table: refuse",
      { kind: "other", description: "a gpt partition table" },
      {},
      "holds a gpt partition table",
    ],
  ];
  for (const [name, content, o, want] of cases) {
    test(name, () => {
      if (typeof want === "string") {
        let err: unknown;
        try {
          planFilesystem(content, { ...opts, ...o });
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(StorageError);
        expect((err as StorageError).kind).toBe("precondition");
        expect((err as Error).message).toContain(want);
      } else {
        expect(planFilesystem(content, { ...opts, ...o })).toEqual(want as never);
      }
    });
  }
});
