// Compares two ways of serving Connect-typed services over gRPC on a unix socket under Bun:
// (a) lib/grpc (an adapter onto @grpc/grpc-js's Server), (b) connect-node's adapter on node:http2.
// Run: bun bench/grpc-transport.bench.ts   (each server in its own child process; results in docs/grpc-transport.md)

import { mkdtemp, rm } from "node:fs/promises";
import * as http2 from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError, type MethodImplSpec } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Identity } from "../gen/csi/v1/csi_pb";
import { StoragePluginService } from "../gen/nvidia/storage/plugins/v1/plugin_pb";
import { buildGoProbe, runGoProbe } from "../lab/grpc-probe/probe.ts";
import { StorageError } from "../lib/errors";
import { GrpcCallError, GrpcJsClient } from "../lib/grpc/grpc-js-client";
import { instrumentService, register, type ServiceRegistration } from "../lib/grpc/instrument";
import { serveGrpc } from "../lib/grpc/server";
import { prepareSocketPath, restrictSocket } from "../lib/grpc/socket";
import { type Logger, silentLogger } from "../lib/log";
import { type Figure, writeResult } from "./report.ts";

interface Served {
  address: string;
  close(): Promise<void>;
}
interface ServeOpts {
  socketPath: string;
  services: ServiceRegistration[];
  logger: Logger;
  shutdownGraceMs: number;
}

const MAX_BYTES = 16 << 20;

/** (a) the production server: lib/grpc/server.ts (grpc-js Server + protobuf-es adapter). */
function serveGrpcJs(opts: ServeOpts): Promise<Served> {
  return serveGrpc({ ...opts, maxMessageBytes: MAX_BYTES });
}

/**
 * (b) the candidate that lost, kept here only so the comparison can be rerun: connect-node's
 * adapter on node:http2. Its close() mirrors the production semantics (GOAWAY, grace, force).
 */
async function serveConnectNode(opts: ServeOpts): Promise<Served> {
  await prepareSocketPath(opts.socketPath);
  const shutdown = new AbortController();
  const handler = connectNodeAdapter({
    grpc: true,
    connect: false,
    grpcWeb: false,
    readMaxBytes: MAX_BYTES,
    writeMaxBytes: MAX_BYTES,
    shutdownSignal: shutdown.signal,
    routes: (router) => {
      for (const reg of opts.services) {
        const spec = instrumentService(reg, { logger: opts.logger });
        for (const m of Object.values(spec.methods) as MethodImplSpec[])
          router.rpc(m.method, m.impl as never);
      }
    },
  });
  const server = http2.createServer({}, handler);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.socketPath, () => resolve());
  });
  await restrictSocket(opts.socketPath);
  let closing: Promise<void> | undefined;
  return {
    address: `unix://${opts.socketPath}`,
    close() {
      closing ??= new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          shutdown.abort(new ConnectError("server shutting down", Code.Unavailable));
          setTimeout(() => {
            for (const s of sessions) s.destroy();
          }, 100);
        }, opts.shutdownGraceMs);
        server.close(() => {
          clearTimeout(timer);
          resolve();
        });
        for (const s of sessions) s.close();
      });
      return closing;
    },
  };
}

const TRANSPORTS = { "grpc-js": serveGrpcJs, "connect-node": serveConnectNode } as const;
type Transport = keyof typeof TRANSPORTS;

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

/**
 * The services every transport serves: a trivial unary (GetPluginInfo), an echo for large bodies
 * (CreateDevice), a failing call (GetDevice), a slow call that honours ctx.signal (DeleteDevice
 * sleeps volume_id ms). Controller is deliberately not registered.
 */
function benchServices(): ServiceRegistration[] {
  return [
    register(Identity, {
      getPluginInfo: () => ({ name: "bench.distort.io", vendorVersion: "0.0.0", manifest: { a: "b" } }),
      probe: () => ({ ready: true }),
    }),
    register(StoragePluginService, {
      createDevice: (req) => ({ deviceName: req.volumeContext.blob ?? req.volumeId }),
      getDevice: () => {
        throw new StorageError("not-found", "no such device");
      },
      deleteDevice: async (req, ctx) => {
        await sleep(Number(req.volumeId), ctx.signal);
        return {};
      },
    }),
  ];
}

/**
 * Behaviour checks, in-process, each answering "what did the client see". Includes the Go probe
 * when it builds (lab/grpc-probe/probe.ts), since kubelet and the sidecars are Go.
 */
async function correctness(
  transport: Transport,
  goProbe: string | undefined,
): Promise<Record<string, string>> {
  const dir = await mkdtemp(join(tmpdir(), "distort-grpc-check-"));
  const out: Record<string, string> = {};
  const seen = (p: Promise<unknown>, render: (v: unknown) => string = () => "OK") =>
    p.then(render, (e: unknown) =>
      e instanceof GrpcCallError ? `${Code[e.code]}: ${e.details}` : String(e),
    );
  try {
    const srv = await TRANSPORTS[transport]({
      socketPath: join(dir, "s.sock"),
      services: benchServices(),
      logger: silentLogger,
      shutdownGraceMs: 300,
    });
    const c = new GrpcJsClient(srv.address);
    out.unary = await seen(c.unary(Identity.method.getPluginInfo, {}), (r) => (r as { name: string }).name);
    out.errorStatus = await seen(c.unary(StoragePluginService.method.getDevice, {}));
    out.unimplementedMethod = await seen(c.unary(StoragePluginService.method.listDevices, {}));
    let t0 = performance.now();
    out.deadline100ms = `${await seen(c.unary(StoragePluginService.method.deleteDevice, { volumeId: "2000" }, { timeoutMs: 100 }))} after ${Math.round(performance.now() - t0)} ms`;
    const blob = "x".repeat(1 << 20);
    out.echo1MiB = await seen(
      c.unary(StoragePluginService.method.createDevice, { volumeId: "v", volumeContext: { blob } }),
      (r) => `${(r as { deviceName: string }).deviceName.length} bytes`,
    );
    t0 = performance.now();
    const many = await Promise.all(
      Array.from({ length: 64 }, () =>
        seen(c.unary(StoragePluginService.method.deleteDevice, { volumeId: "50" })),
      ),
    );
    out.concurrent64x50ms = `${many.filter((r) => r === "OK").length}/64 OK in ${Math.round(performance.now() - t0)} ms`;
    if (goProbe !== undefined) {
      const res = await runGoProbe(goProbe, srv.address);
      out.goUnary = `${res.getPluginInfo.code} ${JSON.stringify(res.getPluginInfo.response?.name)}`;
      out.goUnknownService = `${res.failing.code}: ${res.failing.message?.split("\n")[0]}`;
    }
    // Graceful: a 150 ms call in flight when close() starts must finish.
    const inflight = seen(c.unary(StoragePluginService.method.deleteDevice, { volumeId: "150" }));
    await Bun.sleep(20);
    t0 = performance.now();
    await srv.close();
    out.gracefulInflight = `${await inflight}, close took ${Math.round(performance.now() - t0)} ms`;
    c.close();
    // Forced: a 10 s call, 300 ms grace.
    const srv2 = await TRANSPORTS[transport]({
      socketPath: join(dir, "s2.sock"),
      services: benchServices(),
      logger: silentLogger,
      shutdownGraceMs: 300,
    });
    const c2 = new GrpcJsClient(srv2.address);
    const stuck = seen(c2.unary(StoragePluginService.method.deleteDevice, { volumeId: "10000" }));
    await Bun.sleep(20);
    t0 = performance.now();
    await srv2.close();
    out.forcedInflight = `${await stuck}, close took ${Math.round(performance.now() - t0)} ms`;
    c2.close();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  return out;
}

/** Child mode: serve, print "ready", answer "mem" with memoryUsage JSON, exit on "close". */
async function child(transport: Transport, socketPath: string): Promise<void> {
  const srv = await TRANSPORTS[transport]({
    socketPath,
    services: benchServices(),
    logger: silentLogger,
    shutdownGraceMs: 2000,
  });
  console.log("ready");
  for await (const line of console) {
    if (line === "mem") {
      Bun.gc(true);
      console.log(JSON.stringify(process.memoryUsage()));
    } else if (line === "close") {
      await srv.close();
      process.exit(0);
    }
  }
}

interface Figures {
  seqCallsPerSec: number;
  seqP50Ms: number;
  seqP99Ms: number;
  concCallsPerSec: number;
  concP50Ms: number;
  concP99Ms: number;
  large1MiBRoundTripMs: number;
  rssIdleMiB: number;
  rssAfterMiB: number;
}

const pct = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))] ?? 0;
const r2 = (n: number) => Math.round(n * 100) / 100;

async function measure(transport: Transport, calls: number, concurrency: number): Promise<Figures> {
  const dir = await mkdtemp(join(tmpdir(), "distort-grpc-bench-"));
  const socketPath = join(dir, "bench.sock");
  const proc = Bun.spawn([process.execPath, import.meta.path, "serve", transport, socketPath], {
    stdin: "pipe",
    stdout: "pipe",
    stderr: "inherit",
  });
  const reader = proc.stdout.getReader();
  let buffered = "";
  const readLine = async (): Promise<string> => {
    for (;;) {
      const nl = buffered.indexOf("\n");
      if (nl >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        return line;
      }
      const { value, done } = await reader.read();
      if (done) throw new Error(`${transport} server exited early`);
      buffered += new TextDecoder().decode(value);
    }
  };
  const rssMiB = async () => {
    proc.stdin.write("mem\n");
    return JSON.parse(await readLine()).rss / 2 ** 20;
  };
  try {
    if ((await readLine()) !== "ready") throw new Error(`${transport} server did not start`);
    const rssIdle = await rssMiB();
    const client = new GrpcJsClient(`unix://${socketPath}`);
    const call = () => client.unary(Identity.method.getPluginInfo, {});
    for (let i = 0; i < 200; i++) await call(); // warm-up: JIT, HTTP/2 connection

    const seq: number[] = [];
    let t0 = performance.now();
    for (let i = 0; i < calls; i++) {
      const s = performance.now();
      await call();
      seq.push(performance.now() - s);
    }
    const seqSecs = (performance.now() - t0) / 1000;

    const conc: number[] = [];
    let next = 0;
    t0 = performance.now();
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < calls) {
          next++;
          const s = performance.now();
          await call();
          conc.push(performance.now() - s);
        }
      }),
    );
    const concSecs = (performance.now() - t0) / 1000;

    const blob = "x".repeat(1 << 20);
    const large: number[] = [];
    for (let i = 0; i < 20; i++) {
      const s = performance.now();
      const res = await client.unary(StoragePluginService.method.createDevice, {
        volumeId: "v",
        volumeContext: { blob },
      });
      if (res.deviceName.length !== blob.length) throw new Error("large echo mismatch");
      large.push(performance.now() - s);
    }
    const rssAfter = await rssMiB();
    client.close();
    seq.sort((a, b) => a - b);
    conc.sort((a, b) => a - b);
    large.sort((a, b) => a - b);
    return {
      seqCallsPerSec: Math.round(calls / seqSecs),
      seqP50Ms: r2(pct(seq, 0.5)),
      seqP99Ms: r2(pct(seq, 0.99)),
      concCallsPerSec: Math.round(calls / concSecs),
      concP50Ms: r2(pct(conc, 0.5)),
      concP99Ms: r2(pct(conc, 0.99)),
      large1MiBRoundTripMs: r2(pct(large, 0.5)),
      rssIdleMiB: r2(rssIdle),
      rssAfterMiB: r2(rssAfter),
    };
  } finally {
    proc.stdin.write("close\n");
    await Promise.race([proc.exited, Bun.sleep(5000)]);
    proc.kill();
    await rm(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  let goProbe: string | undefined;
  try {
    goProbe = await buildGoProbe();
  } catch (e) {
    console.log(`(Go probe unavailable, skipping Go checks: ${e instanceof Error ? e.message : String(e)})`);
  }
  const checks: Record<string, Record<string, string>> = {};
  for (const t of Object.keys(TRANSPORTS) as Transport[]) checks[t] = await correctness(t, goProbe);
  console.log("behaviour (what a grpc-js client, and the Go probe, saw):");
  for (const [t, r] of Object.entries(checks)) {
    console.log(`  ${t}:`);
    for (const [k, v] of Object.entries(r)) console.log(`    ${k.padEnd(20)} ${v}`);
  }

  const calls = 2000;
  const concurrency = 32;
  const results: Record<string, Figures> = {};
  for (const t of Object.keys(TRANSPORTS) as Transport[]) results[t] = await measure(t, calls, concurrency);
  console.log(
    `grpc transport bench on Bun ${Bun.version}: ${calls} unary calls, grpc-js client over a unix socket`,
  );
  console.table(results);
  // Yardstick: (a) grpc-js, measured in the same run; ratios > 1 mean connect-node is larger.
  const a = results["grpc-js"]!;
  const b = results["connect-node"]!;
  const ratios: Record<string, number> = {};
  for (const k of Object.keys(a) as (keyof Figures)[]) ratios[k] = r2(b[k] / a[k]);
  console.log("connect-node / grpc-js:");
  console.table(ratios);

  // The runner's protocol: production (grpc-js) as the value, the candidate as the yardstick.
  const fig = (id: keyof Figures, label: string, unit: string, better: Figure["better"]): Figure => ({
    id,
    label,
    value: a[id],
    unit,
    better,
    yardstick: { label: "connect-node on node:http2", value: b[id], unit },
    ratio: a[id] / b[id],
    ratioLabel: "grpc-js / connect-node",
  });
  writeResult({
    bench: "grpc-transport",
    figures: [
      fig("seqCallsPerSec", "lib/grpc (grpc-js): sequential unary calls", "calls/s", "higher"),
      fig(
        "concCallsPerSec",
        `lib/grpc (grpc-js): ${concurrency} concurrent unary calls`,
        "calls/s",
        "higher",
      ),
      fig("concP99Ms", `lib/grpc (grpc-js): p99 latency, ${concurrency} concurrent`, "ms", "lower"),
      fig("large1MiBRoundTripMs", "lib/grpc (grpc-js): 1 MiB echo round trip (p50)", "ms", "lower"),
      fig("rssAfterMiB", "lib/grpc (grpc-js): server RSS after the run", "MiB", "lower"),
    ],
    notes: [
      `${calls} unary calls per mode from a grpc-js client over a unix socket, each server in its own child process, Bun ${Bun.version}.`,
      ...Object.entries(checks).map(
        ([t, r]) =>
          `behaviour, ${t}: ${Object.entries(r)
            .map(([k, v]) => `${k}=${v}`)
            .join("; ")}`,
      ),
    ],
  });
}

if (import.meta.main) {
  const [mode, transport, socketPath] = process.argv.slice(2);
  if (mode === "serve" && transport !== undefined && socketPath !== undefined && transport in TRANSPORTS) {
    await child(transport as Transport, socketPath);
  } else {
    await main();
  }
}
