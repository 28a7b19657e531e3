// Every RPC's bad inputs over the real plugin socket (grpc-js client), with no SNAP behind it: each
// is INVALID_ARGUMENT (ABORTED for a foreign page token) with a message naming the field, and none
// reaches SNAP. Also: Probe says "not ready" (not "unhealthy") while SNAP has never answered.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  AccessMode,
  type CreateDeviceRequestSchema,
  IdentityService,
  StoragePluginService,
} from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { silentLogger } from "../lib/log.ts";
import { VolumeContextKeys as K } from "../lib/volume-context.ts";
import { parseDpuConfig } from "./config.ts";
import { StorageParameterKeys as P } from "./devices/request.ts";
import { type RunningDpu, runDpu } from "./main.ts";
import { RecordingRpc } from "./testing.ts";

let root: string;
let plugin: RunningDpu;
let client: GrpcJsClient;
let recorder: RecordingRpc;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "dpu-unit-"));
  plugin = await runDpu(
    parseDpuConfig({
      DISTORT_DPU_SOCKET: join(root, "dpu.sock"),
      DISTORT_DPU_SNAP_SOCKET: join(root, "no-snap.sock"),
      DISTORT_DPU_HOST_NQN: "nqn.2014-08.org.nvmexpress:uuid:3b0c8a52-5d1e-4c7b-9a44-0d2f6e8b1c37",
      DISTORT_DPU_STATE_DIR: join(root, "state"),
      DISTORT_DPU_KEY_DIR: join(root, "keys"),
      DISTORT_DPU_MOUNT_ROOT: join(root, "mnt"),
      DISTORT_HEALTH_HOST: "127.0.0.1",
      DISTORT_HEALTH_PORT: "0",
      DISTORT_DPU_SHUTDOWN_GRACE_MS: "100",
    }),
    silentLogger,
    {
      kube: null,
      wrapSnapRpc: (rpc) => {
        recorder = new RecordingRpc(rpc);
        return recorder;
      },
    },
  );
  client = new GrpcJsClient(plugin.address);
});

afterAll(async () => {
  client.close();
  await plugin.stop();
  rmSync(root, { recursive: true, force: true });
});

async function status(p: Promise<unknown>): Promise<[number, string]> {
  try {
    await p;
    return [0, ""];
  } catch (err) {
    if (!(err instanceof GrpcCallError)) throw err;
    return [err.code, err.details];
  }
}

const CTX = {
  [K.nqn]: "nqn.2026-02.io.distort:pv-1",
  [K.portalIP]: "10.0.0.1",
  [K.portalPort]: "4420",
  [K.transport]: "tcp",
};
const good: MessageInitShape<
  typeof import("../gen/nvidia/storage/plugins/v1/plugin_pb.ts").CreateDeviceRequestSchema
> = {
  volumeId: "vol-1",
  accessModes: [AccessMode.RWO],
  volumeMode: "Block",
  volumeContext: CTX,
};
const INVALID = 3;
const ABORTED = 10;

describe("CreateDevice bad inputs", () => {
  const cases: [string, Omit<MessageInitShape<typeof CreateDeviceRequestSchema>, "$typeName">, string][] = [
    ["empty volume_id", { volumeId: "" }, "volume_id must not be empty"],
    ["oversized volume_id", { volumeId: "x".repeat(300) }, "over the 256-byte limit"],
    ["no access modes", { accessModes: [] }, "at least one access mode"],
    ["UNSPECIFIED access mode", { accessModes: [AccessMode.UNSPECIFIED] }, "ACCESS_MODE_UNSPECIFIED"],
    ["unknown access mode", { accessModes: [42 as AccessMode] }, "unknown access mode 42"],
    ["bad volume_mode", { volumeMode: "Raw" }, "volume_mode"],
    ["RWX filesystem", { volumeMode: "Filesystem", accessModes: [AccessMode.RWX] }, "RWX is not offered"],
    ["no volume context", { volumeContext: {} }, "is this a DISTORT volume"],
    ["malformed NQN", { volumeContext: { ...CTX, [K.nqn]: "not-an-nqn" } }, "nqn is not an NQN"],
    ["malformed portal", { volumeContext: { ...CTX, [K.portalIP]: "10.0.0" } }, "portalIP is not an IP"],
    ["bad port", { volumeContext: { ...CTX, [K.portalPort]: "-1" } }, "portalPort"],
    ["bad transport", { volumeContext: { ...CTX, [K.transport]: "RDMA" } }, "transport must be rdma or tcp"],
    ["bad number", { storageParameters: { [P.reconnectDelaySec]: "ten" } }, "whole number"],
    ["out-of-range number", { storageParameters: { [P.ctrlrLossTimeoutSec]: "-5" } }, "-1..2147483647"],
    [
      "inconsistent reconnect settings",
      { storageParameters: { [P.ctrlrLossTimeoutSec]: "3", [P.reconnectDelaySec]: "5" } },
      "must not exceed",
    ],
    [
      "unknown DISTORT parameter",
      { storageParameters: { "storage.distort.io/colour": "blue" } },
      "unknown storage parameter",
    ],
    [
      "half a Secret reference",
      { storageParameters: { [P.dhchapSecretName]: "chap" } },
      "needs storage.distort.io/dhchapSecretKey",
    ],
    ["bad published host NQN", { publishContext: { "storage.distort.io/hostNQN": "host-1" } }, "hostNQN"],
  ];
  for (const [name, over, message] of cases) {
    test(name, async () => {
      const [code, details] = await status(
        client.unary(StoragePluginService.method.createDevice, { ...good, ...over }),
      );
      expect(code).toBe(INVALID);
      expect(details).toContain(message);
    });
  }
});

describe("DeleteDevice, GetDevice, ListDevices bad inputs", () => {
  const refCases: [string, { volumeId: string; deviceName: string }, string][] = [
    ["empty volume_id", { volumeId: "", deviceName: "d" }, "volume_id must not be empty"],
    ["oversized volume_id", { volumeId: "é".repeat(200), deviceName: "d" }, "over the 256-byte limit"],
    ["empty device_name", { volumeId: "v", deviceName: "" }, "device_name must not be empty"],
    ["oversized device_name", { volumeId: "v", deviceName: "d".repeat(300) }, "device_name is 300 bytes"],
    ["control characters", { volumeId: "v\u0007", deviceName: "d" }, "control characters"],
  ];
  for (const [name, req, message] of refCases) {
    test(`DeleteDevice: ${name}`, async () => {
      const [code, details] = await status(client.unary(StoragePluginService.method.deleteDevice, req));
      expect([code, details.includes(message)]).toEqual([INVALID, true]);
    });
    test(`GetDevice: ${name}`, async () => {
      const [code, details] = await status(client.unary(StoragePluginService.method.getDevice, req));
      expect([code, details.includes(message)]).toEqual([INVALID, true]);
    });
  }
  test("ListDevices: negative max_entries, a foreign token", async () => {
    expect((await status(client.unary(StoragePluginService.method.listDevices, { maxEntries: -1 })))[0]).toBe(
      INVALID,
    );
    const [code, details] = await status(
      client.unary(StoragePluginService.method.listDevices, {
        maxEntries: 1,
        startingToken: "c29tZW9uZS1lbHNl",
      }),
    );
    expect(code).toBe(ABORTED);
    expect(details).toContain("was not issued by this plugin");
  });
  test("GetDevice of a device that does not exist is NOT_FOUND; an empty list has no token", async () => {
    expect(
      (
        await status(client.unary(StoragePluginService.method.getDevice, { volumeId: "v", deviceName: "d" }))
      )[0],
    ).toBe(5);
    expect(await client.unary(StoragePluginService.method.listDevices, { maxEntries: 10 })).toMatchObject({
      entries: [],
      nextToken: "",
    });
  });
});

test("no bad request reached SNAP", () => {
  expect(recorder.calls.filter((c) => c.method !== "spdk_get_version")).toEqual([]);
});

test("Probe: healthy but not ready while SNAP has never answered", async () => {
  expect(plugin.readiness.initialised).toBe(false);
  const r = await client.unary(IdentityService.method.probe, {});
  expect(r.ready).toBe(false);
  const info = await client.unary(IdentityService.method.getPluginInfo, {});
  expect(info.name).toBe("storage.distort.io");
  expect(info.manifest.pluginName).toBe("distort");
});
