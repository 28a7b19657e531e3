// Controller + Identity against a real kube-apiserver over the real UNIX socket (grpc-js client).
// The manager's and agent's parts are played by testdata/stand-in.ts, writing their statuses through
// the API server as the real binaries would; csi-sanity runs the real ones.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import * as k8s from "@kubernetes/client-node";
import { API_VERSION, kinds, type NVMeDevice, type RDMAStorageNode } from "../api/index.ts";
import {
  ControllerServiceCapability_RPC_Type as Cap,
  Controller,
  type CreateVolumeRequest,
  type CreateVolumeRequestSchema,
  Identity,
  VolumeCapability_AccessMode_Mode as Mode,
} from "../gen/csi/v1/csi_pb.ts";
import { eventually, type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { realClock } from "../lib/clock.ts";
import { formatNodeId } from "../lib/csi-node-id.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { register, serveGrpc } from "../lib/grpc/server.ts";
import { EventRecorder } from "../lib/kube/events.ts";
import { kubeNodeDirectory, LEGACY_HOST_NQN_ANNOTATION } from "../lib/kube/node-directory.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { DRIVER_NAME, PublishContextKeys, VolumeContextKeys } from "../lib/volume-context.ts";
import { FENCED_ANNOTATION, PREVIOUS_NODE_ANNOTATION } from "./controller/fencing.ts";
import { Annotations } from "./controller/fingerprint.ts";
import { StandIn } from "./controller/testdata/stand-in.ts";
import { attachmentNameFor, parseVolumeId, readerAttachmentNameFor } from "./controller/volume-id.ts";
import { CONTROLLER_CAPABILITIES, CsiController } from "./controller.ts";
import { createIdentityService } from "./identity.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const GRPC = {
  OK: 0,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  UNAVAILABLE: 14,
};

let tc: TestCluster;
let root: string;
const cleanups: (() => unknown)[] = [];

/** One namespace, one controller on its own socket, one stand-in; per describe block. */
interface Env {
  ns: string;
  controller: CsiController;
  client: GrpcJsClient;
  standIn: StandIn;
}

let envN = 0;
async function env(): Promise<Env> {
  const ns = await tc.namespace("csi");
  const controller = new CsiController({
    conn: tc.conn,
    namespace: ns,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: 5_000,
    defaultVolumeBytes: GiB,
    events: new EventRecorder(tc.conn, {
      controller: "storage.distort.io/csi",
      instance: "test",
      logger: silentLogger,
    }),
  });
  const server = await serveGrpc({
    socketPath: join(root, `c${envN++}.sock`),
    services: [
      register(
        Identity,
        createIdentityService({
          vendorVersion: "test",
          controllerService: true,
          readiness: [() => controller.notReadyReason()],
          logger: silentLogger,
        }),
      ),
      register(Controller, controller.service()),
    ],
    logger: silentLogger,
  });
  const client = new GrpcJsClient(server.address);
  const standIn = new StandIn(tc.conn, ns);
  await Promise.all([controller.start(), standIn.start()]);
  cleanups.push(
    () => client.close(),
    () => server.close(),
    () => controller.stop(),
    () => standIn.stop(),
  );
  return { ns, controller, client, standIn };
}

beforeAll(async () => {
  tc = await testCluster();
  root = await mkdtemp(join(tmpdir(), "distort-csi-ctl-"));
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await rm(root, { recursive: true, force: true });
  await tc?.stop();
});

const mountCap = (mode = Mode.SINGLE_NODE_WRITER, fsType = "ext4") => ({
  accessType: { case: "mount" as const, value: { fsType } },
  accessMode: { mode },
});
const blockCap = (mode = Mode.SINGLE_NODE_WRITER) => ({
  accessType: { case: "block" as const, value: {} },
  accessMode: { mode },
});
type CreateInit = Exclude<MessageInitShape<typeof CreateVolumeRequestSchema>, CreateVolumeRequest>;
const createReq = (name: string, over: CreateInit = {}): CreateInit => ({
  name,
  volumeCapabilities: [mountCap()],
  capacityRange: { requiredBytes: BigInt(GiB) },
  ...over,
});

async function code(p: Promise<unknown>): Promise<number> {
  try {
    await p;
    return GRPC.OK;
  } catch (err) {
    if (err instanceof GrpcCallError) return err.code;
    throw err;
  }
}

async function failure(p: Promise<unknown>): Promise<GrpcCallError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof GrpcCallError)) throw new Error(`expected a gRPC failure, got ${String(err)}`);
  return err;
}

async function createNode(name: string, annotations?: Record<string, string>): Promise<void> {
  await tc.conn
    .api(k8s.CoreV1Api)
    .createNode({ body: { metadata: { name, ...(annotations ? { annotations } : {}) } } });
}

const suffix = () => Math.random().toString(36).slice(2, 8);

describe("identity and input validation", () => {
  let e: Env;
  beforeAll(async () => {
    e = await env();
  });

  test("Probe is ready once the caches synced and the API server answers; capabilities are exactly the implemented set", async () => {
    expect((await e.client.unary(Identity.method.probe, {})).ready).toBe(true);
    const caps = await e.client.unary(Controller.method.controllerGetCapabilities, {});
    const types = caps.capabilities.map((c) => (c.type.case === "rpc" ? c.type.value.type : -1));
    expect(types).toEqual([...CONTROLLER_CAPABILITIES]);
    expect(types).toContain(Cap.CREATE_DELETE_SNAPSHOT);
    expect(types).toContain(Cap.LIST_SNAPSHOTS);
    expect(types).toContain(Cap.GET_SNAPSHOT);
    expect(types).toContain(Cap.CLONE_VOLUME);
    expect(types).toContain(Cap.MODIFY_VOLUME);
  });

  test("every bad request gets its code and changes nothing in the API server", async () => {
    const c = e.client;
    const M = Controller.method;
    const fake = `${e.ns}/pvc-nothing/0f8fad5b-d9cb-469f-a165-70867728950e`;
    const writes: string[] = [];
    const realFetch = globalThis.fetch;
    globalThis.fetch = ((input: string | URL | Request, init?: RequestInit) => {
      const method = init?.method ?? (input instanceof Request ? input.method : "GET");
      if (method !== "GET") writes.push(`${method} ${String(input instanceof Request ? input.url : input)}`);
      return realFetch(input, init);
    }) as typeof fetch;
    const rows: [string, () => Promise<unknown>, number][] = [
      ["CreateVolume without name", () => c.unary(M.createVolume, createReq("")), GRPC.INVALID_ARGUMENT],
      [
        "CreateVolume with a 129-character name",
        () => c.unary(M.createVolume, createReq("n".repeat(129))),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume without capabilities",
        () => c.unary(M.createVolume, createReq("v", { volumeCapabilities: [] })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume multi-node writer",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)] }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume multi-node single writer",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { volumeCapabilities: [blockCap(Mode.MULTI_NODE_SINGLE_WRITER)] }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume btrfs",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { volumeCapabilities: [mountCap(Mode.SINGLE_NODE_WRITER, "btrfs")] }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume capability without access type",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { volumeCapabilities: [{ accessMode: { mode: Mode.SINGLE_NODE_WRITER } }] }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume capacity no 4 MiB multiple fits",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", {
              capacityRange: { requiredBytes: BigInt(5 * MiB), limitBytes: BigInt(7 * MiB) },
            }),
          ),
        GRPC.OUT_OF_RANGE,
      ],
      [
        "CreateVolume limit below 4 MiB",
        () => c.unary(M.createVolume, createReq("v", { capacityRange: { limitBytes: 1024n } })),
        GRPC.OUT_OF_RANGE,
      ],
      [
        "CreateVolume negative capacity",
        () => c.unary(M.createVolume, createReq("v", { capacityRange: { requiredBytes: -1n } })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume required above limit",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { capacityRange: { requiredBytes: BigInt(2 * GiB), limitBytes: BigInt(GiB) } }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume unknown parameter",
        () => c.unary(M.createVolume, createReq("v", { parameters: { copies: "3" } })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume malformed parameter",
        () => c.unary(M.createVolume, createReq("v", { parameters: { reconnectDelay: "0" } })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume bad backend",
        () => c.unary(M.createVolume, createReq("v", { parameters: { backend: "ceph" } })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume with a shared DH-CHAP Secret",
        () => c.unary(M.createVolume, createReq("v", { parameters: { dhchapSecretName: "k" } })),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume clone on kernel",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", {
              parameters: { backend: "kernel" },
              volumeContentSource: { type: { case: "volume", value: { volumeId: fake } } },
            }),
          ),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateVolume clone of a missing volume",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", { volumeContentSource: { type: { case: "volume", value: { volumeId: fake } } } }),
          ),
        GRPC.NOT_FOUND,
      ],
      [
        "CreateVolume from a missing snapshot",
        () =>
          c.unary(
            M.createVolume,
            createReq("v", {
              volumeContentSource: { type: { case: "snapshot", value: { snapshotId: "snap-1" } } },
            }),
          ),
        GRPC.NOT_FOUND,
      ],
      [
        "CreateVolume with mutable parameters",
        () => c.unary(M.createVolume, createReq("v", { mutableParameters: { iops: "9" } })),
        GRPC.INVALID_ARGUMENT,
      ],
      ["DeleteVolume without id", () => c.unary(M.deleteVolume, {}), GRPC.INVALID_ARGUMENT],
      [
        "DeleteVolume malformed id: already gone",
        () => c.unary(M.deleteVolume, { volumeId: "not-a-volume" }),
        GRPC.OK,
      ],
      ["DeleteVolume unknown id: already gone", () => c.unary(M.deleteVolume, { volumeId: fake }), GRPC.OK],
      [
        "DeleteVolume other namespace: not ours",
        () => c.unary(M.deleteVolume, { volumeId: fake.replace(e.ns, "kube-system") }),
        GRPC.OK,
      ],
      [
        "Publish without volume id",
        () => c.unary(M.controllerPublishVolume, { nodeId: "n", volumeCapability: mountCap() }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Publish without node id",
        () => c.unary(M.controllerPublishVolume, { volumeId: fake, volumeCapability: mountCap() }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Publish without capability",
        () => c.unary(M.controllerPublishVolume, { volumeId: fake, nodeId: "n" }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Publish multi-node writer on a filesystem",
        () =>
          c.unary(M.controllerPublishVolume, {
            volumeId: fake,
            nodeId: "n",
            volumeCapability: mountCap(Mode.MULTI_NODE_MULTI_WRITER),
          }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Publish unknown volume",
        () =>
          c.unary(M.controllerPublishVolume, { volumeId: fake, nodeId: "n", volumeCapability: mountCap() }),
        GRPC.NOT_FOUND,
      ],
      [
        "Publish malformed id",
        () =>
          c.unary(M.controllerPublishVolume, { volumeId: "x", nodeId: "n", volumeCapability: mountCap() }),
        GRPC.NOT_FOUND,
      ],
      [
        "Unpublish without id",
        () => c.unary(M.controllerUnpublishVolume, { nodeId: "n" }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Unpublish unknown volume",
        () => c.unary(M.controllerUnpublishVolume, { volumeId: fake, nodeId: "n" }),
        GRPC.OK,
      ],
      [
        "Unpublish malformed id",
        () => c.unary(M.controllerUnpublishVolume, { volumeId: "x", nodeId: "n" }),
        GRPC.OK,
      ],
      [
        "Validate without id",
        () => c.unary(M.validateVolumeCapabilities, { volumeCapabilities: [mountCap()] }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Validate without capabilities",
        () => c.unary(M.validateVolumeCapabilities, { volumeId: fake }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Validate malformed capability",
        () =>
          c.unary(M.validateVolumeCapabilities, {
            volumeId: fake,
            volumeCapabilities: [{ accessType: { case: "block", value: {} } }],
          }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Validate unknown volume",
        () => c.unary(M.validateVolumeCapabilities, { volumeId: fake, volumeCapabilities: [mountCap()] }),
        GRPC.NOT_FOUND,
      ],
      [
        "ListVolumes bad token",
        () => c.unary(M.listVolumes, { startingToken: "invalid-token" }),
        GRPC.ABORTED,
      ],
      [
        "ListVolumes negative max_entries",
        () => c.unary(M.listVolumes, { maxEntries: -1 }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "GetCapacity unknown parameter",
        () => c.unary(M.getCapacity, { parameters: { pool: "a" } }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "GetCapacity malformed capability",
        () =>
          c.unary(M.getCapacity, { volumeCapabilities: [{ accessMode: { mode: Mode.SINGLE_NODE_WRITER } }] }),
        GRPC.INVALID_ARGUMENT,
      ],
      ["ControllerGetVolume without id", () => c.unary(M.controllerGetVolume, {}), GRPC.INVALID_ARGUMENT],
      [
        "ControllerGetVolume unknown",
        () => c.unary(M.controllerGetVolume, { volumeId: fake }),
        GRPC.NOT_FOUND,
      ],
      ["GetVolumeHealth without id", () => c.unary(M.controllerGetVolumeHealth, {}), GRPC.INVALID_ARGUMENT],
      [
        "GetVolumeHealth unknown",
        () => c.unary(M.controllerGetVolumeHealth, { volumeId: "x" }),
        GRPC.NOT_FOUND,
      ],
      [
        "ListVolumeHealth bad token",
        () => c.unary(M.controllerListVolumeHealth, { startingToken: "nope" }),
        GRPC.ABORTED,
      ],
      [
        "Expand without id",
        () => c.unary(M.controllerExpandVolume, { capacityRange: { requiredBytes: BigInt(GiB) } }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Expand without range",
        () => c.unary(M.controllerExpandVolume, { volumeId: fake }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "Expand unknown volume",
        () =>
          c.unary(M.controllerExpandVolume, {
            volumeId: fake,
            capacityRange: { requiredBytes: BigInt(GiB) },
          }),
        GRPC.NOT_FOUND,
      ],
      [
        "Expand out of range",
        () =>
          c.unary(M.controllerExpandVolume, {
            volumeId: fake,
            capacityRange: { requiredBytes: BigInt(5 * MiB), limitBytes: BigInt(7 * MiB) },
          }),
        GRPC.OUT_OF_RANGE,
      ],
      [
        "CreateSnapshot without name",
        () => c.unary(M.createSnapshot, { sourceVolumeId: fake }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateSnapshot without source",
        () => c.unary(M.createSnapshot, { name: "s" }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateSnapshot name too long",
        () => c.unary(M.createSnapshot, { name: "s".repeat(129), sourceVolumeId: fake }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateSnapshot with parameters",
        () => c.unary(M.createSnapshot, { name: "s", sourceVolumeId: fake, parameters: { x: "1" } }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "CreateSnapshot of a missing volume",
        () => c.unary(M.createSnapshot, { name: "s", sourceVolumeId: fake }),
        GRPC.NOT_FOUND,
      ],
      ["DeleteSnapshot without id", () => c.unary(M.deleteSnapshot, {}), GRPC.INVALID_ARGUMENT],
      [
        "DeleteSnapshot malformed id: already gone",
        () => c.unary(M.deleteSnapshot, { snapshotId: "not-a-snapshot" }),
        GRPC.OK,
      ],
      [
        "DeleteSnapshot unknown id: already gone",
        () => c.unary(M.deleteSnapshot, { snapshotId: fake }),
        GRPC.OK,
      ],
      [
        "ListSnapshots negative max_entries",
        () => c.unary(M.listSnapshots, { maxEntries: -1 }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "ListSnapshots foreign token",
        () => c.unary(M.listSnapshots, { startingToken: "bogus" }),
        GRPC.ABORTED,
      ],
      ["ListSnapshots unknown id: empty", () => c.unary(M.listSnapshots, { snapshotId: fake }), GRPC.OK],
      ["GetSnapshot without id", () => c.unary(M.getSnapshot, {}), GRPC.INVALID_ARGUMENT],
      ["GetSnapshot unknown id", () => c.unary(M.getSnapshot, { snapshotId: fake }), GRPC.NOT_FOUND],
      [
        "GetSnapshot malformed id",
        () => c.unary(M.getSnapshot, { snapshotId: "not-a-snapshot" }),
        GRPC.NOT_FOUND,
      ],
      [
        "ControllerModifyVolume without mutable parameters",
        () => c.unary(M.controllerModifyVolume, { volumeId: fake }),
        GRPC.INVALID_ARGUMENT,
      ],
      [
        "ControllerModifyVolume unknown volume",
        () => c.unary(M.controllerModifyVolume, { volumeId: fake, mutableParameters: { "qos.rMBps": "5" } }),
        GRPC.NOT_FOUND,
      ],
    ];
    const got: Record<string, number> = {};
    let control: string[] = [];
    try {
      for (const [name, call] of rows) got[name] = await code(call());
      const parts = await new ResourceClient(tc.conn, kinds.NVMePartition).list({ namespace: e.ns });
      const atts = await new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment).list({ namespace: e.ns });
      expect(parts.items.length + atts.items.length).toBe(0);
      expect(writes).toEqual([]);
      // Control: a valid request does write, so the counter above could have seen one.
      // (It then waits for an export nobody makes; its deadline ends it after the test.)
      void code(c.unary(M.createVolume, createReq("control"), { timeoutMs: 30_000 }));
      await eventually(
        () => writes.some((w) => w.startsWith("POST ") && w.includes("/nvmepartitions")),
        60_000,
        "the control request's write",
      );
      control = [...writes];
    } finally {
      globalThis.fetch = realFetch;
    }
    expect(got).toEqual(Object.fromEntries(rows.map(([name, , want]) => [name, want])));
    expect(control.some((w) => w.startsWith("POST ") && w.includes("/nvmepartitions"))).toBe(true);
  });

  test("the messages say what is wrong", async () => {
    const M = Controller.method;
    expect(
      (await failure(e.client.unary(M.createVolume, createReq("v", { parameters: { copies: "3" } }))))
        .details,
    ).toContain('unknown parameter "copies"');
    expect(
      (
        await failure(
          e.client.unary(
            M.createVolume,
            createReq("v", { volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)] }),
          ),
        )
      ).details,
    ).toContain("raw block volumes only");
    expect(
      (
        await failure(
          e.client.unary(
            M.createVolume,
            createReq("v", {
              parameters: { backend: "kernel" },
              volumeContentSource: { type: { case: "snapshot", value: { snapshotId: "s" } } },
            }),
          ),
        )
      ).details,
    ).toContain("needs backend spdk");
  });
});

describe("CreateVolume and DeleteVolume", () => {
  let e: Env;
  beforeAll(async () => {
    e = await env();
  });

  test("CreateVolume waits on a watch: no API requests while it waits, answer within ms of the status write", async () => {
    const seen: string[] = [];
    const realFetch = globalThis.fetch;
    let counting = false;
    globalThis.fetch = ((input: string | URL | Request, init?: RequestInit) => {
      if (counting)
        seen.push(`${init?.method ?? "GET"} ${String(input instanceof Request ? input.url : input)}`);
      return realFetch(input, init);
    }) as typeof fetch;
    try {
      let done = 0;
      const pending = e.client
        .unary(
          Controller.method.createVolume,
          createReq("pvc-watch", { parameters: { transport: "tcp", ctrlLossTmo: "30" } }),
          { timeoutMs: 15_000 },
        )
        .then((r) => {
          done = performance.now();
          return r;
        });
      await eventually(
        async () =>
          e.controller.inFlight.keys().length === 1 && (await e.standIn.parts.get("pvc-watch", e.ns)),
      );
      await Bun.sleep(200); // let the handler reach its wait
      counting = true;
      await Bun.sleep(1500);
      counting = false;
      expect(seen).toEqual([]);
      counting = true; // control: the stand-in's writes do show up in the counter
      await e.standIn.exportPartition("pvc-watch", { ip: "198.51.100.7", port: 4421 });
      expect(seen.some((r) => r.startsWith("PUT ") && r.endsWith("/nvmepartitions/pvc-watch/status"))).toBe(
        true,
      );
      // From the write to the answer the handler asks the API server nothing: what woke it was
      // the watch event, not a poll (proven by counting, so a busy machine cannot fail it).
      const afterWrite = seen.length;
      const res = await pending;
      counting = false;
      expect(done).toBeGreaterThan(0);
      expect(seen.slice(afterWrite).filter((r) => r.includes("/nvmepartitions/pvc-watch"))).toEqual([]);
      const vol = res.volume!;
      expect(parseVolumeId(vol.volumeId)).toMatchObject({ namespace: e.ns, name: "pvc-watch" });
      expect(vol.capacityBytes).toBe(BigInt(GiB));
      expect(vol.volumeContext).toMatchObject({
        [VolumeContextKeys.portalIP]: "198.51.100.7",
        [VolumeContextKeys.portalPort]: "4421",
        [VolumeContextKeys.transport]: "tcp",
        [VolumeContextKeys.ctrlLossTmo]: "30",
      });
      expect(vol.volumeContext[VolumeContextKeys.nqn]).toStartWith("nqn.2026-02.io.distort:volume-vol-");
    } finally {
      globalThis.fetch = realFetch;
    }
  });

  test("the same name twice is the same volume; another capacity is ALREADY_EXISTS; a 128-character name works", async () => {
    e.standIn.auto.exportNew = true;
    const a = await e.client.unary(Controller.method.createVolume, createReq("pvc-twice"));
    const b = await e.client.unary(
      Controller.method.createVolume,
      createReq("pvc-twice", { parameters: { "csi.storage.k8s.io/pvc/name": "claim" } }),
    );
    expect(b.volume?.volumeId).toBe(a.volume!.volumeId);
    const clash = await failure(
      e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-twice", { capacityRange: { requiredBytes: BigInt(2 * GiB) } }),
      ),
    );
    expect(clash.code).toBe(GRPC.ALREADY_EXISTS);
    expect(clash.details).toContain(`capacity ${GiB} bytes`);
    const other = await failure(
      e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-twice", { parameters: { transport: "tcp" } }),
      ),
    );
    expect(other.code).toBe(GRPC.ALREADY_EXISTS);
    const long = await e.client.unary(Controller.method.createVolume, createReq("L".repeat(128)));
    expect(parseVolumeId(long.volume!.volumeId)?.name).toMatch(/^csi-[0-9a-f]{24}$/);
    e.standIn.auto.exportNew = false;
  });

  test("concurrent operations on one volume: the second is ABORTED", async () => {
    const first = e.client.unary(Controller.method.createVolume, createReq("pvc-busy"), {
      timeoutMs: 10_000,
    });
    await eventually(() => e.controller.inFlight.keys().includes(`${e.ns}/pvc-busy`));
    expect(await code(e.client.unary(Controller.method.createVolume, createReq("pvc-busy")))).toBe(
      GRPC.ABORTED,
    );
    const p = await eventually(() => e.standIn.parts.get("pvc-busy", e.ns));
    const id = `${e.ns}/pvc-busy/${p.metadata.uid}`;
    expect(await code(e.client.unary(Controller.method.deleteVolume, { volumeId: id }))).toBe(GRPC.ABORTED);
    expect(
      await code(
        e.client.unary(Controller.method.controllerExpandVolume, {
          volumeId: id,
          capacityRange: { requiredBytes: BigInt(2 * GiB) },
        }),
      ),
    ).toBe(GRPC.ABORTED);
    await e.standIn.exportPartition("pvc-busy");
    expect((await first).volume?.volumeId).toBe(id);
  });

  /** Long, so that an answer before half of it can only be the refusal, not the deadline. */
  const REFUSAL_DEADLINE_MS = 60_000;
  test("no placement before the deadline: DEADLINE_EXCEEDED saying why; no room: RESOURCE_EXHAUSTED; agent failure: UNAVAILABLE", async () => {
    const late = await failure(
      e.client.unary(Controller.method.createVolume, createReq("pvc-late"), { timeoutMs: 1_000 }),
    );
    expect(late.code).toBe(GRPC.DEADLINE_EXCEEDED);
    expect(late.details).toContain("not exported yet: state (none)");
    const started = performance.now();
    // The handler is attached at once: the rejection can arrive before the next await returns.
    const waiting = failure(
      e.client.unary(Controller.method.createVolume, createReq("pvc-late"), {
        timeoutMs: REFUSAL_DEADLINE_MS,
      }),
    );
    await eventually(() => e.controller.inFlight.keys().includes(`${e.ns}/pvc-late`));
    await e.standIn.setPartitionStatus("pvc-late", (s) => s, {
      type: "Scheduled",
      status: "False",
      reason: "InsufficientCapacity",
      message: "0/2 devices can hold 1.0 GiB",
    });
    const full = await waiting;
    // Answered when the refusal was seen, not at the call's deadline: the deadline is long, so
    // even a busy machine answers well before it.
    expect(full.code).toBe(GRPC.RESOURCE_EXHAUSTED);
    expect(full.details).toContain("0/2 devices can hold");
    expect(performance.now() - started).toBeLessThan(REFUSAL_DEADLINE_MS / 2);

    const failing = failure(
      e.client.unary(Controller.method.createVolume, createReq("pvc-broken"), {
        timeoutMs: 10_000,
      }),
    );
    await eventually(() => e.standIn.parts.get("pvc-broken", e.ns));
    await e.standIn.place("pvc-broken");
    await e.standIn.setPartitionStatus("pvc-broken", (s) => ({ ...s, state: "Failed" }), {
      type: "Ready",
      status: "False",
      reason: "BackendConflict",
      message: "device locked to kernel",
    });
    const broken = await failing;
    expect(broken.code).toBe(GRPC.UNAVAILABLE);
    expect(broken.details).toContain("BackendConflict: device locked to kernel");
  });

  test("a rescheduled claim moves an unplaced volume to its new topology; once placed, other topology is ALREADY_EXISTS", async () => {
    const zone = (z: string) => ({
      accessibilityRequirements: {
        requisite: [{ segments: { "topology.kubernetes.io/zone": z } }],
        preferred: [{ segments: { "topology.kubernetes.io/zone": z } }],
      },
    });
    expect(
      await code(
        e.client.unary(Controller.method.createVolume, createReq("pvc-wffc", zone("a")), { timeoutMs: 800 }),
      ),
    ).toBe(GRPC.DEADLINE_EXCEEDED);
    const retry = e.client.unary(Controller.method.createVolume, createReq("pvc-wffc", zone("b")), {
      timeoutMs: 10_000,
    });
    const moved = await eventually(async () => {
      const p = await e.standIn.parts.get("pvc-wffc", e.ns);
      return p?.spec.topology?.requisite?.[0]?.segments["topology.kubernetes.io/zone"] === "b" && p;
    });
    expect(moved.spec.topology?.preferred?.[0]?.segments).toEqual({ "topology.kubernetes.io/zone": "b" });
    await createStorageNode(e, "storage-1", { "topology.kubernetes.io/zone": "b", rack: "r9" });
    await e.standIn.exportPartition("pvc-wffc");
    const res = await retry;
    expect(res.volume?.accessibleTopology.map((t) => t.segments)).toEqual([
      { "topology.kubernetes.io/zone": "b" },
    ]);
    expect(await code(e.client.unary(Controller.method.createVolume, createReq("pvc-wffc", zone("c"))))).toBe(
      GRPC.ALREADY_EXISTS,
    );
    expect(
      (await e.client.unary(Controller.method.createVolume, createReq("pvc-wffc", zone("b")))).volume
        ?.volumeId,
    ).toBe(res.volume!.volumeId);
  });

  test("DeleteVolume waits for the agent's cleanup, never answers early, and leaves a same-named successor alone", async () => {
    e.standIn.auto.exportNew = true;
    const vol = (await e.client.unary(Controller.method.createVolume, createReq("pvc-del"))).volume!;
    const timedOut = await failure(
      e.client.unary(Controller.method.deleteVolume, { volumeId: vol.volumeId }, { timeoutMs: 1_000 }),
    );
    expect(timedOut.code).toBe(GRPC.DEADLINE_EXCEEDED);
    expect(timedOut.details).toContain("cleanup of volume");
    const still = await e.standIn.parts.get("pvc-del", e.ns);
    expect(still?.metadata.deletionTimestamp).toBeDefined();
    const retry = e.client.unary(
      Controller.method.deleteVolume,
      { volumeId: vol.volumeId },
      { timeoutMs: 10_000 },
    );
    await Bun.sleep(300);
    let answered = false;
    void retry.then(() => {
      answered = true;
    });
    await Bun.sleep(100);
    expect(answered).toBe(false);
    await e.standIn.releasePartition("pvc-del");
    await retry;
    expect(await e.standIn.parts.get("pvc-del", e.ns)).toBeUndefined();
    // Same name, new object: the old id must not reach it.
    const successor = (await e.client.unary(Controller.method.createVolume, createReq("pvc-del"))).volume!;
    expect(successor.volumeId).not.toBe(vol.volumeId);
    await e.client.unary(Controller.method.deleteVolume, { volumeId: vol.volumeId });
    expect((await e.standIn.parts.get("pvc-del", e.ns))?.metadata.deletionTimestamp).toBeUndefined();
    expect(
      await code(
        e.client.unary(Controller.method.validateVolumeCapabilities, {
          volumeId: vol.volumeId,
          volumeCapabilities: [mountCap()],
        }),
      ),
    ).toBe(GRPC.NOT_FOUND);
    e.standIn.auto.release = true;
    await e.client.unary(Controller.method.deleteVolume, { volumeId: successor.volumeId });
    await e.client.unary(Controller.method.deleteVolume, { volumeId: successor.volumeId });
    e.standIn.auto.exportNew = false;
    e.standIn.auto.release = false;
  });
});

async function createStorageNode(
  e: Env,
  name: string,
  labels: Record<string, string>,
  ready = true,
): Promise<void> {
  const client = new ResourceClient(tc.conn, kinds.RDMAStorageNode);
  const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  const existing = await client.get(name, e.ns);
  // The stand-in's heartbeat may have made the record first, without labels.
  if (existing) await client.mergePatch(name, e.ns, { metadata: { labels } });
  const created =
    (existing ? await client.get(name, e.ns) : undefined) ??
    (await client.create({
      apiVersion: "storage.distort.io/v1alpha1",
      kind: "RDMAStorageNode",
      metadata: { name, namespace: e.ns, labels },
      spec: { nodeName: name },
    } as RDMAStorageNode));
  const cond = (type: string) => ({
    type,
    status: ready ? ("True" as const) : ("False" as const),
    reason: "Test",
    message: "",
    lastTransitionTime: now,
  });
  await client.replaceStatus({
    ...created,
    status: {
      lastHeartbeatTime: now,
      rdmaIP: "192.0.2.10",
      transport: "rdma",
      conditions: [cond("Ready"), cond("NVMeInventoryReady")],
    },
  });
  await eventually(() =>
    e.controller.storageNodes.list().some((n) => n.metadata.name === name && n.status?.conditions?.length),
  );
}

describe("ControllerPublishVolume fencing", () => {
  let e: Env;
  let volumeId: string;
  let nodeA: string;
  let nodeB: string;
  const PINNED = "nqn.2014-08.org.nvmexpress:uuid:7d3a0a36-6c1f-4c55-9a51-1f2b3c4d5e6f";
  const NQN_B = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-6c1f-4c55-9a51-1f2b3c4d5e6f";
  beforeAll(async () => {
    e = await env();
    e.standIn.auto.exportNew = true;
    volumeId = (await e.client.unary(Controller.method.createVolume, createReq("pvc-pub"))).volume!.volumeId;
    nodeA = `node-a-${suffix()}`;
    nodeB = `node-b-${suffix()}`;
    await createNode(nodeA);
    await createNode(nodeB);
    // What kubelet stores when each node's plugin registers.
    await registerCsiNode(nodeA, PINNED);
    await registerCsiNode(nodeB, NQN_B);
  });

  const publish = (nodeId: string, over: { readonly?: boolean; timeoutMs?: number } = {}) =>
    e.client.unary(
      Controller.method.controllerPublishVolume,
      { volumeId, nodeId, volumeCapability: mountCap(), readonly: over.readonly ?? false },
      { timeoutMs: over.timeoutMs ?? 10_000 },
    );
  const attName = () => {
    const ref = parseVolumeId(volumeId)!;
    return attachmentNameFor(ref.name, ref.uid);
  };

  test("publish waits for AccessReady of its own lifetime; repeating it is idempotent", async () => {
    const pending = publish(nodeA);
    const a = await eventually(() => e.standIn.atts.get(attName(), e.ns));
    expect(a.spec).toMatchObject({ nodeId: nodeA, hostNQN: PINNED, partitionName: "pvc-pub" });
    let answered = false;
    void pending.then(() => {
      answered = true;
    });
    await Bun.sleep(300);
    expect(answered).toBe(false);
    await e.standIn.grant(attName());
    const res = await pending;
    expect(res.publishContext).toEqual({
      [PublishContextKeys.hostNQN]: PINNED,
      [PublishContextKeys.attachmentId]: a.spec.attachmentId,
    });
    expect((await publish(nodeA)).publishContext).toEqual(res.publishContext);
    expect(await code(publish(nodeA, { readonly: true }))).toBe(GRPC.ALREADY_EXISTS);
    const listed = await e.client.unary(Controller.method.listVolumes, {});
    expect(listed.entries.find((x) => x.volume?.volumeId === volumeId)?.status?.publishedNodeIds).toEqual([
      nodeA,
    ]);
    expect(
      (await e.client.unary(Controller.method.controllerGetVolume, { volumeId })).status?.publishedNodeIds,
    ).toEqual([nodeA]);
  });

  test("a second node is refused until the holder is fenced; DeleteVolume is refused while published", async () => {
    const refused = await failure(publish(nodeB));
    expect(refused.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(refused.details).toContain(`published to node ${nodeA}`);
    expect(refused.details).toContain(FENCED_ANNOTATION);
    expect(await code(e.client.unary(Controller.method.deleteVolume, { volumeId }))).toBe(
      GRPC.FAILED_PRECONDITION,
    );
    expect(await code(publish(`node-missing-${suffix()}`))).toBe(GRPC.NOT_FOUND);
    const bare = `node-bare-${suffix()}`;
    await createNode(bare);
    const unregistered = await failure(publish(bare));
    expect(unregistered.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(unregistered.details).toContain("has not registered its NVMe host NQN");
  });

  test("takeover after fencing: success only once the agent enforces the new lifetime; a stale unpublish is a no-op", async () => {
    const before = (await e.standIn.atts.get(attName(), e.ns))!;
    await e.standIn.atts.replace({
      ...before,
      metadata: {
        ...before.metadata,
        annotations: { ...before.metadata.annotations, [FENCED_ANNOTATION]: "true" },
      },
    });
    const pending = publish(nodeB);
    const switched = await eventually(async () => {
      const a = await e.standIn.atts.get(attName(), e.ns);
      return a?.spec.nodeId === nodeB && a;
    });
    expect(switched.spec.hostNQN).toBe(NQN_B);
    expect(switched.spec.attachmentId).not.toBe(before.spec.attachmentId);
    expect(switched.metadata.annotations?.[FENCED_ANNOTATION]).toBeUndefined();
    expect(switched.metadata.annotations?.[PREVIOUS_NODE_ANNOTATION]).toBe(nodeA);
    // AccessReady is still True from node A's lifetime: that must not satisfy node B.
    expect(switched.status?.conditions?.find((c) => c.type === "AccessReady")?.status).toBe("True");
    let answered = false;
    void pending.then(() => {
      answered = true;
    });
    await Bun.sleep(400);
    expect(answered).toBe(false);
    await e.standIn.grant(attName());
    const res = await pending;
    expect(res.publishContext?.[PublishContextKeys.attachmentId]).toBe(switched.spec.attachmentId);
    // Node A's attacher catching up late must not remove node B's access.
    await e.client.unary(Controller.method.controllerUnpublishVolume, { volumeId, nodeId: nodeA });
    expect((await e.standIn.atts.get(attName(), e.ns))?.spec.nodeId).toBe(nodeB);
  });

  test("unpublish waits until the agent revoked the ACL (finalizer), then delete proceeds", async () => {
    const pending = e.client.unary(
      Controller.method.controllerUnpublishVolume,
      { volumeId, nodeId: nodeB },
      { timeoutMs: 10_000 },
    );
    await eventually(async () => (await e.standIn.atts.get(attName(), e.ns))?.metadata.deletionTimestamp);
    let answered = false;
    void pending.then(() => {
      answered = true;
    });
    await Bun.sleep(300);
    expect(answered).toBe(false);
    await e.standIn.releaseAttachment(attName());
    await pending;
    expect(await e.standIn.atts.get(attName(), e.ns)).toBeUndefined();
    await e.client.unary(Controller.method.controllerUnpublishVolume, { volumeId, nodeId: nodeB });
    e.standIn.auto.release = true;
    await e.client.unary(Controller.method.deleteVolume, { volumeId });
    expect(await code(publish(nodeA))).toBe(GRPC.NOT_FOUND);
  });
});

describe("host NQN from the CSI node ID", () => {
  const NQN_X = "nqn.2014-08.org.nvmexpress:uuid:1c1c1c1c-6c1f-4c55-9a51-1f2b3c4d5e6f";
  const csiNode = (node: string, nodeID: string) =>
    tc.conn.api(k8s.StorageV1Api).createCSINode({
      body: {
        metadata: { name: node },
        spec: { drivers: [{ name: DRIVER_NAME, nodeID, topologyKeys: [] }] },
      },
    });

  test("publish admits the NQN the node ID carries (not a Node annotation); two Nodes with one host NQN are refused with an Event", async () => {
    const e = await env();
    e.standIn.auto.exportNew = true;
    const vol = (await e.client.unary(Controller.method.createVolume, createReq("pvc-dup"))).volume!;
    const [nodeC, nodeD] = [`node-c-${suffix()}`, `node-d-${suffix()}`];
    // Node C's annotation says something else: only what kubelet stored from the plugin counts.
    await createNode(nodeC, {
      [LEGACY_HOST_NQN_ANNOTATION]: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000cc",
    });
    await createNode(nodeD);
    await csiNode(nodeC, formatNodeId(nodeC, NQN_X));
    await csiNode(nodeD, formatNodeId(nodeD, NQN_X));
    const publish = () =>
      e.client.unary(
        Controller.method.controllerPublishVolume,
        { volumeId: vol.volumeId, nodeId: formatNodeId(nodeC, NQN_X), volumeCapability: mountCap() },
        { timeoutMs: 10_000 },
      );
    const refused = await failure(publish());
    expect(refused.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(refused.details).toContain(`all present host NQN ${NQN_X}`);
    expect(refused.details).toContain(nodeD);
    const ref = parseVolumeId(vol.volumeId)!;
    expect(await e.standIn.atts.get(attachmentNameFor(ref.name, ref.uid), e.ns)).toBeUndefined();
    const event = await eventually(async () => {
      const list = await tc.conn.api(k8s.EventsV1Api).listNamespacedEvent({ namespace: e.ns });
      return list.items.find((x) => x.reason === "DuplicateHostNQN" && x.regarding?.name === ref.name);
    });
    expect(event.type).toBe("Warning");
    expect(event.note).toContain(nodeD);

    // Once the second machine stops claiming it, the node ID's NQN is what the target admits.
    await tc.conn.api(k8s.StorageV1Api).deleteCSINode({ name: nodeD });
    const pending = publish();
    const a = await eventually(() => e.standIn.atts.get(attachmentNameFor(ref.name, ref.uid), e.ns));
    expect(a.spec).toMatchObject({ nodeId: formatNodeId(nodeC, NQN_X), hostNQN: NQN_X });
    await e.standIn.grant(a.metadata.name);
    expect((await pending).publishContext[PublishContextKeys.hostNQN]).toBe(NQN_X);
    // csi-attacher detaching with the bare node name it may have stored earlier still unpublishes.
    e.standIn.auto.release = true;
    await e.client.unary(Controller.method.controllerUnpublishVolume, {
      volumeId: vol.volumeId,
      nodeId: nodeC,
    });
    expect(await e.standIn.atts.get(a.metadata.name, e.ns)).toBeUndefined();
    // A bare node name takes the NQN from CSINode, not from the Node's (rewritable) annotation...
    e.standIn.auto.grant = true;
    const bare = await e.client.unary(
      Controller.method.controllerPublishVolume,
      { volumeId: vol.volumeId, nodeId: nodeC, volumeCapability: mountCap() },
      { timeoutMs: 10_000 },
    );
    expect(bare.publishContext[PublishContextKeys.hostNQN]).toBe(NQN_X);
    await e.client.unary(Controller.method.controllerUnpublishVolume, {
      volumeId: vol.volumeId,
      nodeId: nodeC,
    });
    // ...and a node ID naming another NQN than the node registered is refused.
    const forged = await failure(
      e.client.unary(
        Controller.method.controllerPublishVolume,
        {
          volumeId: vol.volumeId,
          nodeId: formatNodeId(nodeC, "nqn.2014-08.org.nvmexpress:uuid:2d2d2d2d-6c1f-4c55-9a51-1f2b3c4d5e6f"),
          volumeCapability: mountCap(),
        },
        { timeoutMs: 10_000 },
      ),
    );
    expect(forged.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(forged.details).toContain("is not the one node");
    // A Node whose only claim to an NQN is an annotation (anything allowed to patch Nodes could
    // write one) has registered nothing: refused, nothing created.
    const nodeE = `node-e-${suffix()}`;
    await createNode(nodeE, { [LEGACY_HOST_NQN_ANNOTATION]: NQN_X.replace("1c1c1c1c", "3e3e3e3e") });
    const annotated = await failure(
      e.client.unary(
        Controller.method.controllerPublishVolume,
        { volumeId: vol.volumeId, nodeId: nodeE, volumeCapability: mountCap() },
        { timeoutMs: 10_000 },
      ),
    );
    expect(annotated.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(annotated.details).toContain(`node ${nodeE} has not registered its NVMe host NQN`);
    expect(
      (await e.standIn.atts.list({ namespace: e.ns })).items.filter(
        (x) => x.spec.partitionUID === ref.uid && x.spec.nodeId === nodeE,
      ),
    ).toEqual([]);
  });
});

describe("MULTI_NODE_READER_ONLY publications", () => {
  let e: Env;
  let volumeId: string;
  const nodes: string[] = [];
  beforeAll(async () => {
    e = await env();
    e.standIn.auto.exportNew = true;
    e.standIn.auto.grant = true;
    e.standIn.auto.release = true;
    volumeId = (
      await e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-rox", { volumeCapabilities: [mountCap(Mode.MULTI_NODE_READER_ONLY)] }),
      )
    ).volume!.volumeId;
    for (const n of ["a", "b", "c"]) {
      const name = `node-rox-${n}-${suffix()}`;
      await createNode(name);
      await registerCsiNode(
        name,
        `nqn.2014-08.org.nvmexpress:uuid:0000000${nodes.length}-6c1f-4c55-9a51-1f2b3c4d5e6f`,
      );
      nodes.push(name);
    }
  });
  const publish = (nodeId: string, mode: Mode) =>
    e.client.unary(
      Controller.method.controllerPublishVolume,
      { volumeId, nodeId, volumeCapability: mountCap(mode), readonly: true },
      { timeoutMs: 10_000 },
    );
  const unpublish = (nodeId: string) =>
    e.client.unary(Controller.method.controllerUnpublishVolume, { volumeId, nodeId }, { timeoutMs: 10_000 });
  const published = async () =>
    [
      ...((await e.client.unary(Controller.method.controllerGetVolume, { volumeId })).status
        ?.publishedNodeIds ?? []),
    ].sort();

  test("several readers share the volume, each on its own attachment; a writer is refused while any is there", async () => {
    const [a, b, c] = nodes as [string, string, string];
    const ref = parseVolumeId(volumeId)!;
    const ra = await publish(a, Mode.MULTI_NODE_READER_ONLY);
    const rb = await publish(b, Mode.MULTI_NODE_READER_ONLY);
    expect(ra.publishContext?.[PublishContextKeys.attachmentId]).not.toBe(
      rb.publishContext?.[PublishContextKeys.attachmentId],
    );
    expect((await e.standIn.atts.get(readerAttachmentNameFor(ref.name, ref.uid, a), e.ns))?.spec.nodeId).toBe(
      a,
    );
    expect((await e.standIn.atts.get(readerAttachmentNameFor(ref.name, ref.uid, b), e.ns))?.spec.nodeId).toBe(
      b,
    );
    expect(await e.standIn.atts.get(attachmentNameFor(ref.name, ref.uid), e.ns)).toBeUndefined();
    await eventually(async () => (await published()).length === 2);
    expect(await published()).toEqual([a, b].sort());
    // Repeating a reader publish is idempotent.
    expect((await publish(a, Mode.MULTI_NODE_READER_ONLY)).publishContext).toEqual(ra.publishContext);
    for (const mode of [Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_READER_ONLY]) {
      const refused = await failure(publish(c, mode));
      expect(refused.code).toBe(GRPC.FAILED_PRECONDITION);
      expect(refused.details).toContain("MULTI_NODE_READER_ONLY");
    }
    await unpublish(a);
    expect(await e.standIn.atts.get(readerAttachmentNameFor(ref.name, ref.uid, a), e.ns)).toBeUndefined();
    expect((await failure(publish(c, Mode.SINGLE_NODE_WRITER))).code).toBe(GRPC.FAILED_PRECONDITION);
    await unpublish(b);
    // No reader left: a single-node publication may have it, and then readers are refused.
    await publish(c, Mode.SINGLE_NODE_WRITER);
    const noReader = await failure(publish(a, Mode.MULTI_NODE_READER_ONLY));
    expect(noReader.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(noReader.details).toContain(`published to node ${c}`);
    await unpublish(c);
    await publish(a, Mode.MULTI_NODE_READER_ONLY);
    // Unpublish from every node (empty node id) removes readers too.
    await unpublish("");
    await eventually(async () => (await published()).length === 0);
  });
});

describe("MULTI_NODE_MULTI_WRITER publications (raw block, live migration)", () => {
  let e: Env;
  let volumeId: string;
  const nodes: string[] = [];
  beforeAll(async () => {
    e = await env();
    e.standIn.auto.exportNew = true;
    e.standIn.auto.grant = true;
    e.standIn.auto.release = true;
    volumeId = (
      await e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-mnmw", { volumeCapabilities: [blockCap(Mode.MULTI_NODE_MULTI_WRITER)] }),
      )
    ).volume!.volumeId;
    for (const n of ["a", "b", "c"]) {
      const name = `node-mnmw-${n}-${suffix()}`;
      await createNode(name);
      await registerCsiNode(
        name,
        `nqn.2014-08.org.nvmexpress:uuid:1000000${nodes.length}-6c1f-4c55-9a51-1f2b3c4d5e6f`,
      );
      nodes.push(name);
    }
  });
  const publish = (
    nodeId: string,
    mode = Mode.MULTI_NODE_MULTI_WRITER,
    cap: (m: Mode) => ReturnType<typeof blockCap> | ReturnType<typeof mountCap> = blockCap,
  ) =>
    e.client.unary(
      Controller.method.controllerPublishVolume,
      { volumeId, nodeId, volumeCapability: cap(mode), readonly: false },
      { timeoutMs: 10_000 },
    );
  const unpublish = (nodeId: string) =>
    e.client.unary(Controller.method.controllerUnpublishVolume, { volumeId, nodeId }, { timeoutMs: 10_000 });
  const holders = async () => {
    const ref = parseVolumeId(volumeId)!;
    const list = await e.standIn.atts.list({ namespace: e.ns });
    return list.items
      .filter((a) => a.spec.partitionUID === ref.uid && !a.metadata.deletionTimestamp)
      .map((a) => `${a.spec.nodeId}=${a.spec.hostNQN}`)
      .sort();
  };

  test("a filesystem volume cannot be made or published MULTI_NODE_MULTI_WRITER", async () => {
    const made = await failure(
      e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-mnmw-fs", { volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)] }),
      ),
    );
    expect(made.code).toBe(GRPC.INVALID_ARGUMENT);
    expect(made.details).toContain("raw block volumes only");
    const pub = await failure(publish(nodes[0] as string, Mode.MULTI_NODE_MULTI_WRITER, (m) => mountCap(m)));
    expect(pub.code).toBe(GRPC.INVALID_ARGUMENT);
    expect(pub.details).toContain("raw block volumes only");
    const v = await e.client.unary(Controller.method.validateVolumeCapabilities, {
      volumeId,
      volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)],
    });
    expect(v.confirmed).toBeUndefined();
    expect(await holders()).toEqual([]);
  });

  test("two hosts during a migration window, no third, and single-writer again once one detaches", async () => {
    const [a, b, c] = nodes as [string, string, string];
    const ref = parseVolumeId(volumeId)!;
    const nqn = (i: number) => `nqn.2014-08.org.nvmexpress:uuid:1000000${i}-6c1f-4c55-9a51-1f2b3c4d5e6f`;
    const pa = await publish(a);
    const pb = await publish(b);
    expect(pa.publishContext?.[PublishContextKeys.attachmentId]).not.toBe(
      pb.publishContext?.[PublishContextKeys.attachmentId],
    );
    // Both hosts are the partition's records (one per node), so the agent puts both on the ACL.
    expect(await holders()).toEqual([`${a}=${nqn(0)}`, `${b}=${nqn(1)}`].sort());
    for (const n of [a, b])
      expect(await e.standIn.atts.get(readerAttachmentNameFor(ref.name, ref.uid, n), e.ns)).toBeDefined();
    expect(await e.standIn.atts.get(attachmentNameFor(ref.name, ref.uid), e.ns)).toBeUndefined();
    // Idempotent per node.
    expect((await publish(a)).publishContext).toEqual(pa.publishContext);
    // A third host is refused, in the same mode or any other; none of them reaches the ACL.
    const third = await failure(publish(c));
    expect(third.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(third.details).toContain("2 nodes already");
    for (const mode of [Mode.SINGLE_NODE_WRITER, Mode.MULTI_NODE_READER_ONLY]) {
      const refused = await failure(publish(c, mode));
      expect(refused.code).toBe(GRPC.FAILED_PRECONDITION);
      expect(refused.details).toContain("MULTI_NODE_MULTI_WRITER");
    }
    // The same node asking for a single-node mode beside its MNMW publication is incompatible.
    expect((await failure(publish(a, Mode.SINGLE_NODE_WRITER))).code).toBe(GRPC.FAILED_PRECONDITION);
    expect(await holders()).toEqual([`${a}=${nqn(0)}`, `${b}=${nqn(1)}`].sort());

    // Migration done: the source detaches. b alone holds it, and no other node gets it in a
    // single-node mode while b is there.
    await unpublish(a);
    expect(await holders()).toEqual([`${b}=${nqn(1)}`]);
    const single = await failure(publish(c, Mode.SINGLE_NODE_WRITER));
    expect(single.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(single.details).toContain(b);

    // A fenced holder is revoked, not kept: once b is marked fenced, c's single-node publish
    // removes b's attachment (its host leaves the ACL) before c is admitted.
    const bAtt = (await e.standIn.atts.get(readerAttachmentNameFor(ref.name, ref.uid, b), e.ns))!;
    await e.standIn.atts.replace({
      ...bAtt,
      metadata: {
        ...bAtt.metadata,
        annotations: { ...bAtt.metadata.annotations, [FENCED_ANNOTATION]: "true" },
      },
    });
    await eventually(async () =>
      e.controller.attachments
        .list()
        .some((x) => x.metadata.name === bAtt.metadata.name && x.metadata.annotations?.[FENCED_ANNOTATION]),
    );
    await publish(c, Mode.SINGLE_NODE_WRITER);
    expect(await holders()).toEqual([`${c}=${nqn(2)}`]);
    // And with a single-node holder, MNMW is refused until it unpublishes.
    const shared = await failure(publish(a));
    expect(shared.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(shared.details).toContain(`published to node ${c}`);
    await unpublish("");
    expect(await holders()).toEqual([]);
  });
});

test("the node directory takes the node ID from CSINode and never a Node annotation", async () => {
  const name = `node-reg-${suffix()}`;
  await createNode(name);
  await tc.conn
    .api(k8s.CoreV1Api)
    .patchNode(
      { name, body: { metadata: { labels: { "topology.kubernetes.io/zone": "z1" } } } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  const nqn = "nqn.2014-08.org.nvmexpress:uuid:12345678-6c1f-4c55-9a51-1f2b3c4d5e6f";
  const dir = kubeNodeDirectory(tc.conn);
  const labels = { "topology.kubernetes.io/zone": "z1" };
  expect(await dir.get(name)).toEqual({ labels });
  // An annotation naming an NQN changes nothing, and claims nothing.
  await tc.conn
    .api(k8s.CoreV1Api)
    .patchNode(
      { name, body: { metadata: { annotations: { [LEGACY_HOST_NQN_ANNOTATION]: nqn } } } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  expect(await dir.get(name)).toEqual({ labels });
  expect(await dir.claiming(nqn)).toEqual([]);
  await registerCsiNode(name, nqn);
  expect(await dir.get(name)).toEqual({ registeredNodeId: formatNodeId(name, nqn), labels });
  expect(await dir.claiming(nqn)).toEqual([name]);
  expect(await dir.get(`node-none-${suffix()}`)).toBeUndefined();
});

/** What kubelet stores in a node's CSINode when DISTORT's node plugin registers with that host NQN. */
async function registerCsiNode(name: string, nqn: string): Promise<void> {
  await tc.conn.api(k8s.StorageV1Api).createCSINode({
    body: {
      metadata: { name },
      spec: { drivers: [{ name: DRIVER_NAME, nodeID: formatNodeId(name, nqn), topologyKeys: [] }] },
    },
  });
}

describe("listing, capacity, health, validation, expansion", () => {
  let e: Env;
  beforeAll(async () => {
    e = await env();
    e.standIn.auto.exportNew = true;
    e.standIn.auto.grow = true;
    e.standIn.auto.release = true;
  });

  test("ListVolumes pages through every volume exactly once", async () => {
    const ids = new Set<string>();
    for (let i = 0; i < 5; i++)
      ids.add(
        (await e.client.unary(Controller.method.createVolume, createReq(`pvc-list-${i}`))).volume!.volumeId,
      );
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    do {
      const page = await e.client.unary(Controller.method.listVolumes, {
        maxEntries: 2,
        startingToken: token,
      });
      expect(page.entries.length).toBeLessThanOrEqual(2);
      seen.push(...page.entries.map((x) => x.volume!.volumeId));
      for (const x of page.entries) expect(x.status?.publishedNodeIds).toEqual([]);
      token = page.nextToken;
      pages++;
    } while (token);
    expect(pages).toBe(3);
    expect(new Set(seen)).toEqual(ids);
    expect(seen.length).toBe(5);
  });

  test("ValidateVolumeCapabilities confirms what the volume is, and only that", async () => {
    const vol = (
      await e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-valid", { parameters: { fsType: "ext4", transport: "tcp" } }),
      )
    ).volume!;
    const validate = (over: object) =>
      e.client.unary(Controller.method.validateVolumeCapabilities, {
        volumeId: vol.volumeId,
        volumeCapabilities: [mountCap()],
        ...over,
      });
    expect(
      (await validate({ volumeContext: vol.volumeContext, parameters: { fsType: "ext4", transport: "tcp" } }))
        .confirmed,
    ).toBeDefined();
    const withVac = await validate({ mutableParameters: { "qos.rwIops": "3000" } });
    expect(withVac.confirmed?.mutableParameters).toEqual({ "qos.rwIops": "3000" });
    expect((await validate({ mutableParameters: { XXX_FakeKey: "x" } })).message).toContain("unknown key");
    const wrongParams = await validate({ parameters: { transport: "rdma" } });
    expect(wrongParams.confirmed).toBeUndefined();
    expect(wrongParams.message).toContain("parameters differ");
    expect(
      (await validate({ volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)] })).message,
    ).toContain("raw block volumes only");
    expect(
      (await validate({ volumeCapabilities: [mountCap(Mode.SINGLE_NODE_WRITER, "xfs")] })).message,
    ).toContain("created for ext4");
    expect(
      (await validate({ volumeContext: { ...vol.volumeContext, [VolumeContextKeys.portalPort]: "1" } }))
        .message,
    ).toContain("volume_context");
  });

  test("GetCapacity gives the best single device's room among claimed devices on ready storage nodes in the segment", async () => {
    const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
    const tag = suffix();
    await createStorageNode(e, `sn-a-${tag}`, { zone: `a-${tag}` });
    await createStorageNode(e, `sn-b-${tag}`, { zone: `b-${tag}` });
    await createStorageNode(e, `sn-c-${tag}`, { zone: `a-${tag}` }, false);
    const mk = async (name: string, node: string, free: number) => {
      const d = await devices.create({
        apiVersion: "storage.distort.io/v1alpha1",
        kind: "NVMeDevice",
        metadata: { name },
        spec: {
          nodeName: node,
          pciAddress: "0000:01:00.0",
          serial: name,
          model: "sim",
          allocatableBytes: 100 * GiB,
          numaNode: 0,
        },
      } as NVMeDevice);
      await devices.replaceStatus({
        ...d,
        status: {
          phase: "Claimed",
          claimRef: { namespace: e.ns, name: "c", uid: "u" },
          freeBytes: free,
          reservations: [],
          conditions: [],
        },
      });
    };
    await mk(`d1-${tag}`, `sn-a-${tag}`, 10 * GiB);
    await mk(`d2-${tag}`, `sn-a-${tag}`, 20 * GiB);
    await mk(`d3-${tag}`, `sn-b-${tag}`, 40 * GiB);
    await mk(`d4-${tag}`, `sn-c-${tag}`, 80 * GiB);
    await eventually(
      () => e.controller.devices.list().filter((d) => d.metadata.name.endsWith(tag) && d.status).length === 4,
    );
    const cap = (zone: string) =>
      e.client.unary(Controller.method.getCapacity, {
        accessibleTopology: { segments: { zone } },
        volumeCapabilities: [mountCap()],
      });
    const a = await cap(`a-${tag}`);
    // 30 GiB free in zone a, but a volume lands on one device: 20 GiB is what one can get.
    expect(a.availableCapacity).toBe(BigInt(20 * GiB));
    expect(a.maximumVolumeSize).toBe(BigInt(20 * GiB));
    expect(a.minimumVolumeSize).toBe(BigInt(4 * MiB));
    expect((await cap(`b-${tag}`)).availableCapacity).toBe(BigInt(40 * GiB));
    expect((await cap("nowhere")).availableCapacity).toBe(0n);
    const multi = await e.client.unary(Controller.method.getCapacity, {
      volumeCapabilities: [mountCap(Mode.MULTI_NODE_MULTI_WRITER)],
    });
    expect(multi.availableCapacity).toBe(0n);
  });

  test("health: healthy while exported and Ready, INACCESSIBLE with the agent's reason otherwise", async () => {
    const vol = (await e.client.unary(Controller.method.createVolume, createReq("pvc-health"))).volume!;
    // A fresh heartbeat of its storage node, seen by the controller: only the partition is judged.
    await e.standIn.heartbeat();
    await eventually(() => e.controller.storageNodes.get(`${e.ns}/${e.standIn.storageNode}`) !== undefined);
    const health = () =>
      e.client.unary(Controller.method.controllerGetVolumeHealth, { volumeId: vol.volumeId });
    expect((await health()).volumeHealth?.healthStatuses).toEqual([]);
    await e.standIn.setPartitionStatus("pvc-health", (s) => ({ ...s, state: "Failed" }), {
      type: "Ready",
      status: "False",
      reason: "DeviceUnavailable",
      message: "drive gone",
    });
    await eventually(() => e.controller.partitions.get(`${e.ns}/pvc-health`)?.status?.state === "Failed");
    const bad = (await health()).volumeHealth?.healthStatuses ?? [];
    expect(bad.map((h) => [h.status, h.reason])).toEqual([[2, "DeviceUnavailable"]]);
    const listed = await e.client.unary(Controller.method.controllerListVolumeHealth, {});
    expect(listed.entries.map((x) => x.volumeId)).toEqual([vol.volumeId]);
  });

  test("health: a volume whose storage node's agent stopped heartbeating, or whose drive is gone, is INACCESSIBLE though its partition still reads Ready", async () => {
    const vol = (await e.client.unary(Controller.method.createVolume, createReq("pvc-health-node"))).volume!;
    const reasons = async () =>
      (
        (await e.client.unary(Controller.method.controllerGetVolumeHealth, { volumeId: vol.volumeId }))
          .volumeHealth?.healthStatuses ?? []
      ).map((h) => h.reason);
    const beat = async (at?: Date) => {
      const n = await e.standIn.heartbeat(at ? { at } : {});
      await eventually(
        () =>
          e.controller.storageNodes.get(`${e.ns}/${e.standIn.storageNode}`)?.metadata.resourceVersion ===
          n.metadata.resourceVersion,
      );
    };
    await beat();
    expect(await reasons()).toEqual([]);
    // The agent is gone: its last heartbeat is 10 minutes old, and nobody set Ready=False.
    await beat(new Date(Date.now() - 600_000));
    expect(await reasons()).toEqual(["StorageNodeStale"]);
    const listed = await e.client.unary(Controller.method.controllerListVolumeHealth, {});
    expect(listed.entries.map((x) => x.volumeId)).toContain(vol.volumeId);
    await beat();
    expect(await reasons()).toEqual([]);
    // The drive left the node's inventory (the reporter's Unavailable phase).
    const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
    const set = async (phase: "Unavailable" | "Available") => {
      await devices.replaceStatus({
        ...((await devices.get(e.standIn.deviceName)) as NVMeDevice),
        status: { ...((await devices.get(e.standIn.deviceName)) as NVMeDevice).status!, phase },
      });
      await eventually(() => e.controller.devices.get(e.standIn.deviceName)?.status?.phase === phase);
    };
    await set("Unavailable");
    try {
      expect(await reasons()).toEqual(["DriveUnavailable"]);
    } finally {
      await set("Available");
    }
    expect(await reasons()).toEqual([]);
  });

  test("expansion grows spdk volumes after the agent did; filesystems need node expansion; kernel volumes refuse", async () => {
    const vol = (await e.client.unary(Controller.method.createVolume, createReq("pvc-grow"))).volume!;
    const grown = await e.client.unary(Controller.method.controllerExpandVolume, {
      volumeId: vol.volumeId,
      capacityRange: { requiredBytes: BigInt(2 * GiB + 1) },
      volumeCapability: mountCap(),
    });
    expect(grown.capacityBytes).toBe(BigInt(2 * GiB + 4 * MiB));
    expect(grown.nodeExpansionRequired).toBe(true);
    expect((await e.standIn.parts.get("pvc-grow", e.ns))?.spec.sizeBytes).toBe(2 * GiB + 4 * MiB);
    const again = await e.client.unary(Controller.method.controllerExpandVolume, {
      volumeId: vol.volumeId,
      capacityRange: { requiredBytes: BigInt(GiB) },
      volumeCapability: blockCap(),
    });
    expect(again).toMatchObject({ capacityBytes: BigInt(2 * GiB + 4 * MiB), nodeExpansionRequired: false });
    const kernel = (
      await e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-kernel", { parameters: { backend: "kernel" } }),
      )
    ).volume!;
    const refused = await failure(
      e.client.unary(Controller.method.controllerExpandVolume, {
        volumeId: kernel.volumeId,
        capacityRange: { requiredBytes: BigInt(2 * GiB) },
      }),
    );
    expect(refused.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(refused.details).toContain("kernel backend");
    const p = await e.standIn.parts.get("pvc-grow", e.ns);
    expect(p?.metadata.annotations?.[Annotations.requestName]).toBe("pvc-grow");
  });

  test("a replicated volume: created with its copies asked for, not grown or snapshotted yet; its copies are no CSI volumes", async () => {
    const vol = (
      await e.client.unary(
        Controller.method.createVolume,
        createReq("pvc-repl", { parameters: { replicas: "2", transport: "tcp" } }),
      )
    ).volume!;
    const p = await e.standIn.parts.get("pvc-repl", e.ns);
    expect(p?.spec).toMatchObject({ replicas: 2, backend: "spdk" });
    expect(p?.spec.deviceSerial).toBeUndefined();
    const grow = await failure(
      e.client.unary(Controller.method.controllerExpandVolume, {
        volumeId: vol.volumeId,
        capacityRange: { requiredBytes: BigInt(4 * GiB) },
      }),
    );
    expect(grow.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(grow.details).toContain("is replicated (2 copies)");
    const snap = await failure(
      e.client.unary(Controller.method.createSnapshot, { name: "snap-repl", sourceVolumeId: vol.volumeId }),
    );
    expect(snap.code).toBe(GRPC.FAILED_PRECONDITION);
    expect(snap.details).toContain("is replicated");
    // A copy, as the manager makes it: not listed, and its id names no volume.
    const copy = await e.standIn.parts.create({
      apiVersion: API_VERSION,
      kind: "NVMePartition",
      metadata: { name: "pvc-repl-r0", namespace: e.ns },
      spec: {
        sizeBytes: GiB,
        backend: "spdk",
        volumeManager: "partition",
        replicaOf: { name: "pvc-repl", uid: p?.metadata.uid as string },
      },
    });
    const copyId = `${e.ns}/pvc-repl-r0/${copy.metadata.uid}`;
    await eventually(async () => e.controller.partitions.get(`${e.ns}/pvc-repl-r0`) !== undefined);
    const listed = await e.client.unary(Controller.method.listVolumes, {});
    expect(listed.entries.map((x) => x.volume!.volumeId)).not.toContain(copyId);
    expect(listed.entries.map((x) => x.volume!.volumeId)).toContain(vol.volumeId);
    await e.client.unary(Controller.method.deleteVolume, { volumeId: copyId });
    expect((await e.standIn.parts.get("pvc-repl-r0", e.ns))?.metadata.uid).toBe(copy.metadata.uid);
    await e.standIn.parts.delete("pvc-repl-r0", e.ns);
  });

  test("two concurrent expansions on one drive cannot overcommit it: the ledger arbitrates, one gets RESOURCE_EXHAUSTED", async () => {
    const vols = await Promise.all(
      ["pvc-race-a", "pvc-race-b"].map(
        async (n) => (await e.client.unary(Controller.method.createVolume, createReq(n))).volume!,
      ),
    );
    const devices = new ResourceClient(tc.conn, kinds.NVMeDevice);
    const dev = (await devices.get(e.standIn.deviceName)) as NVMeDevice;
    const ledger = () => devices.get(e.standIn.deviceName).then((d) => d?.status?.reservations ?? []);
    const committed = (await ledger()).reduce((n, r) => n + r.bytes, 0);
    // Room for one of the two to grow by 1 GiB, not for both.
    const allocatable = committed + GiB + 512 * MiB;
    await devices.mergePatch(dev.metadata.name, undefined, { spec: { allocatableBytes: allocatable } });
    await eventually(
      () => e.controller.devices.get(dev.metadata.name)?.spec.allocatableBytes === allocatable,
    );
    const codes = await Promise.all(
      vols.map((v) =>
        code(
          e.client.unary(Controller.method.controllerExpandVolume, {
            volumeId: v.volumeId,
            capacityRange: { requiredBytes: BigInt(2 * GiB) },
            volumeCapability: mountCap(),
          }),
        ),
      ),
    );
    expect(codes.sort()).toEqual([GRPC.OK, GRPC.RESOURCE_EXHAUSTED]);
    const after = await ledger();
    expect(after.reduce((n, r) => n + r.bytes, 0)).toBeLessThanOrEqual(allocatable);
    const sizes = await Promise.all(
      ["pvc-race-a", "pvc-race-b"].map(async (n) => (await e.standIn.parts.get(n, e.ns))?.spec.sizeBytes),
    );
    // Only the winner's spec grew; the loser's stayed at what its entry holds.
    expect(sizes.sort()).toEqual([GiB, 2 * GiB]);
    await devices.mergePatch(dev.metadata.name, undefined, { spec: { allocatableBytes: 1024 ** 4 } });
  });
});
