// Tests for the health server over real HTTP on 127.0.0.1: probe answers, /metrics content type,
// 404s, failing and throwing checks, transition-only logging, and clean shutdown.

import { afterEach, describe, expect, test } from "bun:test";
import { StorageError } from "./errors.ts";
import { type Check, type HealthServer, METRICS_CONTENT_TYPE, serveHealth } from "./health-server.ts";
import { createLogger, silentLogger } from "./log.ts";
import { Registry } from "./metrics.ts";

const servers: HealthServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function start(over: Partial<Parameters<typeof serveHealth>[0]> = {}) {
  const registry = new Registry();
  const s = await serveHealth({
    port: 0,
    registry,
    healthz: () => true,
    readyz: () => true,
    logger: silentLogger,
    ...over,
  });
  servers.push(s);
  return { s, registry };
}

describe("serveHealth", () => {
  test("binds loopback on a free port", async () => {
    const { s } = await start();
    expect(s.port).toBeGreaterThan(0);
    expect(s.url).toBe(`http://127.0.0.1:${s.port}`);
  });

  const checks: Array<[string, Check, number, string]> = [
    ["healthy sync", () => true, 200, "ok"],
    ["healthy async", async () => true, 200, "ok"],
    ["returns false", () => false, 503, "healthz failed: healthz check returned false"],
    ["async false", async () => false, 503, "healthz failed: healthz check returned false"],
    [
      "throws",
      () => {
        throw new Error("disk\ngone");
      },
      503,
      "healthz failed: disk gone",
    ],
    ["rejects", () => Promise.reject(new Error("spdk down")), 503, "healthz failed: spdk down"],
    ["returns garbage", () => "yes" as unknown as boolean, 503, "healthz failed: healthz check returned yes"],
  ];
  test.each(checks)("/healthz when the check %s", async (_, healthz, status, body) => {
    const { s } = await start({ healthz });
    const res = await fetch(`${s.url}/healthz`);
    expect(res.status).toBe(status);
    expect(await res.text()).toBe(body);
    expect(res.headers.get("content-type")).toStartWith("text/plain");
  });

  test("/readyz uses its own check", async () => {
    let ready = false;
    const { s } = await start({ readyz: () => ready });
    const r1 = await fetch(`${s.url}/readyz`);
    expect([r1.status, await r1.text()]).toEqual([503, "readyz failed: readyz check returned false"]);
    ready = true;
    const r2 = await fetch(`${s.url}/readyz`);
    expect([r2.status, await r2.text()]).toEqual([200, "ok"]);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
  });

  test("a long failure message is cut short", async () => {
    const { s } = await start({
      readyz: () => {
        throw new Error("x".repeat(10_000));
      },
    });
    const body = await (await fetch(`${s.url}/readyz`)).text();
    expect(body.length).toBe(512);
  });

  test("/metrics serves the registry with the exposition content type", async () => {
    const { s, registry } = await start();
    registry.counter({ name: "probe_total", help: "p" }).inc();
    const res = await fetch(`${s.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe(METRICS_CONTENT_TYPE);
    expect(METRICS_CONTENT_TYPE).toBe("text/plain; version=0.0.4; charset=utf-8");
    expect(await res.text()).toBe(registry.render());
  });

  test.each([
    ["GET", "/"],
    ["GET", "/healthz/extra"],
    ["GET", "/metricsx"],
    ["POST", "/healthz"],
    ["DELETE", "/metrics"],
  ])("%s %s -> 404", async (method, path) => {
    const { s } = await start();
    const res = await fetch(`${s.url}${path}`, { method });
    expect(res.status).toBe(404);
    await res.text();
  });

  test("HEAD probes answer the status without a body", async () => {
    const { s } = await start({ readyz: () => false });
    const ok = await fetch(`${s.url}/healthz`, { method: "HEAD" });
    const bad = await fetch(`${s.url}/readyz`, { method: "HEAD" });
    expect([ok.status, bad.status]).toEqual([200, 503]);
    expect(await ok.text()).toBe("");
  });

  test("failureStatus 500 answers failing probes with 500, passing ones still 200", async () => {
    const { s } = await start({ failureStatus: 500, healthz: () => Promise.reject(new Error("no socket")) });
    const bad = await fetch(`${s.url}/healthz`);
    expect([bad.status, await bad.text()]).toEqual([500, "healthz failed: no socket"]);
    const ok = await fetch(`${s.url}/readyz`);
    expect([ok.status, await ok.text()]).toEqual([200, "ok"]);
  });

  test("logs failures once per transition, not on every probe", async () => {
    const lines: Array<{ level: string; msg: string; reason?: string }> = [];
    let healthy = false;
    const { s } = await start({
      healthz: () => healthy,
      logger: createLogger({ sink: (l) => lines.push(JSON.parse(l)) }),
    });
    for (let i = 0; i < 3; i++) await (await fetch(`${s.url}/healthz`)).text();
    healthy = true;
    for (let i = 0; i < 2; i++) await (await fetch(`${s.url}/healthz`)).text();
    const probes = lines.filter((l) => l.msg.startsWith("healthz"));
    expect(probes.map((l) => [l.level, l.msg])).toEqual([
      ["warn", "healthz failing"],
      ["info", "healthz passing"],
    ]);
  });

  test("close stops listening, is idempotent, and a taken port is an unavailable error", async () => {
    const { s } = await start();
    const clash = await serveHealth({
      port: s.port,
      registry: new Registry(),
      healthz: () => true,
      readyz: () => true,
      logger: silentLogger,
    }).catch((err: unknown) => err);
    expect(clash).toBeInstanceOf(StorageError);
    expect((clash as StorageError).kind).toBe("unavailable");
    await Promise.all([s.close(), s.close()]);
    await s.close();
    await expect(fetch(`${s.url}/healthz`)).rejects.toThrow();
  });
});
