// Builds and runs lab/grpc-probe, a Go gRPC client (the stack kubelet and the CSI sidecars use),
// to prove that our servers interoperate with Go. The binary is cached by a hash of its sources.

import { createHash } from "node:crypto";
import { access, mkdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import * as v from "valibot";
import { cacheRoot } from "../cluster/tools.ts";

/** The probe's Go module (go.mod, go.sum, main.go), beside this file. */
export const PROBE_SOURCE_DIR = import.meta.dir;

/** Where built tools live: <cache root>/tools (the same root as the control-plane builds). */
export function defaultToolCacheDir(): string {
  return join(cacheRoot(), "tools");
}

/** Hash of go.mod + main.go: a new binary exactly when the probe's code or dependencies change. */
export async function probeSourceHash(sourceDir = PROBE_SOURCE_DIR): Promise<string> {
  const h = createHash("sha256");
  for (const f of ["go.mod", "main.go"]) {
    h.update(`${f}\0`);
    h.update(await readFile(join(sourceDir, f)));
    h.update("\0");
  }
  return h.digest("hex").slice(0, 16);
}

/**
 * Returns the path of the probe binary, building it on a cache miss
 * (<cacheDir>/grpc-probe-<hash>/grpc-probe; GOTOOLCHAIN=local, CGO_ENABLED=0, go.sum must be
 * complete). The first build downloads modules from the Go proxy and may take a minute or two.
 * Safe to call concurrently: each build writes a private file and renames it into place.
 * Throws with the compiler output when `go build` fails or `go` is missing.
 */
export async function buildGoProbe(cacheDir = defaultToolCacheDir()): Promise<string> {
  const dir = join(cacheDir, `grpc-probe-${await probeSourceHash()}`);
  const bin = join(dir, "grpc-probe");
  if (await exists(bin)) return bin;
  await mkdir(dir, { recursive: true });
  const tmp = `${bin}.tmp-${process.pid}-${Date.now()}`;
  // `env` adds the variables to the inherited environment without this module reading it.
  const cmd = [
    "env",
    "GOTOOLCHAIN=local",
    "CGO_ENABLED=0",
    "GOFLAGS=-mod=readonly",
    "go",
    "build",
    "-trimpath",
    "-o",
    tmp,
    ".",
  ];
  const proc = spawnOrExplain(cmd, PROBE_SOURCE_DIR);
  const [code, out, err] = await Promise.all([
    proc.exited,
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
  ]);
  if (code !== 0) {
    await rm(tmp, { force: true });
    throw new Error(`grpc-probe: go build failed (exit ${code}):\n${err}${out}`);
  }
  await rename(tmp, bin);
  return bin;
}

const CallSchema = v.object({
  code: v.string(),
  message: v.optional(v.string()),
  response: v.optional(v.record(v.string(), v.unknown())),
});
const ResultSchema = v.object({ getPluginInfo: CallSchema, probe: CallSchema, failing: CallSchema });

/** One RPC as the Go client saw it; `code` is Go's name for the status ("OK", "Unimplemented"...). */
export type GoProbeCall = v.InferOutput<typeof CallSchema>;
/** CSI Identity GetPluginInfo and Probe, and Controller CreateVolume, which must fail. */
export type GoProbeResult = v.InferOutput<typeof ResultSchema>;

/**
 * Runs the probe against `address` ("unix:///path.sock") and parses its JSON. The failing call
 * is Controller.CreateVolume carrying secrets {password: "grpc-probe-secret"}: it must come back
 * non-OK, and the secret must not reach the server's log. Throws if the probe exits non-zero.
 */
export async function runGoProbe(
  binary: string,
  address: string,
  timeoutMs = 10_000,
): Promise<GoProbeResult> {
  const proc = Bun.spawn([binary, "-addr", address, "-timeout", `${timeoutMs}ms`], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const [code, out, err] = await Promise.all([
    proc.exited,
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
  ]);
  if (code !== 0) throw new Error(`grpc-probe exited ${code}: ${err}`);
  return v.parse(ResultSchema, JSON.parse(out));
}

function spawnOrExplain(cmd: string[], cwd: string) {
  try {
    return Bun.spawn(cmd, { cwd, stdout: "pipe", stderr: "pipe" });
  } catch (e) {
    throw new Error(`grpc-probe: cannot run ${cmd.join(" ")}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await access(path);
    return true;
  } catch {
    return false;
  }
}
