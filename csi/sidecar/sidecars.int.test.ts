// distort-csi's sidecar modes over real sockets. The registrar runs as a process against a CSI
// Identity server built from csi/identity.ts; the test dials its -reg.sock as kubelet's plugin
// watcher does (GetInfo, NotifyRegistrationStatus) and checks /healthz and the exit codes. The
// liveness probe's /healthz is checked against ready, not-ready, hanging and missing drivers.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { lstat, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Identity } from "../../gen/csi/v1/csi_pb.ts";
import { Registration } from "../../gen/pluginregistration/v1/api_pb.ts";
import { eventually } from "../../lab/cluster/test-support.ts";
import { GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import { type GrpcServer, register, serveGrpc } from "../../lib/grpc/server.ts";
import { silentLogger } from "../../lib/log.ts";
import { DRIVER_NAME } from "../../lib/volume-context.ts";
import { createIdentityService } from "../identity.ts";
import { parseLivenessConfig } from "./config.ts";
import { runLiveness } from "./liveness.ts";

const MAIN = join(import.meta.dir, "..", "main.ts");
const BUN = process.execPath;
const KUBELET_ENDPOINT = "/var/lib/kubelet/plugins/storage.distort.io/csi.sock";

let root: string;
let seq = 0;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "distort-sidecars-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

/** A fresh directory per test, so sockets never collide. */
async function dir(): Promise<string> {
  const d = join(root, String(++seq));
  await mkdir(d, { recursive: true });
  return d;
}

/** The real CSI Identity service on a socket; `notReady` makes Probe answer ready=false. */
async function csiIdentity(socketPath: string, notReady?: () => string | undefined): Promise<GrpcServer> {
  return serveGrpc({
    socketPath,
    logger: silentLogger,
    shutdownGraceMs: 100,
    services: [
      register(
        Identity,
        createIdentityService({
          vendorVersion: "test",
          controllerService: false,
          readiness: notReady ? [notReady] : [],
          logger: silentLogger,
        }),
      ),
    ],
  });
}

interface LogLine {
  msg: string;
  level: string;
  port?: number;
  error?: string;
  err?: string;
}

/** distort-csi as a child process, its JSON log lines collected from stderr. */
function spawn(args: string[]) {
  const proc = Bun.spawn([BUN, MAIN, ...args], {
    stdout: "ignore",
    stderr: "pipe",
    env: { PATH: process.env.PATH ?? "" },
  });
  const raw: string[] = [];
  void (async () => {
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of proc.stderr) {
      buf += dec.decode(chunk, { stream: true });
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        raw.push(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
    }
    if (buf) raw.push(buf);
  })();
  const lines = () =>
    raw.flatMap((l) => {
      try {
        return [JSON.parse(l) as LogLine];
      } catch {
        return [];
      }
    });
  const logged = (msg: string, timeoutMs = 30_000) =>
    eventually(
      () => lines().find((l) => l.msg === msg),
      timeoutMs,
      `log line "${msg}" (have: ${raw.join("\n")})`,
    );
  return { proc, raw, lines, logged };
}

/** The registrar process as the chart starts it, with the registry and health port under test control. */
function registrar(d: string, extra: string[] = []) {
  return spawn([
    "--mode=registrar",
    `--csi-address=unix://${join(d, "csi.sock")}`,
    `--kubelet-registration-path=${KUBELET_ENDPOINT}`,
    `--plugin-registration-path=${join(d, "plugins_registry")}`,
    "--http-endpoint=127.0.0.1:0",
    ...extra,
  ]);
}

const regSock = (d: string) => join(d, "plugins_registry", `${DRIVER_NAME}-reg.sock`);

async function healthz(port: number): Promise<{ status: number; body: string }> {
  const r = await fetch(`http://127.0.0.1:${port}/healthz`);
  return { status: r.status, body: await r.text() };
}

describe("registrar", () => {
  test("kubelet's view: GetInfo names the driver and the endpoint, registration turns /healthz 200, SIGTERM removes the socket", async () => {
    const d = await dir();
    const csi = await csiIdentity(join(d, "csi.sock"));
    const r = registrar(d);
    try {
      const health = await r.logged("health server listening");
      await r.logged("registrar serving");
      expect((await lstat(regSock(d))).isSocket()).toBe(true);
      // Socket there, kubelet silent so far: not yet healthy.
      const before = await healthz(health.port as number);
      expect(before.status).toBe(500);
      expect(before.body).toContain("kubelet has not confirmed the registration");

      const kubelet = new GrpcJsClient(`unix://${regSock(d)}`);
      try {
        const info = await kubelet.unary(Registration.method.getInfo, {}, { timeoutMs: 5000 });
        expect({
          type: info.type,
          name: info.name,
          endpoint: info.endpoint,
          supportedVersions: info.supportedVersions,
        }).toEqual({
          type: "CSIPlugin",
          name: DRIVER_NAME,
          endpoint: KUBELET_ENDPOINT,
          supportedVersions: ["1.0.0"],
        });
        await kubelet.unary(
          Registration.method.notifyRegistrationStatus,
          { pluginRegistered: true },
          { timeoutMs: 5000 },
        );
      } finally {
        kubelet.close();
      }
      expect(await healthz(health.port as number)).toEqual({ status: 200, body: "ok" });

      r.proc.kill("SIGTERM");
      expect(await r.proc.exited).toBe(0);
      expect(existsSync(regSock(d))).toBe(false);
    } finally {
      r.proc.kill("SIGKILL");
      await csi.close();
    }
  }, 60_000);

  test("plugin_registered=false: the error is logged and the process exits non-zero", async () => {
    const d = await dir();
    const csi = await csiIdentity(join(d, "csi.sock"));
    const r = registrar(d);
    try {
      await r.logged("registrar serving");
      const kubelet = new GrpcJsClient(`unix://${regSock(d)}`);
      try {
        await kubelet.unary(Registration.method.getInfo, {}, { timeoutMs: 5000 });
        await kubelet
          .unary(
            Registration.method.notifyRegistrationStatus,
            { pluginRegistered: false, error: "plugin storage.distort.io: version 9.0.0 not supported" },
            { timeoutMs: 5000 },
          )
          // The process may leave before its answer is read; the exit code is what counts.
          .catch(() => undefined);
      } finally {
        kubelet.close();
      }
      expect(await r.proc.exited).toBe(1);
      const refused = r.lines().find((l) => l.msg === "kubelet refused the plugin registration");
      expect(refused?.level).toBe("error");
      expect(refused?.error).toBe("plugin storage.distort.io: version 9.0.0 not supported");
    } finally {
      r.proc.kill("SIGKILL");
      await csi.close();
    }
  }, 60_000);

  test("waits for a CSI socket that appears late, and replaces a stale registration socket", async () => {
    const d = await dir();
    // A socket file nobody listens on, as a SIGKILLed predecessor leaves it.
    const stale = Bun.spawn(
      [
        BUN,
        "-e",
        `require("node:net").createServer().listen(${JSON.stringify(regSock(d))}, () => process.exit(0))`,
      ],
      { stdout: "ignore", stderr: "inherit" },
    );
    await mkdir(join(d, "plugins_registry"), { recursive: true });
    expect(await stale.exited).toBe(0);
    expect((await lstat(regSock(d))).isSocket()).toBe(true);

    const r = registrar(d);
    let csi: GrpcServer | undefined;
    try {
      await r.logged("waiting for the CSI driver");
      expect(r.lines().some((l) => l.msg === "registrar serving")).toBe(false);
      csi = await csiIdentity(join(d, "csi.sock"));
      await r.logged("registrar serving");
      const kubelet = new GrpcJsClient(`unix://${regSock(d)}`);
      try {
        expect((await kubelet.unary(Registration.method.getInfo, {}, { timeoutMs: 5000 })).name).toBe(
          DRIVER_NAME,
        );
      } finally {
        kubelet.close();
      }
    } finally {
      r.proc.kill("SIGKILL");
      await r.proc.exited;
      await csi?.close();
    }
  }, 60_000);

  test("no CSI driver within --csi-wait-timeout: exits 1 saying why, no registration socket", async () => {
    const d = await dir();
    const r = registrar(d, ["--csi-wait-timeout=1s", "--timeout=200ms"]);
    expect(await r.proc.exited).toBe(1);
    const failed = r.lines().find((l) => l.msg === "registrar failed to start");
    expect(failed?.err).toContain("did not answer GetPluginInfo within 1000 ms");
    expect(existsSync(regSock(d))).toBe(false);
  }, 60_000);

  test("a bad flag exits 2 with the usage", async () => {
    const r = spawn(["--mode=registrar", "--csi-address=/csi/csi.sock"]);
    expect(await r.proc.exited).toBe(2);
    expect(r.raw.join("\n")).toContain("--kubelet-registration-path is required");
    expect(r.raw.join("\n")).toContain("usage: distort-csi --mode=registrar");
  }, 30_000);
});

describe("liveness", () => {
  const running: { stop(): Promise<void> }[] = [];
  afterAll(async () => {
    await Promise.all(running.map((r) => r.stop()));
  });

  async function liveness(socketPath: string, probeTimeout = "1s") {
    const cfg = parseLivenessConfig(
      [
        "--mode=liveness",
        `--csi-address=${socketPath}`,
        "--http-endpoint=127.0.0.1:0",
        `--probe-timeout=${probeTimeout}`,
      ],
      {},
    );
    const l = await runLiveness(cfg, { logger: silentLogger });
    running.push(l);
    return l;
  }

  test("Probe ready=true: 200; the driver turning not ready: 500 with the reason, and back", async () => {
    const d = await dir();
    let reason: string | undefined;
    const csi = await csiIdentity(join(d, "csi.sock"), () => reason);
    try {
      const l = await liveness(join(d, "csi.sock"));
      expect(await healthz(l.port)).toEqual({ status: 200, body: "ok" });
      reason = "controller caches not synced";
      const bad = await healthz(l.port);
      expect(bad.status).toBe(500);
      expect(bad.body).toContain("ready=false");
      reason = undefined;
      expect((await healthz(l.port)).status).toBe(200);
    } finally {
      await csi.close();
    }
  }, 30_000);

  test("no socket: 500 within the probe timeout", async () => {
    const d = await dir();
    const l = await liveness(join(d, "absent.sock"), "2s");
    const t0 = performance.now();
    const r = await healthz(l.port);
    const elapsed = performance.now() - t0;
    expect(r.status).toBe(500);
    expect(r.body).toContain("CSI Probe on");
    // The deadline bounds the answer; the slack is for a loaded machine.
    expect(elapsed).toBeLessThan(2000 + 3000);
  }, 30_000);

  test("a driver that never answers Probe: 500 once the probe timeout has run out", async () => {
    const d = await dir();
    const hung = await serveGrpc({
      socketPath: join(d, "csi.sock"),
      logger: silentLogger,
      shutdownGraceMs: 0,
      services: [
        register(Identity, {
          probe: (_req, ctx) =>
            new Promise((_resolve, reject) =>
              ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason)),
            ),
        }),
      ],
    });
    try {
      const l = await liveness(join(d, "csi.sock"), "300ms");
      const t0 = performance.now();
      const r = await healthz(l.port);
      const elapsed = performance.now() - t0;
      expect(r.status).toBe(500);
      expect(r.body).toContain("DEADLINE_EXCEEDED");
      expect(elapsed).toBeGreaterThanOrEqual(290);
    } finally {
      await hung.close();
    }
  }, 30_000);

  test("as a process with the chart's arguments: serves /healthz from the CSI Probe", async () => {
    const d = await dir();
    const csi = await csiIdentity(join(d, "csi.sock"));
    const p = spawn([
      "--mode=liveness",
      `--csi-address=${join(d, "csi.sock")}`,
      "--http-endpoint=127.0.0.1:0",
      "--probe-timeout=3s",
    ]);
    try {
      const health = await p.logged("health server listening");
      expect(await healthz(health.port as number)).toEqual({ status: 200, body: "ok" });
      await csi.close();
      expect((await healthz(health.port as number)).status).toBe(500);
      p.proc.kill("SIGTERM");
      expect(await p.proc.exited).toBe(0);
    } finally {
      p.proc.kill("SIGKILL");
      await csi.close();
    }
  }, 60_000);
});
