// The two CSI Identity calls the sidecar equivalents make on the driver's socket (GetPluginInfo for
// the driver name, Probe for liveness), each on a fresh gRPC channel that is closed afterwards, so
// no reconnect backoff of an earlier failure delays the next attempt.
import { Identity } from "../../gen/csi/v1/csi_pb.ts";
import type { Clock } from "../../lib/clock.ts";
import { errorMessage, StorageError } from "../../lib/errors.ts";
import { GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import type { Logger } from "../../lib/log.ts";

// A CSI driver name (the CSI spec: at most 63 characters, begins and ends with an alphanumeric,
// dashes, dots and alphanumerics between); it also names the registration socket file.
const DRIVER_NAME = /^[A-Za-z0-9]([-.A-Za-z0-9]{0,61}[A-Za-z0-9])?$/;

async function withChannel<T>(socketPath: string, fn: (c: GrpcJsClient) => Promise<T>): Promise<T> {
  // A private subchannel pool: grpc-js otherwise shares one subchannel, and its backoff, per address.
  const client = new GrpcJsClient(`unix://${socketPath}`, { "grpc.use_local_subchannel_pool": 1 });
  try {
    return await fn(client);
  } finally {
    client.close();
  }
}

/**
 * The driver's name from GetPluginInfo within `timeoutMs`. Rejects with the call's error, or
 * StorageError("invalid") when the name is not a valid CSI driver name.
 */
export async function getDriverName(socketPath: string, timeoutMs: number): Promise<string> {
  const info = await withChannel(socketPath, (c) =>
    c.unary(Identity.method.getPluginInfo, {}, { timeoutMs }),
  );
  if (!DRIVER_NAME.test(info.name))
    throw new StorageError("invalid", `the CSI driver reports an invalid name ${JSON.stringify(info.name)}`);
  return info.name;
}

/**
 * One CSI Probe within `timeoutMs`: undefined when the driver is ready (ready=true, or unset,
 * which the CSI spec says means ready), otherwise why not. Never rejects: an unreachable socket,
 * a gRPC error and a missed deadline are all reasons.
 */
export async function probeDriver(socketPath: string, timeoutMs: number): Promise<string | undefined> {
  try {
    const r = await withChannel(socketPath, (c) => c.unary(Identity.method.probe, {}, { timeoutMs }));
    return r.ready === false ? "the CSI driver answered Probe with ready=false" : undefined;
  } catch (err) {
    return `CSI Probe on ${socketPath} failed: ${errorMessage(err)}`;
  }
}

export interface WaitOptions {
  /** Deadline of each GetPluginInfo. */
  callTimeoutMs: number;
  /** Total wait; 0 means a single attempt. */
  waitMs: number;
  /** Pause between attempts. Default 500 ms. */
  retryMs?: number;
  clock: Clock;
  logger: Logger;
  signal?: AbortSignal;
}

/**
 * The driver's name, retrying GetPluginInfo until it answers or `waitMs` has passed (the driver
 * container starts beside this one and may not have created its socket yet). Rejects with
 * StorageError("unavailable") carrying the last error when time runs out, and at once with an
 * invalid driver name, which no retry can fix.
 */
export async function waitForDriverName(socketPath: string, o: WaitOptions): Promise<string> {
  const deadline = o.clock.now() + o.waitMs;
  for (let attempt = 1; ; attempt++) {
    try {
      return await getDriverName(socketPath, o.callTimeoutMs);
    } catch (err) {
      if (err instanceof StorageError && err.kind === "invalid") throw err;
      const left = deadline - o.clock.now();
      if (left <= 0)
        throw new StorageError(
          "unavailable",
          `the CSI driver at ${socketPath} did not answer GetPluginInfo within ${o.waitMs} ms (${attempt} attempts): ${errorMessage(err)}`,
          { cause: err, details: { socketPath } },
        );
      // First failure at info, the rest at debug: a slow driver start is normal.
      (attempt === 1 ? o.logger.info : o.logger.debug)("waiting for the CSI driver", {
        socket: socketPath,
        attempt,
        err: errorMessage(err),
      });
      await o.clock.sleep(Math.min(o.retryMs ?? 500, left), o.signal);
    }
  }
}
