// QoS through CSI on the real stack (control plane, manager, agent over an emulated nvmf_tgt, the
// CSI controller as its chart ServiceAccount): StorageClass and VolumeAttributesClass limits at
// CreateVolume, ControllerModifyVolume changing them online, each checked on the target itself
// (bdev_get_bdevs assigned_rate_limits), and the refusals.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { kinds, type NVMePartition } from "../api/index.ts";
import { Controller, VolumeCapability_AccessMode_Mode as Mode } from "../gen/csi/v1/csi_pb.ts";
import { type TestCluster, testCluster } from "../lab/cluster/test-support.ts";
import { type Stack, startStack } from "../lab/harness/stack.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger, silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { parseVolumeId } from "./controller/volume-id.ts";

const GiB = 1024 ** 3;
const run = randomBytes(3).toString("hex");
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;

let tc: TestCluster;
let stack: Stack;
let client: GrpcJsClient;
let spdk: SpdkClient;
let m: SpdkMethods;
let parts: ResourceClient<NVMePartition>;

beforeAll(async () => {
  tc = await testCluster();
  stack = await startStack({
    kubeconfigPath: tc.kubeconfigPath,
    storageNodes: [
      {
        name: `qos-${run}-s1`,
        drives: [{ serial: `QOS${run}01`.toUpperCase(), pciAddress: "0000:3b:00.0", sizeBytes: 4 * GiB }],
      },
    ],
    consumerNodes: [`qos-${run}-w1`],
    csiAllInOne: true,
    namespace: `qos-${run}`,
    logger: createLogger({ level: "error" }),
    fast: true,
  });
  const address = stack.csiController?.address;
  if (!address) throw new Error("the stack serves no CSI controller");
  client = new GrpcJsClient(address);
  spdk = new SpdkClient({ socketPath: stack.storage[0]?.spdkSocket as string, logger: silentLogger });
  m = new SpdkMethods(spdk);
  parts = new ResourceClient(stack.conn, kinds.NVMePartition);
}, 300_000);

afterAll(async () => {
  client?.close();
  await spdk?.close();
  await stack?.stop();
  await tc?.stop();
});

const blockCap = {
  accessType: { case: "block" as const, value: {} },
  accessMode: { mode: Mode.SINGLE_NODE_WRITER },
};

async function create(name: string, parameters: Record<string, string>, mutableParameters = {}) {
  const r = await client.unary(Controller.method.createVolume, {
    name,
    volumeCapabilities: [blockCap],
    capacityRange: { requiredBytes: BigInt(64 * 1024 * 1024) },
    parameters: { transport: "tcp", ...parameters },
    mutableParameters,
  });
  return r.volume?.volumeId as string;
}

/** The partition behind a volume id, and the limits its bdev has on the target now. */
async function observe(volumeId: string): Promise<{ p: NVMePartition; target: unknown }> {
  const ref = parseVolumeId(volumeId);
  const p = (await parts.get(ref?.name as string, ref?.namespace)) as NVMePartition;
  const [b] = await m.bdevGetBdevs({ name: p.status?.backendPath as string });
  return { p, target: b?.assigned_rate_limits };
}

async function code(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
    return { code: 0, details: "" };
  } catch (err) {
    if (err instanceof GrpcCallError) return { code: err.code, details: err.details };
    throw err;
  }
}

test("ControllerGetCapabilities advertises MODIFY_VOLUME", async () => {
  const caps = await client.unary(Controller.method.controllerGetCapabilities, {});
  const types = caps.capabilities.map((c) => (c.type.case === "rpc" ? c.type.value.type : -1));
  // ControllerServiceCapability.RPC.Type MODIFY_VOLUME = 14.
  expect(types).toContain(14);
});

test("StorageClass limits with VolumeAttributesClass limits on top are on the target when CreateVolume answers", async () => {
  const id = await create(`qos-a-${run}`, { "qos.rwIops": "2000", "qos.rMBps": "80" }, { "qos.rMBps": "50" });
  const { p, target } = await observe(id);
  expect(p.spec.qos).toEqual({ rwIosPerSec: 2000, rMBytesPerSec: 50 });
  expect(p.status?.qos).toEqual({
    rwIosPerSec: 2000,
    rwMBytesPerSec: 0,
    rMBytesPerSec: 50,
    wMBytesPerSec: 0,
  });
  expect(target).toEqual({
    rw_ios_per_sec: 2000,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 50,
    w_mbytes_per_sec: 0,
  });
}, 60_000);

test("ControllerModifyVolume changes the named limits online, keeps the others, answers once they are enforced; repeating it is idempotent", async () => {
  const id = await create(`qos-b-${run}`, { "qos.rwIops": "3000" });
  const res = await client.unary(Controller.method.controllerModifyVolume, {
    volumeId: id,
    mutableParameters: { "qos.wMBps": "25", "qos.rwMBps": "100" },
  });
  expect(res).toBeDefined();
  // No wait here: the answer means the target enforces them already.
  const after = await observe(id);
  expect(after.target).toEqual({
    rw_ios_per_sec: 3000,
    rw_mbytes_per_sec: 100,
    r_mbytes_per_sec: 0,
    w_mbytes_per_sec: 25,
  });
  expect(after.p.status?.qos).toEqual({
    rwIosPerSec: 3000,
    rwMBytesPerSec: 100,
    rMBytesPerSec: 0,
    wMBytesPerSec: 25,
  });
  const generation = after.p.metadata.generation;
  await client.unary(Controller.method.controllerModifyVolume, {
    volumeId: id,
    mutableParameters: { "qos.wMBps": "25" },
  });
  expect((await observe(id)).p.metadata.generation).toBe(generation);
  // 0 lifts a limit.
  await client.unary(Controller.method.controllerModifyVolume, {
    volumeId: id,
    mutableParameters: { "qos.rwIops": "0" },
  });
  expect((await observe(id)).target).toEqual({
    rw_ios_per_sec: 0,
    rw_mbytes_per_sec: 100,
    r_mbytes_per_sec: 0,
    w_mbytes_per_sec: 25,
  });
}, 60_000);

test("bad limits, unknown keys, unknown volumes and limits on the kernel backend are refused with the reason", async () => {
  const id = await create(`qos-c-${run}`, {});
  const modify = (mutableParameters: Record<string, string>, volumeId = id) =>
    code(client.unary(Controller.method.controllerModifyVolume, { volumeId, mutableParameters }));
  const notMultiple = await modify({ "qos.rwIops": "1500" });
  expect(notMultiple.code).toBe(INVALID_ARGUMENT);
  expect(notMultiple.details).toContain("multiple of 1000");
  expect((await modify({ "qos.rMBps": "1.5" })).code).toBe(INVALID_ARGUMENT);
  expect((await modify({ iops: "1000" })).details).toContain("unknown key");
  expect((await modify({})).code).toBe(INVALID_ARGUMENT);
  expect((await modify({ "qos.rMBps": "10" }, "")).code).toBe(INVALID_ARGUMENT);
  expect(
    (await modify({ "qos.rMBps": "10" }, `${stack.namespace}/nope/0f8fad5b-d9cb-469f-a165-70867728950e`))
      .code,
  ).toBe(NOT_FOUND);
  // Nothing of that reached the volume.
  const { p, target } = await observe(id);
  expect(p.spec.qos).toBeUndefined();
  expect(target).toEqual({
    rw_ios_per_sec: 0,
    rw_mbytes_per_sec: 0,
    r_mbytes_per_sec: 0,
    w_mbytes_per_sec: 0,
  });
  const kernel = await code(
    client.unary(Controller.method.createVolume, {
      name: `qos-k-${run}`,
      volumeCapabilities: [blockCap],
      parameters: { backend: "kernel", "qos.wMBps": "10" },
    }),
  );
  expect(kernel.code).toBe(INVALID_ARGUMENT);
  expect(kernel.details).toContain("no per-namespace rate limits");
  const bad = await code(create(`qos-d-${run}`, {}, { "qos.rwIops": "999" }));
  expect(bad.code).toBe(INVALID_ARGUMENT);
}, 60_000);
