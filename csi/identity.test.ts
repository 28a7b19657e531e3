// The Identity service over a real UNIX socket with a grpc-js client: name, version, capabilities
// per mode, and Probe following its readiness checks.
import { afterAll, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  PluginCapability_VolumeExpansion_Type as ExpansionType,
  Identity,
  PluginCapability_Service_Type as ServiceType,
} from "../gen/csi/v1/csi_pb.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { register, serveGrpc } from "../lib/grpc/server.ts";
import { silentLogger } from "../lib/log.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import pkg from "../package.json" with { type: "json" };
import { createIdentityService, hostToolsCheck, type ReadinessCheck } from "./identity.ts";

const root = await mkdtemp(join(tmpdir(), "distort-csi-identity-"));
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await rm(root, { recursive: true, force: true });
});

let n = 0;
async function serve(controllerService: boolean, readiness: ReadinessCheck[]) {
  const server = await serveGrpc({
    socketPath: join(root, `s${n++}.sock`),
    services: [
      register(
        Identity,
        createIdentityService({
          vendorVersion: pkg.version,
          controllerService,
          readiness,
          logger: silentLogger,
        }),
      ),
    ],
    logger: silentLogger,
  });
  const client = new GrpcJsClient(server.address);
  cleanups.push(
    () => client.close(),
    () => server.close(),
  );
  return client;
}

test("GetPluginInfo names the driver and the package version", async () => {
  const c = await serve(true, []);
  const info = await c.unary(Identity.method.getPluginInfo, {});
  expect(info.name).toBe(DRIVER_NAME);
  expect(info.vendorVersion).toBe(pkg.version);
});

test("capabilities: controller, group controller and snapshot metadata services only where they are served; topology and online expansion always", async () => {
  const types = async (controller: boolean) => {
    const c = await serve(controller, []);
    const r = await c.unary(Identity.method.getPluginCapabilities, {});
    return r.capabilities.map((x) =>
      x.type.case === "service"
        ? `service:${ServiceType[x.type.value.type]}`
        : `expansion:${ExpansionType[x.type.value?.type ?? 0]}`,
    );
  };
  expect(await types(true)).toEqual([
    "service:CONTROLLER_SERVICE",
    "service:GROUP_CONTROLLER_SERVICE",
    "service:SNAPSHOT_METADATA_SERVICE",
    "service:VOLUME_ACCESSIBILITY_CONSTRAINTS",
    "expansion:ONLINE",
  ]);
  expect(await types(false)).toEqual(["service:VOLUME_ACCESSIBILITY_CONSTRAINTS", "expansion:ONLINE"]);
});

test("Probe is ready only when every check passes; a throwing check counts as not ready", async () => {
  let synced = false;
  const c = await serve(true, [() => (synced ? undefined : "caches not synced"), () => undefined]);
  expect((await c.unary(Identity.method.probe, {})).ready).toBe(false);
  synced = true;
  expect((await c.unary(Identity.method.probe, {})).ready).toBe(true);
  const d = await serve(true, [
    () => {
      throw new Error("boom");
    },
  ]);
  expect((await d.unary(Identity.method.probe, {})).ready).toBe(false);
});

test("host tools check lists every missing command", () => {
  const which = (t: string) => (t === "nvme" ? "/usr/sbin/nvme" : null);
  expect(hostToolsCheck(["nvme", "mkfs.xfs", "blkid"], which)()).toBe(
    "host tools missing from PATH: mkfs.xfs, blkid",
  );
  expect(hostToolsCheck(["nvme"], which)()).toBeUndefined();
});
