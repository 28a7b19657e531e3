// Capability and context validation, table-driven: what the node accepts and how it reads it.
import { expect, test } from "bun:test";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { VolumeCapability_AccessMode_Mode as Mode, VolumeCapabilitySchema } from "../../gen/csi/v1/csi_pb.ts";
import type { StorageError } from "../../lib/errors.ts";
import { PublishContextKeys as P, VolumeContextKeys as V } from "../../lib/volume-context.ts";
import {
  type Capability,
  checkMountFlags,
  parseCapability,
  parseStageContexts,
  requireVolumeId,
  sameAccess,
} from "./validate.ts";

const cap = (init: MessageInitShape<typeof VolumeCapabilitySchema>) => create(VolumeCapabilitySchema, init);
const mount = (fsType: string, mode: Mode, mountFlags: string[] = []) =>
  cap({ accessType: { case: "mount", value: { fsType, mountFlags } }, accessMode: { mode } });

test.each<[string, ReturnType<typeof cap>, Capability]>([
  [
    "ext4 writer",
    mount("ext4", Mode.SINGLE_NODE_WRITER),
    { access: { kind: "mount", fsType: "ext4", mountFlags: [] }, mode: "SINGLE_NODE_WRITER" },
  ],
  [
    "xfs single writer with flags",
    mount("xfs", Mode.SINGLE_NODE_SINGLE_WRITER, [
      "noatime",
      'context="system_u:object_r:container_file_t:s0:c1,c2"',
    ]),
    {
      access: {
        kind: "mount",
        fsType: "xfs",
        mountFlags: ["noatime", 'context="system_u:object_r:container_file_t:s0:c1,c2"'],
      },
      mode: "SINGLE_NODE_SINGLE_WRITER",
    },
  ],
  [
    "default filesystem",
    mount("", Mode.SINGLE_NODE_MULTI_WRITER),
    { access: { kind: "mount", fsType: "ext4", mountFlags: [] }, mode: "SINGLE_NODE_MULTI_WRITER" },
  ],
  [
    "block",
    cap({ accessType: { case: "block", value: {} }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } }),
    { access: { kind: "block" }, mode: "SINGLE_NODE_WRITER" },
  ],
  [
    "single-node reader",
    mount("xfs", Mode.SINGLE_NODE_READER_ONLY),
    { access: { kind: "mount", fsType: "xfs", mountFlags: [] }, mode: "SINGLE_NODE_READER_ONLY" },
  ],
  [
    "multi-node reader, block",
    cap({ accessType: { case: "block", value: {} }, accessMode: { mode: Mode.MULTI_NODE_READER_ONLY } }),
    { access: { kind: "block" }, mode: "MULTI_NODE_READER_ONLY" },
  ],
  [
    "multi-node multi writer, block (live migration)",
    cap({ accessType: { case: "block", value: {} }, accessMode: { mode: Mode.MULTI_NODE_MULTI_WRITER } }),
    { access: { kind: "block" }, mode: "MULTI_NODE_MULTI_WRITER" },
  ],
])("accepts %s", (_name, c, want) => {
  expect(parseCapability(c, "ext4")).toEqual(want);
});

test.each<[string, ReturnType<typeof cap> | undefined, string]>([
  ["missing", undefined, "volume_capability is missing"],
  ["unknown mode", mount("ext4", Mode.UNKNOWN), "access mode UNKNOWN is not supported"],
  ["multi-node single writer", mount("ext4", Mode.MULTI_NODE_SINGLE_WRITER), "MULTI_NODE_SINGLE_WRITER"],
  [
    "multi-node multi writer on a filesystem",
    mount("ext4", Mode.MULTI_NODE_MULTI_WRITER),
    "MULTI_NODE_MULTI_WRITER is served for raw block volumes only",
  ],
  ["ext3", mount("ext3", Mode.SINGLE_NODE_WRITER), 'fs_type "ext3" is not supported'],
  ["nfs", mount("nfs", Mode.SINGLE_NODE_WRITER), 'fs_type "nfs" is not supported'],
  ["no access type", cap({ accessMode: { mode: Mode.SINGLE_NODE_WRITER } }), "neither block nor mount"],
  [
    "remount flag",
    mount("ext4", Mode.SINGLE_NODE_WRITER, ["remount"]),
    'mount flag "remount" is not allowed',
  ],
  ["newline in flag", mount("ext4", Mode.SINGLE_NODE_WRITER, ["a\nb"]), "NUL or newline"],
  ["blank flag", mount("ext4", Mode.SINGLE_NODE_WRITER, ["  "]), "empty flag"],
])("refuses %s", (_name, c, message) => {
  expect(() => parseCapability(c, "ext4")).toThrow(message);
  try {
    parseCapability(c, "ext4");
  } catch (err) {
    expect((err as StorageError).kind).toBe("invalid");
  }
});

test("volume ids", () => {
  expect(requireVolumeId("ns/pvc/uid")).toBe("ns/pvc/uid");
  expect(() => requireVolumeId("")).toThrow("empty");
  expect(() => requireVolumeId("a\0")).toThrow("NUL");
  expect(() => requireVolumeId("x".repeat(1025))).toThrow("longer");
});

test.each([
  ["ro,remount", "remount"],
  ["noatime, bind", "bind"],
  ["nodev,rbind,noexec", "rbind"],
  ["ro,MOVE", "MOVE"],
])("a forbidden flag inside the comma list %p is refused", (flag, named) => {
  expect(() => checkMountFlags(["noatime", flag])).toThrow(`mount flag "${named}" is not allowed`);
});

test("a comma list with an empty element is refused", () => {
  expect(() => checkMountFlags(["ro,,noatime"])).toThrow("empty flag");
});

test("a comma list of allowed flags passes through unchanged", () => {
  expect(checkMountFlags(["ro,noatime", "discard"])).toEqual(["ro,noatime", "discard"]);
});

test("mount flags pass through unchanged", () => {
  expect(checkMountFlags(["noatime", "discard"])).toEqual(["noatime", "discard"]);
});

test("equal accesses are the same", () => {
  expect(
    sameAccess(
      { kind: "mount", fsType: "ext4", mountFlags: ["a"] },
      { kind: "mount", fsType: "ext4", mountFlags: ["a"] },
    ),
  ).toBe(true);
  expect(sameAccess({ kind: "block" }, { kind: "block" })).toBe(true);
});

test("different accesses differ", () => {
  expect(sameAccess({ kind: "block" }, { kind: "mount", fsType: "ext4", mountFlags: [] })).toBe(false);
  expect(
    sameAccess(
      { kind: "mount", fsType: "xfs", mountFlags: [] },
      { kind: "mount", fsType: "ext4", mountFlags: [] },
    ),
  ).toBe(false);
  expect(
    sameAccess(
      { kind: "mount", fsType: "ext4", mountFlags: ["a"] },
      { kind: "mount", fsType: "ext4", mountFlags: [] },
    ),
  ).toBe(false);
});

const HOST = "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0";
const ctx = (over: Record<string, string> = {}) => ({
  [V.nqn]: "nqn.2026-01.io.distort:vol-1",
  [V.portalIP]: "fd00:100::7",
  [V.portalPort]: "4421",
  [V.transport]: "rdma",
  ...over,
});
const pub = { [P.hostNQN]: HOST, [P.attachmentId]: "att-7" };

test("contexts: IPv6 RDMA portal with reconnect settings, unknown keys ignored", () => {
  const t = parseStageContexts(
    ctx({
      [V.ctrlLossTmo]: "600",
      [V.reconnectDelay]: "10",
      [V.fastIoFailTmo]: "-1",
      [V.mkfsOptions]: "-b 4096",
      "csi.storage.k8s.io/pv/name": "pvc-1",
    }),
    pub,
  );
  expect(t).toEqual({
    connect: {
      transport: "rdma",
      address: "fd00:100::7",
      port: 4421,
      nqn: "nqn.2026-01.io.distort:vol-1",
      ctrlLossTmo: 600,
      reconnectDelay: 10,
      fastIoFailTmo: -1,
    },
    mkfsOptions: "-b 4096",
    morePortals: [],
    namespaceUUID: undefined,
    hostNqn: HOST,
    attachmentId: "att-7",
  });
});

test("contexts: further portals are listed without the primary one; a malformed list is refused", () => {
  const t = parseStageContexts(
    ctx({ [V.portals]: "[fd00:100::7]:4421,10.0.0.8:4420,[fd00:100::9]:4422" }),
    pub,
  );
  expect(t.morePortals).toEqual([
    { address: "10.0.0.8", port: 4420 },
    { address: "fd00:100::9", port: 4422 },
  ]);
  expect(() => parseStageContexts(ctx({ [V.portals]: "10.0.0.8" }), pub)).toThrow("portals must be ip:port");
});

test("contexts: a replicated volume's publish portals (serving node, then standbys) join the volume's own, each once", () => {
  const t = parseStageContexts(ctx({ [V.portals]: "[fd00:100::7]:4421,10.0.0.8:4420" }), {
    ...pub,
    [P.portals]: "10.0.0.9:4421,[fd00:100::7]:4421,10.0.0.8:4420,10.0.0.10:4421",
  });
  expect(t.connect.address).toBe("fd00:100::7");
  expect(t.morePortals).toEqual([
    { address: "10.0.0.8", port: 4420 },
    { address: "10.0.0.9", port: 4421 },
    { address: "10.0.0.10", port: 4421 },
  ]);
  expect(() => parseStageContexts(ctx(), { ...pub, [P.portals]: "10.0.0.9:0" })).toThrow(
    "portals port must be 1..65535",
  );
});

test.each<[string, Record<string, string>, Record<string, string>, string]>([
  ["port too high", ctx({ [V.portalPort]: "70000" }), pub, "portalPort must be <= 65535"],
  ["reconnect delay 0", ctx({ [V.reconnectDelay]: "0" }), pub, "reconnectDelay must be >= 1"],
  ["ctrl loss below -1", ctx({ [V.ctrlLossTmo]: "-2" }), pub, "ctrlLossTmo must be >= -1"],
  ["namespace id", ctx({ [V.namespaceUUID]: "xyz" }), pub, "not a UUID or NGUID"],
  ["host NQN missing", ctx(), { [P.attachmentId]: "a" }, "publish_context is malformed"],
  ["attachment id empty", ctx(), { [P.hostNQN]: HOST, [P.attachmentId]: "" }, "publish_context is malformed"],
])("contexts: refuses %s", (_name, vc, pc, message) => {
  expect(() => parseStageContexts(vc, pc)).toThrow(message);
});
