// The Node service against in-memory host ports: a bad-input table for every RPC (right code, no
// port touched), and the behaviour of stage/publish/unpublish/unstage, stats, health and expansion
// (idempotency, conflicts, filesystem safety, disconnect failures, busy volumes).

import { beforeEach, describe, expect, test } from "bun:test";
import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { Code, type HandlerContext } from "@connectrpc/connect";
import {
  VolumeCapability_AccessMode_Mode as Mode,
  NodeExpandVolumeRequestSchema,
  NodeGetVolumeHealthRequestSchema,
  NodeGetVolumeStatsRequestSchema,
  type NodeGetVolumeStatsResponse,
  NodeGetVolumeStatsResponseSchema,
  NodePublishVolumeRequestSchema,
  NodeStageVolumeRequestSchema,
  NodeUnpublishVolumeRequestSchema,
  NodeUnstageVolumeRequestSchema,
  NodeServiceCapability_RPC_Type as RpcType,
  VolumeHealthErrorType,
  VolumeUsage_Unit,
} from "../gen/csi/v1/csi_pb.ts";
import { ManualClock } from "../lib/clock.ts";
import { toConnectError } from "../lib/grpc/status.ts";
import { silentLogger } from "../lib/log.ts";
import { generateHostKeyPair, hostEntryKeys } from "../lib/nvme/dhchap-keys.ts";
import { PublishContextKeys, VolumeContextKeys } from "../lib/volume-context.ts";
import { externalIdFor, nqnFor } from "../lib/volume-identity.ts";
import { StagingSweep } from "./node/staging-sweep.ts";
import { CallLog, FakeFs, FakeInitiator, FakeMounter, MemoryStateStore } from "./node/test-doubles.ts";
import { conditionOf, VOLUME_CONDITION_RPC } from "./node/volume-condition.ts";
import { createNode, type createNodeService, type NodeDeps, type NodePlugin } from "./node.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0";
const VOL_UID = "5b0c7e1a-2d3f-4a5b-8c6d-7e8f9a0b1c2d";
/** The subsystem the controller names for VOL (from its UID). */
const NQN = nqnFor(externalIdFor(VOL_UID));
const NS_UUID = "7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12";
const DEV = "/dev/nvme1n1";
const VOL = `default/pvc-1/${VOL_UID}`;
const STAGE = "/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/ab12/globalmount";
const TARGET = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1/mount";
const TARGET2 = "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/pvc-1/mount";
const BLOCK_TARGET = "/var/lib/kubelet/pods/p1/volumeDevices/kubernetes.io~csi/pvc-1";

const volumeContext = (over: Record<string, string | undefined> = {}) => {
  const base: Record<string, string | undefined> = {
    [VolumeContextKeys.nqn]: NQN,
    [VolumeContextKeys.portalIP]: "192.168.100.7",
    [VolumeContextKeys.portalPort]: "4420",
    [VolumeContextKeys.transport]: "tcp",
    [VolumeContextKeys.namespaceUUID]: NS_UUID,
    ...over,
  };
  return Object.fromEntries(Object.entries(base).filter(([, v]) => v !== undefined)) as Record<
    string,
    string
  >;
};
const publishContext = (over: Record<string, string | undefined> = {}) => {
  const base: Record<string, string | undefined> = {
    [PublishContextKeys.hostNQN]: HOST,
    [PublishContextKeys.attachmentId]: "att-1",
    ...over,
  };
  return Object.fromEntries(Object.entries(base).filter(([, v]) => v !== undefined)) as Record<
    string,
    string
  >;
};

type Cap = MessageInitShape<typeof NodeStageVolumeRequestSchema>["volumeCapability"];
const mountCap = (
  fsType = "ext4",
  mode = Mode.SINGLE_NODE_WRITER,
  mountFlags: string[] = [],
  volumeMountGroup = "",
): Cap => ({
  accessType: { case: "mount", value: { fsType, mountFlags, volumeMountGroup } },
  accessMode: { mode },
});
const blockCap = (mode = Mode.SINGLE_NODE_WRITER): Cap => ({
  accessType: { case: "block", value: {} },
  accessMode: { mode },
});

interface StageInit {
  volumeId?: string;
  stagingTargetPath?: string;
  volumeCapability?: Cap;
  volumeContext?: Record<string, string>;
  publishContext?: Record<string, string>;
  secrets?: Record<string, string>;
}
interface PublishInit {
  volumeId?: string;
  stagingTargetPath?: string;
  targetPath?: string;
  volumeCapability?: Cap;
  readonly?: boolean;
}

const stageReq = (over: StageInit = {}) =>
  create(NodeStageVolumeRequestSchema, {
    volumeId: VOL,
    stagingTargetPath: STAGE,
    volumeCapability: mountCap(),
    volumeContext: volumeContext(),
    publishContext: publishContext(),
    ...over,
  });
const publishReq = (over: PublishInit = {}) =>
  create(NodePublishVolumeRequestSchema, {
    volumeId: VOL,
    stagingTargetPath: STAGE,
    targetPath: TARGET,
    volumeCapability: mountCap(),
    readonly: false,
    ...over,
  });
const unpublishReq = (targetPath = TARGET) =>
  create(NodeUnpublishVolumeRequestSchema, { volumeId: VOL, targetPath });
const unstageReq = () => create(NodeUnstageVolumeRequestSchema, { volumeId: VOL, stagingTargetPath: STAGE });

const ctx = () => ({ signal: new AbortController().signal }) as unknown as HandlerContext;

let log: CallLog;
let initiator: FakeInitiator;
let mounter: FakeMounter;
let fs: FakeFs;
let state: MemoryStateStore;
let svc: ReturnType<typeof createNodeService>;
let plugin: NodePlugin;

/**
 * Time for the device waits: each sleep passes at once and moves now() by its length, so a wait
 * that runs to its deadline costs no wall time and its length is exact.
 */
class SteppingClock extends ManualClock {
  override sleep(ms: number, signal?: AbortSignal): Promise<void> {
    const slept = super.sleep(ms, signal);
    this.advance(Math.max(0, ms));
    return slept;
  }
}
let clock: SteppingClock;

function build(over: Partial<NodeDeps> = {}) {
  plugin = createNode({
    nodeId: "worker-a",
    hostNqn: HOST,
    topology: { "topology.storage.distort.io/node": "worker-a" },
    maxVolumesPerNode: 64,
    initiator,
    mounter,
    fs,
    state,
    clock,
    logger: silentLogger,
    deviceWaitMs: 200,
    pollMs: 5,
    ...over,
  });
  svc = plugin.service;
}

beforeEach(() => {
  clock = new SteppingClock(Date.now());
  log = new CallLog();
  initiator = new FakeInitiator(log);
  mounter = new FakeMounter(log);
  fs = new FakeFs(log);
  state = new MemoryStateStore(log);
  for (const d of [
    "/var",
    "/var/lib",
    "/var/lib/kubelet",
    "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins/kubernetes.io",
    "/var/lib/kubelet/plugins/kubernetes.io/csi",
    "/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io",
    "/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/ab12",
    STAGE,
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/pods/p1",
    "/var/lib/kubelet/pods/p1/volumes",
    "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi",
    "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1",
    "/var/lib/kubelet/pods/p1/volumeDevices",
    "/var/lib/kubelet/pods/p1/volumeDevices/kubernetes.io~csi",
    "/var/lib/kubelet/pods/p2",
    "/var/lib/kubelet/pods/p2/volumes",
    "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi",
    "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/pvc-1",
    "/dev",
  ])
    fs.dirs.add(d);
  fs.files.set(DEV, "");
  initiator.devices.set(NQN, DEV);
  mounter.addDevice(DEV, { kind: "blank" }, 1 << 30);
  build();
});

/** The gRPC code a call fails with (the server maps errors exactly so). */
async function codeOf(p: unknown): Promise<Code | "ok"> {
  try {
    await p;
    return "ok";
  } catch (err) {
    return toConnectError(err).code;
  }
}

type Rpc = keyof typeof svc;
const call = (rpc: Rpc, req: unknown) =>
  (svc[rpc] as (r: unknown, c: HandlerContext) => Promise<unknown>)(req, ctx());

describe("bad input: right code, no port touched", () => {
  const I = Code.InvalidArgument;
  const P = Code.FailedPrecondition;
  const NF = Code.NotFound;
  const cases: [string, Rpc, unknown, Code][] = [
    ["stage: empty volume id", "nodeStageVolume", stageReq({ volumeId: "" }), I],
    ["stage: NUL in volume id", "nodeStageVolume", stageReq({ volumeId: "a\0b" }), I],
    ["stage: empty staging path", "nodeStageVolume", stageReq({ stagingTargetPath: "" }), I],
    ["stage: relative staging path", "nodeStageVolume", stageReq({ stagingTargetPath: "var/lib/x" }), I],
    ["stage: traversal", "nodeStageVolume", stageReq({ stagingTargetPath: "/var/lib/kubelet/../../etc" }), I],
    ["stage: trailing separator", "nodeStageVolume", stageReq({ stagingTargetPath: `${STAGE}/` }), I],
    ["stage: NUL in path", "nodeStageVolume", stageReq({ stagingTargetPath: `${STAGE}\0x` }), I],
    ["stage: root", "nodeStageVolume", stageReq({ stagingTargetPath: "/" }), I],
    ["stage: no capability", "nodeStageVolume", stageReq({ volumeCapability: undefined }), I],
    [
      "stage: no access type",
      "nodeStageVolume",
      stageReq({ volumeCapability: { accessMode: { mode: Mode.SINGLE_NODE_WRITER } } }),
      I,
    ],
    [
      "stage: no access mode",
      "nodeStageVolume",
      stageReq({ volumeCapability: { accessType: { case: "block", value: {} } } }),
      I,
    ],
    [
      "stage: multi-node writer",
      "nodeStageVolume",
      stageReq({ volumeCapability: mountCap("ext4", Mode.MULTI_NODE_MULTI_WRITER) }),
      I,
    ],
    [
      "stage: multi-node single writer",
      "nodeStageVolume",
      stageReq({ volumeCapability: blockCap(Mode.MULTI_NODE_SINGLE_WRITER) }),
      I,
    ],
    ["stage: btrfs", "nodeStageVolume", stageReq({ volumeCapability: mountCap("btrfs") }), I],
    ["stage: EXT4 in capitals", "nodeStageVolume", stageReq({ volumeCapability: mountCap("EXT4") }), I],
    [
      "stage: bind flag",
      "nodeStageVolume",
      stageReq({ volumeCapability: mountCap("xfs", Mode.SINGLE_NODE_WRITER, ["bind"]) }),
      I,
    ],
    [
      "stage: empty flag",
      "nodeStageVolume",
      stageReq({ volumeCapability: mountCap("xfs", Mode.SINGLE_NODE_WRITER, [""]) }),
      I,
    ],
    [
      "stage: a mount group that is not a group id",
      "nodeStageVolume",
      stageReq({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_WRITER, [], "staff") }),
      I,
    ],
    [
      "stage: a mount group above the largest gid",
      "nodeStageVolume",
      stageReq({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_WRITER, [], "4294967295") }),
      I,
    ],
    ["stage: no volume context", "nodeStageVolume", stageReq({ volumeContext: {} }), I],
    [
      "stage: no NQN",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.nqn]: undefined }) }),
      I,
    ],
    [
      "stage: malformed NQN",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.nqn]: "vol-1" }) }),
      I,
    ],
    [
      "stage: the context names another volume's subsystem than the id's UID derives",
      "nodeStageVolume",
      stageReq({
        volumeContext: volumeContext({
          [VolumeContextKeys.nqn]: nqnFor(externalIdFor("0f8fad5b-d9cb-469f-a165-70867728950e")),
        }),
      }),
      I,
    ],
    [
      "stage: a volume id this driver never issued",
      "nodeStageVolume",
      stageReq({ volumeId: "default/pvc-1/not-a-uid" }),
      NF,
    ],
    [
      "stage: port 0",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.portalPort]: "0" }) }),
      I,
    ],
    [
      "stage: port not a number",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.portalPort]: "44x" }) }),
      I,
    ],
    [
      "stage: address not an IP",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.portalIP]: "storage-1" }) }),
      I,
    ],
    [
      "stage: transport fc",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.transport]: "fc" }) }),
      I,
    ],
    [
      "stage: namespace id not a UUID",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.namespaceUUID]: "1" }) }),
      I,
    ],
    [
      "stage: ctrlLossTmo not a number",
      "nodeStageVolume",
      stageReq({ volumeContext: volumeContext({ [VolumeContextKeys.ctrlLossTmo]: "soon" }) }),
      I,
    ],
    ["stage: no publish context", "nodeStageVolume", stageReq({ publishContext: {} }), I],
    [
      "stage: no attachment id",
      "nodeStageVolume",
      stageReq({ publishContext: publishContext({ [PublishContextKeys.attachmentId]: undefined }) }),
      I,
    ],
    [
      "stage: host NQN not an NQN",
      "nodeStageVolume",
      stageReq({ publishContext: publishContext({ [PublishContextKeys.hostNQN]: "worker-a" }) }),
      I,
    ],
    [
      "stage: published to another host",
      "nodeStageVolume",
      stageReq({
        publishContext: publishContext({
          [PublishContextKeys.hostNQN]: "nqn.2026-01.io.distort:host:worker-b",
        }),
      }),
      P,
    ],
    [
      "unstage: empty volume id",
      "nodeUnstageVolume",
      create(NodeUnstageVolumeRequestSchema, { stagingTargetPath: STAGE }),
      I,
    ],
    [
      "unstage: empty path",
      "nodeUnstageVolume",
      create(NodeUnstageVolumeRequestSchema, { volumeId: VOL }),
      I,
    ],
    [
      "unstage: traversal",
      "nodeUnstageVolume",
      create(NodeUnstageVolumeRequestSchema, { volumeId: VOL, stagingTargetPath: "/var/lib/../../root" }),
      I,
    ],
    [
      "unstage: trailing separator",
      "nodeUnstageVolume",
      create(NodeUnstageVolumeRequestSchema, { volumeId: VOL, stagingTargetPath: "/var/lib/" }),
      I,
    ],
    ["publish: empty volume id", "nodePublishVolume", publishReq({ volumeId: "" }), I],
    ["publish: empty target", "nodePublishVolume", publishReq({ targetPath: "" }), I],
    ["publish: relative target", "nodePublishVolume", publishReq({ targetPath: "pods/p1/mount" }), I],
    [
      "publish: traversal in target",
      "nodePublishVolume",
      publishReq({ targetPath: "/var/lib/kubelet/pods/../../../etc" }),
      I,
    ],
    [
      "publish: dot segment in target",
      "nodePublishVolume",
      publishReq({ targetPath: "/var/lib/./kubelet" }),
      I,
    ],
    ["publish: NUL in target", "nodePublishVolume", publishReq({ targetPath: `${TARGET}\0` }), I],
    ["publish: no staging path", "nodePublishVolume", publishReq({ stagingTargetPath: "" }), I],
    [
      "publish: relative staging path",
      "nodePublishVolume",
      publishReq({ stagingTargetPath: "globalmount" }),
      I,
    ],
    ["publish: target is the staging path", "nodePublishVolume", publishReq({ targetPath: STAGE }), I],
    ["publish: no capability", "nodePublishVolume", publishReq({ volumeCapability: undefined }), I],
    [
      "publish: multi-node mode",
      "nodePublishVolume",
      publishReq({ volumeCapability: blockCap(Mode.MULTI_NODE_SINGLE_WRITER) }),
      I,
    ],
    ["publish: vfat", "nodePublishVolume", publishReq({ volumeCapability: mountCap("vfat") }), I],
    [
      "unpublish: empty volume id",
      "nodeUnpublishVolume",
      create(NodeUnpublishVolumeRequestSchema, { targetPath: TARGET }),
      I,
    ],
    ["unpublish: empty target", "nodeUnpublishVolume", unpublishReq(""), I],
    ["unpublish: relative target", "nodeUnpublishVolume", unpublishReq("mount"), I],
    [
      "unpublish: traversal",
      "nodeUnpublishVolume",
      unpublishReq("/var/lib/kubelet/pods/p1/../../../../etc/passwd"),
      I,
    ],
    ["unpublish: double separator", "nodeUnpublishVolume", unpublishReq("/var//lib"), I],
    [
      "stats: empty volume id",
      "nodeGetVolumeStats",
      create(NodeGetVolumeStatsRequestSchema, { volumePath: TARGET }),
      I,
    ],
    [
      "stats: empty path",
      "nodeGetVolumeStats",
      create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL }),
      I,
    ],
    [
      "stats: relative path",
      "nodeGetVolumeStats",
      create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL, volumePath: "x/y" }),
      NF,
    ],
    [
      "stats: bad staging path",
      "nodeGetVolumeStats",
      create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL, volumePath: TARGET, stagingTargetPath: "x" }),
      I,
    ],
    ["health: empty volume id", "nodeGetVolumeHealth", create(NodeGetVolumeHealthRequestSchema, {}), I],
    [
      "health: relative publish path",
      "nodeGetVolumeHealth",
      create(NodeGetVolumeHealthRequestSchema, { volumeId: VOL, volumePublishPath: "mount" }),
      I,
    ],
    [
      "expand: empty volume id",
      "nodeExpandVolume",
      create(NodeExpandVolumeRequestSchema, { volumePath: TARGET }),
      I,
    ],
    ["expand: empty path", "nodeExpandVolume", create(NodeExpandVolumeRequestSchema, { volumeId: VOL }), I],
    [
      "expand: traversal",
      "nodeExpandVolume",
      create(NodeExpandVolumeRequestSchema, { volumeId: VOL, volumePath: "/a/../b" }),
      NF,
    ],
    [
      "expand: negative size",
      "nodeExpandVolume",
      create(NodeExpandVolumeRequestSchema, {
        volumeId: VOL,
        volumePath: TARGET,
        capacityRange: { requiredBytes: -1n },
      }),
      I,
    ],
    [
      "expand: required above limit",
      "nodeExpandVolume",
      create(NodeExpandVolumeRequestSchema, {
        volumeId: VOL,
        volumePath: TARGET,
        capacityRange: { requiredBytes: 10n, limitBytes: 5n },
      }),
      I,
    ],
    [
      "expand: bad capability",
      "nodeExpandVolume",
      create(NodeExpandVolumeRequestSchema, {
        volumeId: VOL,
        volumePath: TARGET,
        volumeCapability: mountCap("zfs"),
      }),
      I,
    ],
  ];
  test.each(cases)("%s", async (_name, rpc, req, code) => {
    expect(await codeOf(call(rpc, req))).toBe(code);
    expect(log.calls).toEqual([]);
  });
});

async function stage(over: StageInit = {}) {
  return svc.nodeStageVolume?.(stageReq(over), ctx());
}

describe("NodeStageVolume", () => {
  test("several portals: each is a path; one that fails is tried once more, and the stage stands on the others", async () => {
    initiator.failAt.set("10.0.1.7", 1);
    initiator.failAt.set("10.0.2.7", 2);
    await stage({
      volumeContext: volumeContext({
        [VolumeContextKeys.portals]: "192.168.100.7:4420,10.0.1.7:4420,10.0.2.7:4420",
      }),
    });
    const tried = log.calls
      .filter((c) => c[1] === "connect")
      .map((c) => (c[2] as { address: string }).address);
    expect(tried).toEqual(["192.168.100.7", "10.0.1.7", "10.0.2.7", "10.0.1.7", "10.0.2.7"]);
    expect(state.records.has(VOL)).toBe(true);
  });

  test("connects as the node, waits for the device, formats a blank device and mounts it", async () => {
    initiator.lookupsBeforeDevice = 3;
    await stage({
      volumeContext: volumeContext({
        [VolumeContextKeys.ctrlLossTmo]: "-1",
        [VolumeContextKeys.reconnectDelay]: "5",
      }),
      volumeCapability: mountCap("xfs", Mode.SINGLE_NODE_WRITER, ["noatime"]),
    });
    expect(log.calls.find((c) => c[1] === "connect")?.[2]).toEqual({
      transport: "tcp",
      address: "192.168.100.7",
      port: 4420,
      nqn: NQN,
      hostNqn: HOST,
      ctrlLossTmo: -1,
      reconnectDelay: 5,
      fastIoFailTmo: undefined,
    });
    expect(log.calls.filter((c) => c[1] === "findNamespaceDevice").map((c) => c[3])).toEqual([
      NS_UUID,
      NS_UUID,
      NS_UUID,
      NS_UUID,
    ]);
    expect(log.calls.filter((c) => c[0] === "mounter" && ["probe", "mkfs", "mount"].includes(c[1]))).toEqual([
      ["mounter", "probe", DEV],
      ["mounter", "mkfs", DEV, "xfs"],
      ["mounter", "probe", DEV],
      ["mounter", "mount", DEV, STAGE, "xfs", ["noatime"]],
    ]);
    expect(state.records.get(VOL)).toMatchObject({
      nqn: NQN,
      device: DEV,
      stagingPath: STAGE,
      access: { kind: "mount", fsType: "xfs" },
    });
  });

  test("DH-HMAC-CHAP: this host's pair from the NodeStage secrets goes to the initiator; other hosts' do not", async () => {
    const mine = generateHostKeyPair("bidirectional", "sha256");
    const theirs = generateHostKeyPair("bidirectional", "sha256");
    const other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000b";
    const [k, o] = [hostEntryKeys(HOST), hostEntryKeys(other)];
    await stage({
      secrets: {
        [k.secret]: mine.secret,
        [k.ctrlSecret]: mine.ctrlSecret as string,
        [o.secret]: theirs.secret,
        [o.ctrlSecret]: theirs.ctrlSecret as string,
      },
    });
    const connect = log.calls.find((c) => c[1] === "connect")?.[2] as { dhchap?: unknown };
    expect(connect.dhchap).toEqual(mine);
  });

  test("no secrets: the connect carries no keys", async () => {
    await stage();
    const connect = log.calls.find((c) => c[1] === "connect")?.[2] as { dhchap?: unknown };
    expect(connect.dhchap).toBeUndefined();
  });

  test("mkfsOptions from the volume context are passed to mkfs; bad ones are INVALID_ARGUMENT before connecting", async () => {
    await stage({
      volumeContext: volumeContext({ [VolumeContextKeys.mkfsOptions]: "-b 4096 -E nodiscard" }),
    });
    expect(log.calls.find((c) => c[1] === "mkfs")).toEqual([
      "mounter",
      "mkfs",
      DEV,
      "ext4",
      ["-b", "4096", "-E", "nodiscard"],
    ]);
    const connects = () => log.calls.filter((c) => c[1] === "connect").length;
    const before = connects();
    expect(
      await codeOf(
        stage({
          volumeContext: volumeContext({ [VolumeContextKeys.mkfsOptions]: "-K" }),
        }),
      ),
    ).toBe(Code.InvalidArgument);
    expect(connects()).toBe(before);
  });

  test("an empty fs_type means the default filesystem", async () => {
    build({ defaultFsType: "xfs" });
    await stage({ volumeCapability: mountCap("") });
    expect(log.calls.find((c) => c[1] === "mkfs")).toEqual(["mounter", "mkfs", DEV, "xfs"]);
  });

  test("repeating a stage does nothing more", async () => {
    await stage();
    const before = log.methods("mounter").filter((m) => ["mkfs", "mount"].includes(m));
    await stage();
    expect(log.methods("mounter").filter((m) => ["mkfs", "mount"].includes(m))).toEqual(before);
    expect(mounter.table.filter((e) => e.mountPoint === STAGE)).toHaveLength(1);
  });

  test("a matching filesystem is kept, not reformatted", async () => {
    mounter.content.set(DEV, { kind: "filesystem", fsType: "ext4" });
    await stage();
    expect(log.methods("mounter")).not.toContain("mkfs");
    expect(log.methods("mounter")).toContain("mount");
  });

  test.each([
    ["another filesystem", { kind: "filesystem", fsType: "xfs" } as const],
    ["a partition table", { kind: "other", description: "gpt partition table" } as const],
  ])(
    "a device holding %s is FAILED_PRECONDITION and is neither formatted nor mounted",
    async (_n, content) => {
      mounter.content.set(DEV, content);
      expect(await codeOf(stage())).toBe(Code.FailedPrecondition);
      expect(log.methods("mounter")).not.toContain("mkfs");
      expect(log.methods("mounter")).not.toContain("mount");
    },
  );

  test("an unreadable device is never formatted", async () => {
    mounter.content.delete(DEV);
    expect(await codeOf(stage())).toBe(Code.Unavailable);
    expect(log.methods("mounter")).not.toContain("mkfs");
  });

  test("staged again with another capability: ALREADY_EXISTS", async () => {
    await stage();
    expect(await codeOf(stage({ volumeCapability: mountCap("xfs") }))).toBe(Code.AlreadyExists);
    expect(await codeOf(stage({ volumeCapability: blockCap() }))).toBe(Code.AlreadyExists);
    expect(await codeOf(stage({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_MULTI_WRITER) }))).toBe(
      Code.AlreadyExists,
    );
  });

  test("a staging path with someone else's mount: ALREADY_EXISTS before connecting", async () => {
    mounter.addDevice("/dev/sdz", { kind: "filesystem", fsType: "ext4" }, 1);
    await mounter.mount("/dev/sdz", STAGE, "ext4", []);
    expect(await codeOf(stage())).toBe(Code.AlreadyExists);
    expect(log.methods("mounter")).not.toContain("mkfs");
    expect(log.methods("initiator")).toEqual([]);
    expect(state.records.has(VOL)).toBe(false);
  });

  test("a failed first stage leaves neither a connection nor a record", async () => {
    initiator.refuse = true;
    expect(await codeOf(stage())).toBe(Code.Unavailable);
    expect(state.records.has(VOL)).toBe(false);
    initiator.refuse = false;
    mounter.content.set(DEV, { kind: "filesystem", fsType: "xfs" });
    expect(await codeOf(stage())).toBe(Code.FailedPrecondition);
    expect(initiator.connected.has(NQN)).toBe(false);
    expect(state.records.has(VOL)).toBe(false);
  });

  test("a failed retry of a recorded stage keeps the record for NodeUnstage", async () => {
    await stage({ volumeCapability: blockCap() });
    initiator.devices.delete(NQN);
    expect(await codeOf(stage({ volumeCapability: blockCap() }))).toBe(Code.Unavailable);
    expect(state.records.has(VOL)).toBe(true);
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
    expect(state.records.has(VOL)).toBe(false);
    expect(initiator.connected.has(NQN)).toBe(false);
  });

  test("a device that never appears is UNAVAILABLE after the wait", async () => {
    initiator.devices.delete(NQN);
    const t0 = clock.now();
    expect(await codeOf(stage())).toBe(Code.Unavailable);
    expect(clock.now() - t0).toBeGreaterThanOrEqual(200);
  });

  test("a missing staging directory is FAILED_PRECONDITION before connecting", async () => {
    fs.dirs.delete(STAGE);
    expect(await codeOf(stage())).toBe(Code.FailedPrecondition);
    expect(log.methods("initiator")).toEqual([]);
  });

  test("raw block stages only the connection and records the device", async () => {
    await stage({ volumeCapability: blockCap() });
    expect(log.methods("mounter")).toEqual(["mountsAt"]);
    expect(state.records.get(VOL)).toMatchObject({ device: DEV, access: { kind: "block" } });
  });

  test("a second RPC on a volume in flight is ABORTED", async () => {
    initiator.lookupsBeforeDevice = 5;
    const first = stage();
    expect(await codeOf(stage())).toBe(Code.Aborted);
    await first;
  });
});

describe("NodePublishVolume / NodeUnpublishVolume", () => {
  test("bind-mounts the staging path, idempotently; conflicting re-publish is ALREADY_EXISTS", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    expect(log.calls.filter((c) => c[1] === "bindMount")).toEqual([
      ["mounter", "bindMount", STAGE, TARGET, { readonly: false }],
    ]);
    expect(fs.dirs.has(TARGET)).toBe(true);
    await svc.nodePublishVolume?.(publishReq(), ctx());
    expect(log.calls.filter((c) => c[1] === "bindMount")).toHaveLength(1);
    expect(await codeOf(svc.nodePublishVolume?.(publishReq({ readonly: true }), ctx()))).toBe(
      Code.AlreadyExists,
    );
  });

  test("read-only is honoured", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq({ readonly: true }), ctx());
    expect(mounter.table.find((e) => e.mountPoint === TARGET)?.readonly).toBe(true);
  });

  test.each([
    ["SINGLE_NODE_READER_ONLY", Mode.SINGLE_NODE_READER_ONLY],
    ["MULTI_NODE_READER_ONLY", Mode.MULTI_NODE_READER_ONLY],
  ])("%s: the device is set read-only, mounted ro, and published read-only unasked", async (_n, mode) => {
    mounter.content.set(DEV, { kind: "filesystem", fsType: "ext4" });
    await stage({ volumeCapability: mountCap("ext4", mode, ["noatime"]) });
    expect(mounter.readOnlyDevices.has(DEV)).toBe(true);
    expect(log.calls.find((c) => c[1] === "mount")).toEqual([
      "mounter",
      "mount",
      DEV,
      STAGE,
      "ext4",
      ["noatime", "ro"],
    ]);
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: mountCap("ext4", mode), readonly: false }),
      ctx(),
    );
    expect(mounter.table.find((e) => e.mountPoint === TARGET)?.readonly).toBe(true);
    // The same request again is the same publication, not a conflict.
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: mountCap("ext4", mode), readonly: false }),
      ctx(),
    );
    await svc.nodeUnpublishVolume?.(
      create(NodeUnpublishVolumeRequestSchema, { volumeId: VOL, targetPath: TARGET }),
      ctx(),
    );
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
    expect(mounter.readOnlyDevices.has(DEV)).toBe(false);
  });

  test("a blank reader-only volume is FAILED_PRECONDITION and never formatted", async () => {
    expect(await codeOf(stage({ volumeCapability: mountCap("ext4", Mode.MULTI_NODE_READER_ONLY) }))).toBe(
      Code.FailedPrecondition,
    );
    expect(log.methods("mounter")).not.toContain("mkfs");
    expect(log.methods("mounter")).not.toContain("mount");
    // The failed stage is rolled back with the read-only flag it set, as an unstage clears it.
    expect(mounter.readOnlyDevices.has(DEV)).toBe(false);
    expect(log.methods("mounter").filter((m) => m === "setReadOnly" || m === "setReadWrite")).toEqual([
      "setReadOnly",
      "setReadWrite",
    ]);
  });

  test("a reader-only raw block volume is published through a read-only view", async () => {
    await stage({ volumeCapability: blockCap(Mode.MULTI_NODE_READER_ONLY) });
    expect(mounter.readOnlyDevices.has(DEV)).toBe(true);
    await svc.nodePublishVolume?.(
      publishReq({
        targetPath: BLOCK_TARGET,
        volumeCapability: blockCap(Mode.MULTI_NODE_READER_ONLY),
        readonly: false,
      }),
      ctx(),
    );
    expect(log.methods("mounter")).toContain("readOnlyView");
    expect(state.records.get(VOL)?.publications).toMatchObject([
      { targetPath: BLOCK_TARGET, readonly: true },
    ]);
  });

  test("volume_mount_group gives a read-write publication's tree to the group; a read-only one is left", async () => {
    await stage({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_WRITER, [], "4321") });
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_WRITER, [], "4321") }),
      ctx(),
    );
    expect(log.calls.filter((c) => c[1] === "applyMountGroup")).toEqual([
      ["mounter", "applyMountGroup", TARGET, 4321],
    ]);
    await svc.nodePublishVolume?.(
      publishReq({
        targetPath: TARGET2,
        readonly: true,
        volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_WRITER, [], "4321"),
      }),
      ctx(),
    );
    expect(log.calls.filter((c) => c[1] === "applyMountGroup")).toHaveLength(1);
  });

  test("a target holding another mount is ALREADY_EXISTS", async () => {
    await stage();
    mounter.addDevice("/dev/sdz", { kind: "filesystem", fsType: "ext4" }, 1);
    fs.dirs.add(TARGET);
    await mounter.mount("/dev/sdz", TARGET, "ext4", []);
    expect(await codeOf(svc.nodePublishVolume?.(publishReq(), ctx()))).toBe(Code.AlreadyExists);
  });

  test("publishing an unstaged volume, or as another kind, is FAILED_PRECONDITION", async () => {
    expect(await codeOf(svc.nodePublishVolume?.(publishReq(), ctx()))).toBe(Code.FailedPrecondition);
    await stage();
    expect(await codeOf(svc.nodePublishVolume?.(publishReq({ volumeCapability: blockCap() }), ctx()))).toBe(
      Code.FailedPrecondition,
    );
    expect(
      await codeOf(svc.nodePublishVolume?.(publishReq({ stagingTargetPath: "/elsewhere" }), ctx())),
    ).toBe(Code.FailedPrecondition);
  });

  test("SINGLE_NODE_SINGLE_WRITER allows one read-write publication; MULTI_WRITER several", async () => {
    await stage({ volumeCapability: mountCap("ext4", Mode.SINGLE_NODE_SINGLE_WRITER) });
    const cap = mountCap("ext4", Mode.SINGLE_NODE_SINGLE_WRITER);
    await svc.nodePublishVolume?.(publishReq({ volumeCapability: cap }), ctx());
    expect(
      await codeOf(
        svc.nodePublishVolume?.(publishReq({ volumeCapability: cap, targetPath: TARGET2 }), ctx()),
      ),
    ).toBe(Code.FailedPrecondition);
    expect(
      await codeOf(
        svc.nodePublishVolume?.(
          publishReq({ volumeCapability: cap, targetPath: TARGET2, readonly: true }),
          ctx(),
        ),
      ),
    ).toBe("ok");
  });

  test("unpublish unmounts and removes the target; again is fine", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
    expect(mounter.table.some((e) => e.mountPoint === TARGET)).toBe(false);
    expect(fs.dirs.has(TARGET)).toBe(false);
    expect(state.records.get(VOL)?.publications).toEqual([]);
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
  });

  test("the last writer's unpublish writes the filesystem out first; a writeback error does not keep the publication", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    await svc.nodePublishVolume?.(publishReq({ targetPath: TARGET2, readonly: true }), ctx());
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
    expect(log.calls.filter((c) => c[1] === "syncFilesystem" || c[1] === "unmount")).toEqual([
      ["mounter", "syncFilesystem", STAGE],
      ["mounter", "unmount", TARGET],
    ]);
    // A reader going needs no flush.
    log.calls.length = 0;
    await svc.nodeUnpublishVolume?.(unpublishReq(TARGET2), ctx());
    expect(log.methods("mounter")).not.toContain("syncFilesystem");
    // A path revoked by a takeover fails the writeback: the teardown goes on all the same.
    await svc.nodePublishVolume?.(publishReq(), ctx());
    mounter.syncError = "Input/output error";
    log.calls.length = 0;
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
    expect(log.methods("mounter")).toContain("syncFilesystem");
    expect(mounter.table.some((e) => e.mountPoint === TARGET)).toBe(false);
    expect(state.records.get(VOL)?.publications).toEqual([]);
  });

  test("unpublish of a path it never published removes nothing, and a mount there is refused", async () => {
    await stage();
    const foreign = "/var/lib/kubelet/pods/p9/volumes/kubernetes.io~csi/pvc-9/mount";
    for (const d of ["/var/lib/kubelet/pods/p9", "/var/lib/kubelet/pods/p9/volumes"]) fs.dirs.add(d);
    fs.dirs.add("/var/lib/kubelet/pods/p9/volumes/kubernetes.io~csi");
    fs.dirs.add("/var/lib/kubelet/pods/p9/volumes/kubernetes.io~csi/pvc-9");
    fs.dirs.add(foreign);
    await svc.nodeUnpublishVolume?.(unpublishReq(foreign), ctx());
    expect(fs.dirs.has(foreign)).toBe(true);
    mounter.addDevice("/dev/sdz", { kind: "filesystem", fsType: "ext4" }, 1);
    await mounter.mount("/dev/sdz", foreign, "ext4", []);
    expect(await codeOf(svc.nodeUnpublishVolume?.(unpublishReq(foreign), ctx()))).toBe(
      Code.FailedPrecondition,
    );
    expect(mounter.table.some((e) => e.mountPoint === foreign)).toBe(true);
    expect(fs.dirs.has(foreign)).toBe(true);
  });

  test("with a kubelet directory, a target outside it is refused at publish and never removed", async () => {
    build({ kubeletDir: "/var/lib/kubelet" });
    await stage();
    fs.dirs.add("/etc");
    fs.dirs.add("/etc/important");
    expect(await codeOf(svc.nodePublishVolume?.(publishReq({ targetPath: "/etc/important" }), ctx()))).toBe(
      Code.InvalidArgument,
    );
    // Even a record that names it (a state file from elsewhere) does not make it removable.
    const rec = state.records.get(VOL);
    if (rec === undefined) throw new Error("staged record missing");
    state.records.set(VOL, { ...rec, publications: [{ targetPath: "/etc/important", readonly: false }] });
    expect(await codeOf(svc.nodeUnpublishVolume?.(unpublishReq("/etc/important"), ctx()))).toBe(
      Code.InvalidArgument,
    );
    expect(fs.dirs.has("/etc/important")).toBe(true);
    // A sibling whose name only starts like the kubelet directory is outside it too.
    expect(await codeOf(svc.nodeUnpublishVolume?.(unpublishReq("/var/lib/kubelet-other/x"), ctx()))).toBe(
      Code.InvalidArgument,
    );
    // Inside it, publish and unpublish work as before.
    await svc.nodePublishVolume?.(publishReq(), ctx());
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
    expect(fs.dirs.has(TARGET)).toBe(false);
  });

  test("raw block publish binds the device the NQN resolves to now, not the one recorded at stage", async () => {
    await stage({ volumeCapability: blockCap() });
    // After a reconnect the kernel numbered the namespace anew; DEV now names another volume.
    const renumbered = "/dev/nvme4n1";
    fs.files.set(renumbered, "");
    mounter.addDevice(renumbered, { kind: "blank" }, 1 << 30);
    initiator.devices.set(NQN, renumbered);
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: blockCap(), targetPath: BLOCK_TARGET }),
      ctx(),
    );
    expect(log.calls.filter((c) => c[1] === "bindMount")).toEqual([
      ["mounter", "bindMount", renumbered, BLOCK_TARGET, { readonly: false }],
    ]);
    expect(state.records.get(VOL)?.device).toBe(renumbered);
  });

  test("raw block publish with the namespace gone is FAILED_PRECONDITION and binds nothing", async () => {
    await stage({ volumeCapability: blockCap() });
    initiator.devices.delete(NQN);
    expect(
      await codeOf(
        svc.nodePublishVolume?.(
          publishReq({ volumeCapability: blockCap(), targetPath: BLOCK_TARGET }),
          ctx(),
        ),
      ),
    ).toBe(Code.FailedPrecondition);
    expect(log.calls.filter((c) => c[1] === "bindMount")).toEqual([]);
  });

  test("raw block: a file target bound to the device; read-only through a read-only view", async () => {
    await stage({ volumeCapability: blockCap() });
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: blockCap(), targetPath: BLOCK_TARGET }),
      ctx(),
    );
    expect(fs.files.has(BLOCK_TARGET)).toBe(true);
    expect(log.calls.find((c) => c[1] === "bindMount")).toEqual([
      "mounter",
      "bindMount",
      DEV,
      BLOCK_TARGET,
      { readonly: false },
    ]);
    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: blockCap(), targetPath: BLOCK_TARGET }),
      ctx(),
    );
    expect(log.calls.filter((c) => c[1] === "bindMount")).toHaveLength(1);
    await svc.nodeUnpublishVolume?.(unpublishReq(BLOCK_TARGET), ctx());
    expect(fs.files.has(BLOCK_TARGET)).toBe(false);

    await svc.nodePublishVolume?.(
      publishReq({ volumeCapability: blockCap(), targetPath: BLOCK_TARGET, readonly: true }),
      ctx(),
    );
    const view = state.records.get(VOL)?.publications[0]?.view;
    expect(view).toStartWith("/dev/loop-ro");
    expect(log.calls.filter((c) => c[1] === "bindMount").at(-1)).toEqual([
      "mounter",
      "bindMount",
      view,
      BLOCK_TARGET,
      { readonly: true },
    ]);
    await svc.nodeUnpublishVolume?.(unpublishReq(BLOCK_TARGET), ctx());
    expect(log.calls.find((c) => c[1] === "releaseReadOnlyView")).toEqual([
      "mounter",
      "releaseReadOnlyView",
      view,
    ]);
  });
});

describe("NodeUnstageVolume", () => {
  test("unmounts, disconnects by NQN, forgets the volume; again is fine", async () => {
    await stage();
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
    expect(mounter.table).toEqual([]);
    expect(log.calls.filter((c) => c[1] === "disconnect")).toEqual([["initiator", "disconnect", NQN]]);
    expect(state.records.size).toBe(0);
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
    expect(log.calls.filter((c) => c[1] === "disconnect")).toHaveLength(1);
  });

  test("a failing disconnect fails the call and keeps the record for the retry", async () => {
    await stage();
    initiator.failDisconnect = true;
    expect(await codeOf(svc.nodeUnstageVolume?.(unstageReq(), ctx()))).toBe(Code.Internal);
    expect(state.records.has(VOL)).toBe(true);
    initiator.failDisconnect = false;
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
    expect(initiator.connected.size).toBe(0);
  });

  test("refuses while still published", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    expect(await codeOf(svc.nodeUnstageVolume?.(unstageReq(), ctx()))).toBe(Code.FailedPrecondition);
    expect(log.methods("initiator")).not.toContain("disconnect");
  });
});

describe("the staging sweep, through the node service", () => {
  const unclaimed = async () => ({ attached: new Set<string>(), inUse: new Set<string>() });
  const sweepWith = (claims = unclaimed) =>
    new StagingSweep({
      state,
      claims,
      unstage: (id, path) => plugin.unstage(id, path),
      logger: silentLogger,
    });

  test("a staged volume kubelet forgot is unmounted, disconnected and forgotten on the second sweep", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    await svc.nodeUnpublishVolume?.(unpublishReq(), ctx());
    const sweep = sweepWith();
    expect((await sweep.sweep()).suspected).toEqual([VOL]);
    expect(mounter.table.map((e) => e.mountPoint)).toEqual([STAGE]);
    expect(log.methods("initiator")).not.toContain("disconnect");
    expect((await sweep.sweep()).unstaged).toEqual([VOL]);
    expect(mounter.table).toEqual([]);
    expect(log.calls.filter((c) => c[1] === "disconnect")).toEqual([["initiator", "disconnect", NQN]]);
    expect(state.records.size).toBe(0);
    // kubelet's own NodeUnstage, should it come after all, finds nothing left and succeeds.
    await svc.nodeUnstageVolume?.(unstageReq(), ctx());
  });

  test("a volume still published is refused and left mounted and connected", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    const sweep = sweepWith();
    await sweep.sweep();
    const r = await sweep.sweep();
    expect(r.refused.map((x) => x.volumeId)).toEqual([VOL]);
    expect(r.refused[0]?.reason).toContain(`still published at ${TARGET}`);
    expect(mounter.table.map((e) => e.mountPoint).sort()).toEqual([STAGE, TARGET].sort());
    expect(log.methods("initiator")).not.toContain("disconnect");
    expect(state.records.has(VOL)).toBe(true);
  });

  test("a volume the Node still has attached is left staged", async () => {
    await stage();
    const sweep = sweepWith(async () => ({ attached: new Set([VOL]), inUse: new Set<string>() }));
    for (let i = 0; i < 3; i++) expect((await sweep.sweep()).unstaged).toEqual([]);
    expect(mounter.table.map((e) => e.mountPoint)).toEqual([STAGE]);
    expect(state.records.has(VOL)).toBe(true);
  });
});

describe("stats, health, expansion, info", () => {
  test("stats: bytes and inodes of a mount; bytes of a block device; NOT_FOUND elsewhere", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    const r = await svc.nodeGetVolumeStats?.(
      create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL, volumePath: TARGET }),
      ctx(),
    );
    expect(r?.usage).toMatchObject([
      { unit: VolumeUsage_Unit.BYTES, total: 1000n, available: 600n, used: 400n },
      { unit: VolumeUsage_Unit.INODES, total: 64n, available: 60n, used: 4n },
    ]);
    expect(conditionOf(toBinary(NodeGetVolumeStatsResponseSchema, r as NodeGetVolumeStatsResponse))).toEqual({
      abnormal: false,
      message: "",
    });
    const other = create(NodeGetVolumeStatsRequestSchema, {
      volumeId: VOL,
      volumePath: "/var/lib/kubelet/pods/p9/mount",
    });
    expect(await codeOf(svc.nodeGetVolumeStats?.(other, ctx()))).toBe(Code.NotFound);
    const unknown = create(NodeGetVolumeStatsRequestSchema, { volumeId: "nope", volumePath: TARGET });
    expect(await codeOf(svc.nodeGetVolumeStats?.(unknown, ctx()))).toBe(Code.NotFound);
  });

  test("stats of a block volume: bytes only", async () => {
    await stage({ volumeCapability: blockCap() });
    const r = await svc.nodeGetVolumeStats?.(
      create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL, volumePath: STAGE }),
      ctx(),
    );
    expect(r?.usage).toMatchObject([{ unit: VolumeUsage_Unit.BYTES, total: BigInt(1 << 30) }]);
  });

  test("stats carry kubelet's volume condition (CSI v1.9 field 2): abnormal with the reason while the controller is not live or the mount is broken", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    const stats = async () => {
      const r = await svc.nodeGetVolumeStats?.(
        create(NodeGetVolumeStatsRequestSchema, { volumeId: VOL, volumePath: TARGET }),
        ctx(),
      );
      const bytes = toBinary(NodeGetVolumeStatsResponseSchema, r as NodeGetVolumeStatsResponse);
      return { usage: r?.usage?.length, condition: conditionOf(bytes) };
    };
    expect(await stats()).toEqual({ usage: 2, condition: { abnormal: false, message: "" } });
    const sub = initiator.connected.get(NQN);
    if (!sub) throw new Error("not connected");
    initiator.connected.set(NQN, {
      ...sub,
      paths: [{ ...(sub.paths[0] as (typeof sub.paths)[0]), state: "connecting" }],
    });
    const down = await stats();
    expect(down.usage).toBe(2);
    expect(down.condition?.abnormal).toBe(true);
    expect(down.condition?.message).toStartWith("ControllerNotLive: no live controller");
    // statfs failing (EIO after the controller is lost) still answers, with no usage.
    mounter.statfsError = "Input/output error";
    const broken = await stats();
    expect(broken.usage).toBe(0);
    expect(broken.condition?.message).toContain("StagingMountBroken");
    // Healthy again: the condition clears.
    mounter.statfsError = undefined;
    initiator.connected.set(NQN, sub);
    expect(await stats()).toEqual({ usage: 2, condition: { abnormal: false, message: "" } });
    // A degraded path alone is not abnormal for kubelet (I/O still flows), but is named.
    initiator.connected.set(NQN, {
      ...sub,
      paths: [
        sub.paths[0] as (typeof sub.paths)[0],
        { ...(sub.paths[0] as (typeof sub.paths)[0]), name: "nvme9c9n1", state: "connecting" },
      ],
    });
    const degraded = await stats();
    expect(degraded.condition?.abnormal).toBe(false);
    expect(degraded.condition?.message).toStartWith("PathDown:");
  });

  const health = async (volumePublishPath = "") =>
    (
      await svc.nodeGetVolumeHealth?.(
        create(NodeGetVolumeHealthRequestSchema, { volumeId: VOL, volumePublishPath }),
        ctx(),
      )
    )?.volumeHealth?.healthStatuses?.map((h) => [VolumeHealthErrorType[h.status ?? 0], h.reason]);

  test("health: empty when all is well; abnormal when the controller is gone or not live, or the mount is broken", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    expect(await health(TARGET)).toEqual([]);
    const sub = initiator.connected.get(NQN);
    if (!sub) throw new Error("not connected");
    initiator.connected.set(NQN, {
      ...sub,
      paths: [{ ...(sub.paths[0] as (typeof sub.paths)[0]), state: "connecting" }],
    });
    expect(await health()).toEqual([["INACCESSIBLE", "ControllerNotLive"]]);
    initiator.connected.delete(NQN);
    expect(await health()).toEqual([["INACCESSIBLE", "ControllerGone"]]);
    initiator.connected.set(NQN, sub);
    mounter.statfsError = "Input/output error";
    expect(await health()).toEqual([["INACCESSIBLE", "StagingMountBroken"]]);
    mounter.statfsError = undefined;
    await mounter.unmount(TARGET);
    expect(await health(TARGET)).toEqual([["INACCESSIBLE", "PublishMountMissing"]]);
    expect(
      await codeOf(
        svc.nodeGetVolumeHealth?.(create(NodeGetVolumeHealthRequestSchema, { volumeId: "nope" }), ctx()),
      ),
    ).toBe(Code.NotFound);
  });

  test("expand: rescan, wait for the size, grow the filesystem at the staging path", async () => {
    await stage();
    await svc.nodePublishVolume?.(publishReq(), ctx());
    mounter.sizes.set(DEV, 2 * 2 ** 30);
    const r = await svc.nodeExpandVolume?.(
      create(NodeExpandVolumeRequestSchema, {
        volumeId: VOL,
        volumePath: TARGET,
        capacityRange: { requiredBytes: BigInt(2 * 2 ** 30) },
      }),
      ctx(),
    );
    expect(r?.capacityBytes).toBe(BigInt(2 * 2 ** 30));
    expect(log.calls.find((c) => c[1] === "rescan")).toEqual(["initiator", "rescan", NQN]);
    expect(log.calls.find((c) => c[1] === "growFs")).toEqual(["mounter", "growFs", "ext4", DEV, STAGE]);
  });

  test("expand: a device that does not grow is UNAVAILABLE; a block volume needs no growth", async () => {
    await stage({ volumeCapability: blockCap() });
    const tooBig = create(NodeExpandVolumeRequestSchema, {
      volumeId: VOL,
      volumePath: STAGE,
      capacityRange: { requiredBytes: BigInt(4 * 2 ** 30) },
    });
    expect(await codeOf(svc.nodeExpandVolume?.(tooBig, ctx()))).toBe(Code.Unavailable);
    const ok = await svc.nodeExpandVolume?.(
      create(NodeExpandVolumeRequestSchema, { volumeId: VOL, volumePath: STAGE }),
      ctx(),
    );
    expect(ok?.capacityBytes).toBe(BigInt(1 << 30));
    expect(log.methods("mounter")).not.toContain("growFs");
  });

  test("info and capabilities", async () => {
    const info = await svc.nodeGetInfo?.(
      create((await import("../gen/csi/v1/csi_pb.ts")).NodeGetInfoRequestSchema, {}),
      ctx(),
    );
    expect(info).toEqual({
      nodeId: "worker-a",
      maxVolumesPerNode: 64n,
      accessibleTopology: { segments: { "topology.storage.distort.io/node": "worker-a" } },
    });
    const caps = await svc.nodeGetCapabilities?.(
      create((await import("../gen/csi/v1/csi_pb.ts")).NodeGetCapabilitiesRequestSchema, {}),
      ctx(),
    );
    expect(
      caps?.capabilities?.map((c) =>
        c.type?.case === "rpc" ? (RpcType[c.type.value.type ?? 0] ?? c.type.value.type) : "?",
      ),
    ).toEqual([
      "STAGE_UNSTAGE_VOLUME",
      "GET_VOLUME_STATS",
      "EXPAND_VOLUME",
      "SINGLE_NODE_MULTI_WRITER",
      "GET_VOLUME_HEALTH",
      "VOLUME_MOUNT_GROUP",
      // CSI v1.9's VOLUME_CONDITION, which kubelet v1.36 asks for.
      VOLUME_CONDITION_RPC,
    ]);
  });
});
