// lib/grpc/server.ts over real UNIX sockets with a @grpc/grpc-js client (same HTTP/2 gRPC wire as
// Go): codes and messages, UNIMPLEMENTED, deadlines, large and concurrent calls, socket ownership,
// graceful and forced shutdown, and secret redaction in the request log.

import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { Controller, Identity as CsiIdentity, SnapshotMetadata } from "../../gen/csi/v1/csi_pb";
import { IdentityService, StoragePluginService } from "../../gen/nvidia/storage/plugins/v1/plugin_pb";
import { StorageError } from "../errors";
import { createLogger, silentLogger } from "../log";
import { Registry } from "../metrics";
import { callMetrics } from "./call-metrics";
import { GrpcCallError, GrpcJsClient } from "./grpc-js-client";
import { type GrpcServer, register, serveGrpc } from "./server";

const root = await mkdtemp(join(tmpdir(), "distort-grpc-test-"));
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await rm(root, { recursive: true, force: true });
});

let n = 0;
const sockPath = () => join(root, `s${n++}`, "plugin.sock");

/** Resolves after `ms`, or rejects with the signal's reason once it aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason);
    });
  });
}

async function start(
  services: Parameters<typeof serveGrpc>[0]["services"],
  extra: Partial<Parameters<typeof serveGrpc>[0]> = {},
): Promise<{ server: GrpcServer; client: GrpcJsClient; socketPath: string }> {
  const socketPath = sockPath();
  const server = await serveGrpc({
    socketPath,
    services,
    logger: silentLogger,
    shutdownGraceMs: 1000,
    ...extra,
  });
  const client = new GrpcJsClient(server.address);
  cleanups.push(
    () => client.close(),
    () => server.close(),
  );
  return { server, client, socketPath };
}

async function failure(p: Promise<unknown>): Promise<GrpcCallError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof GrpcCallError)) throw new Error(`expected a gRPC error, got ${String(err)}`);
  return err;
}

const dpfIdentity = register(IdentityService, {
  getPluginInfo: () => ({ name: "distort.nvidia.storage", vendorVersion: "0.1.0", manifest: { k: "v" } }),
  probe: () => ({ ready: false }),
});

describe("a DPF IdentityService over a unix socket", async () => {
  const { client, socketPath } = await start([
    dpfIdentity,
    register(StoragePluginService, {
      getDevice: (req) => {
        throw new StorageError("not-found", `device ${req.deviceName} not found`);
      },
      deleteDevice: () => {
        throw new ConnectError("chosen by handler", Code.PermissionDenied);
      },
      listDevices: () => {
        throw new Error("boom");
      },
      createDevice: (req) => ({ deviceName: req.volumeContext.blob ?? req.volumeId }),
      getSNAPProvider: async (_req, ctx) => {
        await sleep(5000, ctx.signal);
        return {};
      },
    }),
  ]);

  test("answers unary calls", async () => {
    const info = await client.unary(IdentityService.method.getPluginInfo, {});
    expect(info).toMatchObject({
      name: "distort.nvidia.storage",
      vendorVersion: "0.1.0",
      manifest: { k: "v" },
    });
    // BoolValue: false must arrive as a present false, not as unset.
    expect((await client.unary(IdentityService.method.probe, {})).ready).toBe(false);
  });

  test("the socket is 0660", async () => {
    expect((await stat(socketPath)).mode & 0o777).toBe(0o660);
  });

  test("StorageError, ConnectError and plain errors map to codes with their messages", async () => {
    const nf = await failure(client.unary(StoragePluginService.method.getDevice, { deviceName: "d1" }));
    expect([nf.code, nf.details]).toEqual([Code.NotFound, "device d1 not found"]);
    const pd = await failure(client.unary(StoragePluginService.method.deleteDevice, {}));
    expect([pd.code, pd.details]).toEqual([Code.PermissionDenied, "chosen by handler"]);
    const internal = await failure(client.unary(StoragePluginService.method.listDevices, {}));
    expect([internal.code, internal.details]).toEqual([Code.Internal, "boom"]);
  });

  test("methods left out of the impl, and unregistered services, answer UNIMPLEMENTED", async () => {
    const missing = await failure(client.unary(StoragePluginService.method.storagePluginGetCapabilities, {}));
    expect(missing.code).toBe(Code.Unimplemented);
    expect(missing.details).toContain("StoragePluginGetCapabilities");
    const unregistered = await failure(client.unary(CsiIdentity.method.getPluginInfo, {}));
    expect(unregistered.code).toBe(Code.Unimplemented);
  });

  test("a deadline ends the call with DEADLINE_EXCEEDED", async () => {
    const started = performance.now();
    const err = await failure(
      client.unary(StoragePluginService.method.getSNAPProvider, {}, { timeoutMs: 50 }),
    );
    expect(err.code).toBe(Code.DeadlineExceeded);
    expect(performance.now() - started).toBeLessThan(1000);
  });

  test("1 MiB request and response bodies", async () => {
    const blob = "x".repeat(1 << 20);
    const res = await client.unary(StoragePluginService.method.createDevice, {
      volumeId: "v",
      volumeContext: { blob },
    });
    expect(res.deviceName.length).toBe(1 << 20);
  });

  test("concurrent calls on one connection", async () => {
    const names = await Promise.all(
      Array.from({ length: 64 }, (_, i) =>
        client
          .unary(StoragePluginService.method.createDevice, { volumeId: `v${i}` })
          .then((r) => r.deviceName),
      ),
    );
    expect(names).toEqual(Array.from({ length: 64 }, (_, i) => `v${i}`));
  });
});

test("server-streaming methods stream every response", async () => {
  const { client } = await start([
    register(SnapshotMetadata, {
      async *getMetadataAllocated(req) {
        for (let i = 0; i < 3; i++) yield { volumeCapacityBytes: BigInt(i), blockMetadata: [] };
        if (req.snapshotId === "fail") throw new StorageError("not-found", "no snapshot");
      },
    }),
  ]);
  const got = await client.serverStream(SnapshotMetadata.method.getMetadataAllocated, { snapshotId: "s" });
  expect(got.map((r) => r.volumeCapacityBytes)).toEqual([0n, 1n, 2n]);
  const err = await failure(
    client.serverStream(SnapshotMetadata.method.getMetadataAllocated, { snapshotId: "fail" }),
  );
  expect([err.code, err.details]).toEqual([Code.NotFound, "no snapshot"]);
});

describe("socket ownership", () => {
  test("refuses to start while another server answers on the path", async () => {
    const { client, socketPath } = await start([dpfIdentity]);
    const second = serveGrpc({ socketPath, services: [dpfIdentity], logger: silentLogger });
    await expect(second).rejects.toThrow("already serving");
    // The first server is unharmed.
    expect((await client.unary(IdentityService.method.getPluginInfo, {})).name).toBe(
      "distort.nvidia.storage",
    );
  });

  test("replaces a socket left behind by a killed server", async () => {
    const socketPath = sockPath();
    await mkdir(dirname(socketPath), { recursive: true });
    const script = `require("node:net").createServer().listen(${JSON.stringify(socketPath)}, () => process.kill(process.pid, "SIGKILL"))`;
    await Bun.spawn([process.execPath, "-e", script]).exited;
    expect((await stat(socketPath)).isSocket()).toBe(true);
    const server = await serveGrpc({ socketPath, services: [dpfIdentity], logger: silentLogger });
    const client = new GrpcJsClient(server.address);
    cleanups.push(
      () => client.close(),
      () => server.close(),
    );
    expect((await client.unary(IdentityService.method.getPluginInfo, {})).name).toBe(
      "distort.nvidia.storage",
    );
  });
});

describe("shutdown", () => {
  function slowPlugin(onAbort: (reason: unknown) => void) {
    return register(StoragePluginService, {
      deleteDevice: async (req, ctx) => {
        try {
          await sleep(Number(req.volumeId), ctx.signal);
        } catch (e) {
          onAbort(e);
          throw e;
        }
        return {};
      },
    });
  }

  test("graceful: the in-flight call finishes, new calls are refused, the socket goes away", async () => {
    const { server, client, socketPath } = await start([slowPlugin(() => {})], { shutdownGraceMs: 2000 });
    const inflight = client.unary(StoragePluginService.method.deleteDevice, { volumeId: "150" });
    await Bun.sleep(30);
    const started = performance.now();
    const closed = server.close();
    expect(server.close()).toBe(closed);
    await Bun.sleep(10);
    const late = new GrpcJsClient(server.address);
    const refused = await failure(late.unary(IdentityService.method.probe, {}, { timeoutMs: 200 }));
    late.close();
    expect(refused.code).toBe(Code.Unavailable);
    await expect(inflight).resolves.toBeDefined();
    await closed;
    const took = performance.now() - started;
    expect(took).toBeGreaterThan(80);
    expect(took).toBeLessThan(1000);
    expect(existsSync(socketPath)).toBe(false);
  });

  test("forced after the grace period: handlers are aborted and the client gets UNAVAILABLE", async () => {
    let reason: unknown;
    const { server, client } = await start([slowPlugin((r) => (reason = r))], { shutdownGraceMs: 100 });
    const inflight = failure(client.unary(StoragePluginService.method.deleteDevice, { volumeId: "10000" }));
    await Bun.sleep(30);
    const started = performance.now();
    await server.close();
    expect(performance.now() - started).toBeLessThan(600);
    expect(reason).toBeInstanceOf(ConnectError);
    expect((reason as ConnectError).code).toBe(Code.Unavailable);
    expect((await inflight).code).toBe(Code.Unavailable);
  });
});

test("the request log carries method, code and duration, and never CSI secrets", async () => {
  const lines: string[] = [];
  const logger = createLogger({ level: "debug", sink: (l) => lines.push(l) });
  const { client } = await start(
    [
      register(Controller, {
        createVolume: () => {
          throw new StorageError("exhausted", "no capacity");
        },
      }),
    ],
    { logger },
  );
  const secret = "s3cr3t-dhchap-key";
  const err = await failure(
    client.unary(Controller.method.createVolume, {
      name: "pvc-1",
      parameters: { fsType: "xfs" },
      secrets: { password: secret, "dhchap-key": secret },
    }),
  );
  expect(err.code).toBe(Code.ResourceExhausted);
  await failure(client.unary(Controller.method.deleteVolume, { volumeId: "v1", secrets: { token: secret } }));

  expect(lines.join("\n")).not.toContain(secret);
  const calls = lines.map((l) => JSON.parse(l)).filter((r) => r.msg === "grpc call");
  expect(calls).toHaveLength(2);
  expect(calls[0]).toMatchObject({
    level: "warn",
    method: "/csi.v1.Controller/CreateVolume",
    code: "RESOURCE_EXHAUSTED",
    error: "no capacity",
    request: { name: "pvc-1", parameters: { fsType: "xfs" }, secrets: "<redacted>" },
  });
  expect(typeof calls[0].durationMs).toBe("number");
  expect(calls[1]).toMatchObject({ method: "/csi.v1.Controller/DeleteVolume", code: "UNIMPLEMENTED" });
  expect(calls[1].request.secrets).toBe("<redacted>");
});

test("call metrics count a server-streaming call when its stream ends, with the code it ends with", async () => {
  const registry = new Registry();
  const measure = callMetrics(registry, "t", "test");
  const { client } = await start([
    register(
      SnapshotMetadata,
      measure({
        async *getMetadataAllocated(req: { snapshotId: string }) {
          yield { volumeCapacityBytes: 1n, blockMetadata: [] };
          if (req.snapshotId === "fail") throw new StorageError("not-found", "no snapshot");
          yield { volumeCapacityBytes: 2n, blockMetadata: [] };
        },
      }),
    ),
  ]);
  const got = await client.serverStream(SnapshotMetadata.method.getMetadataAllocated, { snapshotId: "s" });
  expect(got.map((r) => r.volumeCapacityBytes)).toEqual([1n, 2n]);
  const err = await failure(
    client.serverStream(SnapshotMetadata.method.getMetadataAllocated, { snapshotId: "fail" }),
  );
  expect(err.code).toBe(Code.NotFound);
  const text = registry.render();
  expect(text).toContain('t_calls_total{method="getMetadataAllocated",code="OK"} 1');
  expect(text).toContain('t_calls_total{method="getMetadataAllocated",code="NOT_FOUND"} 1');
});
