// Request validation, table-driven: every way a field can be wrong gets INVALID_ARGUMENT ("invalid")
// naming it, and valid requests come out normalised with defaults filled in.
import { describe, expect, test } from "bun:test";
import { AccessMode } from "../../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { VolumeContextKeys as K } from "../../lib/volume-context.ts";
import {
  ALTERNATE_PORTALS_KEY,
  type CreateDeviceInput,
  StorageParameterKeys as P,
  PUBLISHED_HOST_NQN_KEY,
  parseCreateDevice,
  parseDeviceRef,
  parseMaxEntries,
  parsePortal,
  RECONNECT_DEFAULTS,
  reconnectProblem,
  resolveReconnect,
} from "./request.ts";

const NQN = "nqn.2026-02.io.distort:pv-1";
const HOST = "nqn.2014-08.org.nvmexpress:uuid:3b0c8a52-5d1e-4c7b-9a44-0d2f6e8b1c37";
const CTX = { [K.nqn]: NQN, [K.portalIP]: "192.168.1.10", [K.portalPort]: "4420", [K.transport]: "rdma" };

function req(over: Partial<CreateDeviceInput> = {}): CreateDeviceInput {
  return {
    volumeId: "vol-1",
    accessModes: [AccessMode.RWO],
    volumeMode: "Block",
    publishContext: {},
    volumeContext: CTX,
    storageParameters: {},
    ...over,
  };
}

function invalid(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    return (err as Error).message;
  }
  throw new Error("expected an invalid-argument error");
}

describe("parseCreateDevice refuses", () => {
  const cases: [string, Partial<CreateDeviceInput>, string][] = [
    ["an empty volume id", { volumeId: "" }, "volume_id must not be empty"],
    ["an oversized volume id", { volumeId: "v".repeat(257) }, "over the 256-byte limit"],
    ["a multi-byte oversized volume id", { volumeId: "é".repeat(129) }, "258 bytes"],
    ["control characters in the volume id", { volumeId: "a\nb" }, "control characters"],
    ["no access mode", { accessModes: [] }, "at least one access mode"],
    ["ACCESS_MODE_UNSPECIFIED", { accessModes: [AccessMode.UNSPECIFIED] }, "ACCESS_MODE_UNSPECIFIED"],
    ["an unknown access mode", { accessModes: [AccessMode.RWO, 9] }, "unknown access mode 9"],
    ["a lowercase volume mode", { volumeMode: "block" }, 'volume_mode must be "Filesystem" or "Block"'],
    ["an unknown volume mode", { volumeMode: "Object" }, "volume_mode"],
    [
      "RWX on a filesystem",
      { volumeMode: "Filesystem", accessModes: [AccessMode.RWX] },
      "RWX is not offered",
    ],
    [
      "a context without an NQN",
      { volumeContext: { [K.portalIP]: "10.0.0.1", [K.portalPort]: "4420", [K.transport]: "tcp" } },
      `lacks ${K.nqn}`,
    ],
    [
      "a value that is not a string",
      { volumeContext: { ...CTX, [K.nqn]: undefined as unknown as string } },
      "is not a string",
    ],
    ["an empty volume context", { volumeContext: {} }, "is this a DISTORT volume"],
    [
      "a malformed NQN",
      { volumeContext: { ...CTX, [K.nqn]: "iqn.2001-04.com.example:x" } },
      "nqn is not an NQN",
    ],
    [
      "an NQN with a bad domain label",
      { volumeContext: { ...CTX, [K.nqn]: "nqn.2026-02.-bad:x" } },
      "domain label",
    ],
    [
      "a portal that is not an IP",
      { volumeContext: { ...CTX, [K.portalIP]: "storage-1.example" } },
      "portalIP is not an IP",
    ],
    ["port 0", { volumeContext: { ...CTX, [K.portalPort]: "0" } }, "portalPort must be >= 1"],
    ["port 65536", { volumeContext: { ...CTX, [K.portalPort]: "65536" } }, "portalPort must be <= 65535"],
    [
      "a port that is not a number",
      { volumeContext: { ...CTX, [K.portalPort]: "44x" } },
      "portalPort must be an integer",
    ],
    [
      "an unknown transport",
      { volumeContext: { ...CTX, [K.transport]: "fc" } },
      "transport must be rdma or tcp",
    ],
    [
      "a malformed namespace UUID",
      { volumeContext: { ...CTX, [K.namespaceUUID]: "xyz" } },
      "UUID or a 32-digit NGUID",
    ],
    [
      "a bad alternate portal",
      { volumeContext: { ...CTX, [ALTERNATE_PORTALS_KEY]: "host-b:4420" } },
      "not an IP address",
    ],
    [
      "an empty alternate portal",
      { volumeContext: { ...CTX, [ALTERNATE_PORTALS_KEY]: "10.0.0.2,," } },
      "empty entry",
    ],
    [
      "a duplicate portal",
      { volumeContext: { ...CTX, [ALTERNATE_PORTALS_KEY]: "192.168.1.10" } },
      "listed twice",
    ],
    [
      "an alternate port out of range",
      { volumeContext: { ...CTX, [ALTERNATE_PORTALS_KEY]: "[fd00::1]:70000" } },
      "1..65535",
    ],
    [
      "too many portals",
      {
        volumeContext: {
          ...CTX,
          [ALTERNATE_PORTALS_KEY]: Array.from({ length: 8 }, (_, i) => `10.0.0.${i + 1}`).join(","),
        },
      },
      "at most 8 portals",
    ],
    [
      "a context reconnect value out of range",
      { volumeContext: { ...CTX, [K.reconnectDelay]: "0" } },
      "reconnectDelay must be >= 1",
    ],
    [
      "an unknown storage.distort.io parameter",
      { storageParameters: { "storage.distort.io/ctrlLossTmo": "5" } },
      "unknown storage parameter",
    ],
    [
      "a negative reconnect delay",
      { storageParameters: { [P.reconnectDelaySec]: "-1" } },
      "must be 0..86400",
    ],
    ["a reconnect delay with a sign", { storageParameters: { [P.reconnectDelaySec]: "+5" } }, "whole number"],
    ["a fractional loss timeout", { storageParameters: { [P.ctrlrLossTimeoutSec]: "1.5" } }, "whole number"],
    [
      "a loss timeout below -1",
      { storageParameters: { [P.ctrlrLossTimeoutSec]: "-2" } },
      "must be -1..2147483647",
    ],
    [
      "an 11-digit number",
      { storageParameters: { [P.fastIoFailTimeoutSec]: "99999999999" } },
      "whole number",
    ],
    [
      "a delay longer than the loss timeout",
      { storageParameters: { [P.ctrlrLossTimeoutSec]: "5", [P.reconnectDelaySec]: "10" } },
      "reconnect_delay_sec 10 must not exceed ctrlr_loss_timeout_sec 5",
    ],
    [
      "reconnecting with loss timeout 0",
      { storageParameters: { [P.ctrlrLossTimeoutSec]: "0", [P.reconnectDelaySec]: "3" } },
      "with ctrlr_loss_timeout_sec 0",
    ],
    [
      "fast-io-fail shorter than the delay",
      { storageParameters: { [P.reconnectDelaySec]: "10", [P.fastIoFailTimeoutSec]: "5" } },
      "fast_io_fail_timeout_sec 5 must be 0 (off) or >= reconnect_delay_sec 10",
    ],
    [
      "an unknown multipath mode",
      { storageParameters: { [P.multipath]: "active-active" } },
      '"failover" or "multipath"',
    ],
    [
      "a Secret key without a name",
      { storageParameters: { [P.dhchapSecretKey]: "k" } },
      "needs storage.distort.io/dhchapSecretName",
    ],
    [
      "a Secret name without a key",
      { storageParameters: { [P.dhchapSecretName]: "s" } },
      "needs storage.distort.io/dhchapSecretKey",
    ],
    [
      "a bad Secret name",
      { storageParameters: { [P.dhchapSecretName]: "Bad_Name", [P.dhchapSecretKey]: "k" } },
      "must be a Secret name",
    ],
    [
      "a bad Secret key",
      { storageParameters: { [P.dhchapSecretName]: "s", [P.dhchapSecretKey]: "a/b" } },
      "Secret data key",
    ],
    ["an unknown fsType", { storageParameters: { [P.fsType]: "btrfs" } }, "must be one of ext4, xfs"],
    [
      "a published host NQN that is no NQN",
      { publishContext: { [PUBLISHED_HOST_NQN_KEY]: "host-a" } },
      PUBLISHED_HOST_NQN_KEY,
    ],
    [
      "too many entries in a map",
      { storageParameters: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"])) },
      "storage_parameters has 65 entries",
    ],
    [
      "an oversized map value",
      { publishContext: { a: "x".repeat(4097) } },
      'publish_context["a"] is over 4096 bytes',
    ],
    ["an empty map key", { volumeContext: { ...CTX, "": "x" } }, "volume_context has an empty key"],
  ];
  for (const [name, over, message] of cases) {
    test(name, () => expect(invalid(() => parseCreateDevice(req(over)))).toContain(message));
  }
});

describe("parseCreateDevice accepts", () => {
  test("a minimal Block request, with defaults", () => {
    const s = parseCreateDevice(
      req({ storageParameters: { policy: "p1", "csi.storage.k8s.io/fstype": "ext4" } }),
    );
    expect(s.volumeMode).toBe("Block");
    expect(s.readonly).toBe(false);
    expect(s.target).toEqual({
      nqn: NQN,
      transport: "rdma",
      portals: [{ address: "192.168.1.10", port: 4420, adrfam: "ipv4" }],
    });
    expect(s.reconnect).toEqual(RECONNECT_DEFAULTS);
    expect(s.multipath).toBe("multipath");
    expect(s.dhchap).toBeUndefined();
    expect(s.storageParameters).toEqual({ policy: "p1", "csi.storage.k8s.io/fstype": "ext4" });
  });

  test("the CSI controller's portals list: every listener is a path, the primary once", () => {
    const s = parseCreateDevice(
      req({ volumeContext: { ...CTX, [K.portals]: "192.168.1.10:4420,192.168.2.10:4420,[fd00::10]:4420" } }),
    );
    expect(s.target.portals).toEqual([
      { address: "192.168.1.10", port: 4420, adrfam: "ipv4" },
      { address: "192.168.2.10", port: 4420, adrfam: "ipv4" },
      { address: "fd00::10", port: 4420, adrfam: "ipv6" },
    ]);
  });

  test("an empty volume mode is Filesystem; modes are sorted and deduplicated; ROX alone is read-only", () => {
    const s = parseCreateDevice(req({ volumeMode: "", accessModes: [AccessMode.ROX, AccessMode.ROX] }));
    expect(s.volumeMode).toBe("Filesystem");
    expect(s.accessModes).toEqual([AccessMode.ROX]);
    expect(s.readonly).toBe(true);
    const rw = parseCreateDevice(req({ accessModes: [AccessMode.RWOP, AccessMode.ROX, AccessMode.RWO] }));
    expect(rw.accessModes).toEqual([AccessMode.RWO, AccessMode.ROX, AccessMode.RWOP]);
    expect(rw.readonly).toBe(false);
  });

  test("IPv6 portals, alternate portals with and without ports, multipath and DH-CHAP parameters", () => {
    const s = parseCreateDevice(
      req({
        volumeContext: {
          ...CTX,
          [K.portalIP]: "fd00::10",
          [ALTERNATE_PORTALS_KEY]: "10.0.0.2, [fd00::11]:4421,10.0.0.3:4422",
          [K.namespaceUUID]: "3B0C8A52-5D1E-4C7B-9A44-0D2F6E8B1C37",
        },
        storageParameters: {
          [P.multipath]: "failover",
          [P.dhchapSecretName]: "chap",
          [P.dhchapSecretKey]: "secret",
          [P.fsType]: "xfs",
        },
        publishContext: { [PUBLISHED_HOST_NQN_KEY]: HOST },
      }),
    );
    expect(s.target.portals).toEqual([
      { address: "fd00::10", port: 4420, adrfam: "ipv6" },
      { address: "10.0.0.2", port: 4420, adrfam: "ipv4" },
      { address: "fd00::11", port: 4421, adrfam: "ipv6" },
      { address: "10.0.0.3", port: 4422, adrfam: "ipv4" },
    ]);
    expect(s.target.namespaceId).toBe("3b0c8a525d1e4c7b9a440d2f6e8b1c37");
    expect(s.multipath).toBe("failover");
    expect(s.dhchap).toEqual({ secretName: "chap", secretKey: "secret" });
    expect(s.fsType).toBe("xfs");
    expect(s.publishedHostNqn).toBe(HOST);
  });

  test("the volume context's nvme-cli reconnect settings apply unless storage parameters override them", () => {
    const ctx = { ...CTX, [K.ctrlLossTmo]: "-1", [K.reconnectDelay]: "5", [K.fastIoFailTmo]: "-1" };
    expect(parseCreateDevice(req({ volumeContext: ctx })).reconnect).toEqual({
      ctrlrLossTimeoutSec: -1,
      reconnectDelaySec: 5,
      fastIoFailTimeoutSec: 0,
    });
    const over = parseCreateDevice(
      req({
        volumeContext: ctx,
        storageParameters: { [P.ctrlrLossTimeoutSec]: "60", [P.fastIoFailTimeoutSec]: "20" },
      }),
    );
    expect(over.reconnect).toEqual({
      ctrlrLossTimeoutSec: 60,
      reconnectDelaySec: 5,
      fastIoFailTimeoutSec: 20,
    });
  });
});

describe("resolveReconnect", () => {
  const cases: [string, object, object, object][] = [
    ["defaults", {}, {}, { ctrlrLossTimeoutSec: 600, reconnectDelaySec: 10, fastIoFailTimeoutSec: 0 }],
    [
      "loss 0 turns reconnecting off",
      { ctrlrLossTimeoutSec: 0 },
      {},
      { ctrlrLossTimeoutSec: 0, reconnectDelaySec: 0, fastIoFailTimeoutSec: 0 },
    ],
    [
      "a short loss timeout shortens the default delay",
      { ctrlrLossTimeoutSec: 4 },
      {},
      { ctrlrLossTimeoutSec: 4, reconnectDelaySec: 4, fastIoFailTimeoutSec: 0 },
    ],
    [
      "forever",
      { ctrlrLossTimeoutSec: -1 },
      {},
      { ctrlrLossTimeoutSec: -1, reconnectDelaySec: 10, fastIoFailTimeoutSec: 0 },
    ],
    [
      "parameters win over context",
      { reconnectDelaySec: 2 },
      { reconnectDelaySec: 7 },
      { ctrlrLossTimeoutSec: 600, reconnectDelaySec: 2, fastIoFailTimeoutSec: 0 },
    ],
    [
      "context fills what parameters leave",
      {},
      { fastIoFailTimeoutSec: 30 },
      { ctrlrLossTimeoutSec: 600, reconnectDelaySec: 10, fastIoFailTimeoutSec: 30 },
    ],
  ];
  for (const [name, params, context, want] of cases)
    test(name, () => expect(resolveReconnect(params, context)).toEqual(want as never));

  test("SPDK's rules, each named", () => {
    expect(
      reconnectProblem({ ctrlrLossTimeoutSec: 30, reconnectDelaySec: 0, fastIoFailTimeoutSec: 0 }),
    ).toContain("needs a reconnect_delay_sec");
    expect(
      reconnectProblem({ ctrlrLossTimeoutSec: 30, reconnectDelaySec: 5, fastIoFailTimeoutSec: 31 }),
    ).toContain("must not exceed ctrlr_loss_timeout_sec 30");
    expect(
      reconnectProblem({ ctrlrLossTimeoutSec: -1, reconnectDelaySec: 5, fastIoFailTimeoutSec: 3600 }),
    ).toBeUndefined();
    expect(
      reconnectProblem({ ctrlrLossTimeoutSec: -1, reconnectDelaySec: 0, fastIoFailTimeoutSec: 0 }),
    ).toContain("needs a reconnect_delay_sec");
  });
});

describe("other requests", () => {
  test("DeleteDevice/GetDevice need a volume id and a device name", () => {
    expect(parseDeviceRef({ volumeId: "v", deviceName: "d" })).toEqual({ volumeId: "v", deviceName: "d" });
    expect(invalid(() => parseDeviceRef({ volumeId: "", deviceName: "d" }))).toContain(
      "volume_id must not be empty",
    );
    expect(invalid(() => parseDeviceRef({ volumeId: "v", deviceName: "" }))).toContain(
      "device_name must not be empty",
    );
    expect(invalid(() => parseDeviceRef({ volumeId: "v", deviceName: "d".repeat(257) }))).toContain(
      "device_name is 257 bytes",
    );
    expect(invalid(() => parseDeviceRef({ volumeId: "v", deviceName: "a\u0000b" }))).toContain(
      "control characters",
    );
  });

  test("ListDevices max_entries", () => {
    expect(parseMaxEntries(0)).toBe(0);
    expect(parseMaxEntries(10)).toBe(10);
    expect(invalid(() => parseMaxEntries(-1))).toContain("must not be negative");
  });

  test("portal syntax", () => {
    expect(parsePortal("[::1]", 4420)).toEqual({ address: "::1", port: 4420, adrfam: "ipv6" });
    expect(parsePortal("fd00::1", 4420)).toEqual({ address: "fd00::1", port: 4420, adrfam: "ipv6" });
    expect(parsePortal(" 10.1.1.1:4430 ", 4420)).toEqual({ address: "10.1.1.1", port: 4430, adrfam: "ipv4" });
    expect(invalid(() => parsePortal("10.1.1.1:", 4420))).toContain("port");
  });
});
