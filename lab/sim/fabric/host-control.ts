// The lab host's control channel, standing where nvme-cli meets the kernel (/dev/nvme-fabrics,
// sysfs): one JSON request and one JSON reply per line on a unix socket, served by the host
// daemon, and the CSI node's NvmeInitiator that speaks it.
import { createServer, connect as netConnect, type Server, type Socket } from "node:net";
import * as v from "valibot";
import type { ConnectedSubsystem, ConnectParams, NvmeInitiator } from "../../../csi/host/nvme-initiator.ts";
import { type ErrorKind, StorageError } from "../../../lib/errors.ts";
import { closeServer, listenOn, takeSocketPath } from "../spdk/unix-socket.ts";

const ConnectParamsSchema = v.object({
  transport: v.picklist(["tcp", "rdma"]),
  address: v.string(),
  port: v.number(),
  nqn: v.string(),
  hostNqn: v.string(),
  ctrlLossTmo: v.optional(v.number()),
  reconnectDelay: v.optional(v.number()),
  fastIoFailTmo: v.optional(v.number()),
  // The secrets travel in the request as nvme-cli writes them to /dev/nvme-fabrics: never argv.
  dhchap: v.optional(v.object({ secret: v.string(), ctrlSecret: v.optional(v.string()) })),
  // The TLS PSK likewise, as nvme-cli hands the key to the kernel's keyring.
  tls: v.optional(v.object({ psk: v.string() })),
});

const RequestSchema = v.variant("method", [
  v.object({ id: v.number(), method: v.literal("connect"), params: ConnectParamsSchema }),
  v.object({ id: v.number(), method: v.literal("disconnect"), params: v.object({ nqn: v.string() }) }),
  v.object({ id: v.number(), method: v.literal("list") }),
  v.object({
    id: v.number(),
    method: v.literal("findNamespaceDevice"),
    params: v.object({ nqn: v.string(), namespaceId: v.optional(v.string()) }),
  }),
  v.object({ id: v.number(), method: v.literal("rescan"), params: v.object({ nqn: v.string() }) }),
]);
type Request = v.InferOutput<typeof RequestSchema>;

const ReplySchema = v.object({
  id: v.number(),
  result: v.optional(v.unknown()),
  error: v.optional(v.object({ kind: v.string(), message: v.string() })),
});

const PathSchema = v.object({
  name: v.string(),
  transport: v.string(),
  traddr: v.optional(v.string()),
  trsvcid: v.optional(v.string()),
  state: v.string(),
});
const SubsystemsSchema = v.array(
  v.object({ nqn: v.string(), hostNqn: v.string(), name: v.string(), paths: v.array(PathSchema) }),
);

/** A control socket server over `initiator`; close() stops it and removes the socket. */
export async function serveHostControl(
  path: string,
  initiator: NvmeInitiator,
): Promise<{ close(): Promise<void> }> {
  await takeSocketPath(path);
  const server: Server = createServer((sock) => {
    let buf = "";
    sock.on("error", () => {});
    sock.on("data", (chunk: Buffer) => {
      buf += chunk.toString("utf8");
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        void answer(initiator, line).then((reply) => {
          if (!sock.destroyed) sock.write(`${JSON.stringify(reply)}\n`);
        });
      }
    });
  });
  await listenOn(server, path);
  return { close: () => closeServer(server, path, false) };
}

async function answer(initiator: NvmeInitiator, line: string): Promise<unknown> {
  let req: Request;
  try {
    req = v.parse(RequestSchema, JSON.parse(line));
  } catch (err) {
    return { id: -1, error: { kind: "invalid", message: `bad request: ${(err as Error).message}` } };
  }
  try {
    switch (req.method) {
      case "connect":
        await initiator.connect(req.params);
        return { id: req.id, result: null };
      case "disconnect":
        await initiator.disconnect(req.params.nqn);
        return { id: req.id, result: null };
      case "list":
        return { id: req.id, result: await initiator.list() };
      case "findNamespaceDevice":
        return {
          id: req.id,
          result: (await initiator.findNamespaceDevice(req.params.nqn, req.params.namespaceId)) ?? null,
        };
      case "rescan":
        await initiator.rescan(req.params.nqn);
        return { id: req.id, result: null };
    }
  } catch (err) {
    const kind = err instanceof StorageError ? err.kind : "internal";
    return { id: req.id, error: { kind, message: (err as Error).message } };
  }
}

/**
 * The CSI node's NvmeInitiator in the lab: every call one request to the host daemon's control
 * socket. The daemon keeps the controllers and devices, so this side holds no state and may be
 * restarted at will. A daemon that does not answer is StorageError "unavailable"; one that does
 * not answer within `timeoutMs` (default 120 s) "timeout"; the daemon's own errors keep their kind.
 */
export class HostControlInitiator implements NvmeInitiator {
  #id = 1;

  constructor(
    readonly socketPath: string,
    private readonly timeoutMs = 120_000,
  ) {}

  async connect(p: ConnectParams): Promise<void> {
    await this.#call("connect", { ...p });
  }

  async disconnect(nqn: string): Promise<void> {
    await this.#call("disconnect", { nqn });
  }

  async list(): Promise<ConnectedSubsystem[]> {
    return v.parse(SubsystemsSchema, await this.#call("list", undefined)).map((s) => ({
      ...s,
      paths: s.paths.map((p) => ({ ...p, traddr: p.traddr, trsvcid: p.trsvcid })),
    }));
  }

  async findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined> {
    const r = await this.#call("findNamespaceDevice", {
      nqn,
      ...(namespaceId === undefined ? {} : { namespaceId }),
    });
    return typeof r === "string" ? r : undefined;
  }

  async rescan(nqn: string): Promise<void> {
    await this.#call("rescan", { nqn });
  }

  #call(method: string, params: unknown): Promise<unknown> {
    const id = this.#id++;
    return new Promise((resolve, reject) => {
      let buf = "";
      let settled = false;
      const sock: Socket = netConnect(this.socketPath);
      const done = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        sock.destroy();
        fn();
      };
      const timer = setTimeout(
        () =>
          done(() =>
            reject(
              new StorageError("timeout", `host daemon did not answer ${method} in ${this.timeoutMs} ms`),
            ),
          ),
        this.timeoutMs,
      );
      sock.once("connect", () =>
        sock.write(`${JSON.stringify(params === undefined ? { id, method } : { id, method, params })}\n`),
      );
      sock.on("error", (err) =>
        done(() =>
          reject(
            new StorageError("unavailable", `host daemon at ${this.socketPath}: ${err.message}`, {
              cause: err,
            }),
          ),
        ),
      );
      sock.on("close", () =>
        done(() =>
          reject(new StorageError("unavailable", `host daemon closed the connection during ${method}`)),
        ),
      );
      sock.on("data", (chunk: Buffer) => {
        buf += chunk.toString("utf8");
        const nl = buf.indexOf("\n");
        if (nl < 0) return;
        const r = v.safeParse(ReplySchema, JSON.parse(buf.slice(0, nl)));
        if (!r.success)
          return done(() => reject(new StorageError("internal", "host daemon reply is malformed")));
        const reply = r.output;
        if (reply.error)
          return done(() =>
            reject(new StorageError(reply.error?.kind as ErrorKind, reply.error?.message ?? "")),
          );
        done(() => resolve(reply.result));
      });
    });
  }
}
