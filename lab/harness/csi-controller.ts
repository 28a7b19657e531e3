// A CSI controller for integration tests: the real CsiController on a real gRPC socket, with the
// Identity service answering as distort-csi does, plus whichever of its services a test needs.
import { join } from "node:path";
import { CsiController } from "../../csi/controller.ts";
import { createIdentityService } from "../../csi/identity.ts";
import { Identity } from "../../gen/csi/v1/csi_pb.ts";
import { realClock } from "../../lib/clock.ts";
import { GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import { register, type ServiceRegistration, serveGrpc } from "../../lib/grpc/server.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { silentLogger } from "../../lib/log.ts";

export interface TestCsiController {
  controller: CsiController;
  client: GrpcJsClient;
  close(): Promise<void>;
}

/**
 * Starts a controller for `namespace` serving Identity and `services(controller)` on
 * `<dir>/controller.sock`, its caches synced; close() stops the client, server and controller.
 */
export async function startTestCsiController(o: {
  conn: KubeConnection;
  namespace: string;
  dir: string;
  services: (c: CsiController) => ServiceRegistration[];
  defaultTimeoutMs?: number;
}): Promise<TestCsiController> {
  const controller = new CsiController({
    conn: o.conn,
    namespace: o.namespace,
    logger: silentLogger,
    clock: realClock,
    defaultTimeoutMs: o.defaultTimeoutMs ?? 20_000,
    defaultVolumeBytes: 1024 ** 3,
  });
  const server = await serveGrpc({
    socketPath: join(o.dir, "controller.sock"),
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
      ...o.services(controller),
    ],
    logger: silentLogger,
  });
  const client = new GrpcJsClient(server.address);
  await controller.start();
  return {
    controller,
    client,
    async close() {
      client.close();
      await server.close();
      await controller.stop();
    },
  };
}
