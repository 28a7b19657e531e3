// Go interop: a CSI Identity served by lib/grpc on a real UNIX socket, called by lab/grpc-probe
// (google.golang.org/grpc + the CSI Go bindings, like kubelet and the sidecars). The first run
// builds the probe from the Go module proxy; later runs reuse the cached binary.

import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Controller, Identity } from "../../gen/csi/v1/csi_pb";
import { buildGoProbe, runGoProbe } from "../../lab/grpc-probe/probe.ts";
import { createLogger } from "../log";
import { type GrpcServer, register, serveGrpc } from "./server";

const BUILD_TIMEOUT_MS = 300_000;

let dir: string;
let server: GrpcServer;
let probe: string;
const lines: string[] = [];

beforeAll(async () => {
  probe = await buildGoProbe();
  dir = await mkdtemp(join(tmpdir(), "distort-grpc-int-"));
  server = await serveGrpc({
    socketPath: join(dir, "csi", "csi.sock"),
    logger: createLogger({ level: "debug", sink: (l) => lines.push(l) }),
    services: [
      register(Identity, {
        getPluginInfo: () => ({
          name: "csi.distort.io",
          vendorVersion: "0.1.0",
          manifest: { commit: "dev" },
        }),
        probe: () => ({ ready: true }),
      }),
      // Registered but empty: the probe's CreateVolume reaches our wrapper (and its log) and
      // must come back UNIMPLEMENTED.
      register(Controller, {}),
    ],
  });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await server?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test("a Go gRPC client gets CSI Identity answers and a proper error status", async () => {
  const res = await runGoProbe(probe, server.address);
  expect(res.getPluginInfo).toEqual({
    code: "OK",
    response: { name: "csi.distort.io", vendorVersion: "0.1.0", manifest: { commit: "dev" } },
  });
  expect(res.probe).toEqual({ code: "OK", response: { ready: true } });
  expect(res.failing.code).toBe("Unimplemented");
  expect(res.failing.message).toBe("csi.v1.Controller.CreateVolume is not implemented");

  const log = lines.join("\n");
  expect(log).not.toContain("grpc-probe-secret");
  const createVolume = lines
    .map((l) => JSON.parse(l))
    .find((r) => r.method === "/csi.v1.Controller/CreateVolume");
  expect(createVolume).toMatchObject({ code: "UNIMPLEMENTED", request: { secrets: "<redacted>" } });
});
