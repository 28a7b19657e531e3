// Registers Connect-typed method implementations on a @grpc/grpc-js Server: grpc-js owns HTTP/2
// and gRPC framing, this file owns protobuf-es (de)serialisation, HandlerContext and status mapping.

import { create, type DescMessage, fromBinary, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import {
  type ConnectError,
  createHandlerContext,
  decodeBinaryHeader,
  encodeBinaryHeader,
  type MethodImplSpec,
  type ServiceImplSpec,
} from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import type { Logger } from "../log";
import { toConnectError } from "./status";

/**
 * Adds every method of `spec` to `server` under its gRPC path (/package.Service/Method).
 * Unary and server-streaming methods are served; client and bidi streaming (none in CSI or the
 * DPF API today) answer UNIMPLEMENTED. `shutdown` aborts every handler's ctx.signal when the server
 * gives up waiting on in-flight calls. Throws if a path is already registered.
 */
export function addServiceSpec(
  server: grpc.Server,
  spec: ServiceImplSpec,
  shutdown: AbortSignal,
  logger: Logger,
): void {
  for (const m of Object.values(spec.methods)) {
    const path = `/${spec.service.typeName}/${m.method.name}`;
    const deserialize = (b: Buffer) => fromBinary(m.method.input, b);
    const ok = (() => {
      switch (m.kind) {
        case "unary":
          return server.register(
            path,
            unaryHandler(m, path, shutdown, logger),
            passBuffer,
            deserialize,
            "unary",
          );
        case "server_streaming":
          return server.register(
            path,
            serverStreamHandler(m, path, shutdown),
            passBuffer,
            deserialize,
            "serverStream",
          );
        case "client_streaming":
          return server.register(path, unsupported(m.kind), passBuffer, deserialize, "clientStream");
        case "bidi_streaming":
          return server.register(path, unsupported(m.kind), passBuffer, deserialize, "bidi");
      }
    })();
    if (!ok) throw new Error(`gRPC method ${path} registered twice`);
  }
}

// Responses are serialised in the handler, where a failure can still become a proper status.
const passBuffer = (b: Buffer) => b;

function encode(schema: DescMessage, init: MessageInitShape<DescMessage>): Buffer {
  const bytes = toBinary(schema, create(schema, init));
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** What the adapter needs of any grpc-js server call (grpc-js does not export its base type). */
interface AnyServerCall {
  readonly metadata: grpc.Metadata;
  getDeadline(): grpc.Deadline;
  once(event: "cancelled", listener: () => void): unknown;
  emit(event: "error", status: Partial<grpc.StatusObject>): boolean;
}

function contextFor(m: MethodImplSpec, path: string, call: AnyServerCall, shutdown: AbortSignal) {
  // grpc-js enforces the deadline itself and then emits "cancelled"; the context mirrors it so
  // handlers can pass ctx.signal to downstream calls (SPDK, Kubernetes) and stop early.
  const cancelled = new AbortController();
  call.once("cancelled", () => cancelled.abort());
  const deadline = call.getDeadline();
  const at = deadline instanceof Date ? deadline.getTime() : deadline;
  return createHandlerContext({
    service: m.method.parent,
    method: m.method,
    protocolName: "grpc",
    requestMethod: "POST",
    url: path,
    timeoutMs: Number.isFinite(at) ? Math.max(0, at - Date.now()) : undefined,
    requestSignal: cancelled.signal,
    shutdownSignal: shutdown,
    requestHeader: headersFrom(call.metadata),
  });
}

function unaryHandler(
  m: Extract<MethodImplSpec, { kind: "unary" }>,
  path: string,
  shutdown: AbortSignal,
  logger: Logger,
): grpc.handleUnaryCall<unknown, Buffer> {
  return (call, callback) => {
    const ctx = contextFor(m, path, call, shutdown);
    Promise.resolve()
      .then(() => m.impl(call.request as never, ctx))
      .then(
        (res) => {
          let body: Buffer;
          try {
            body = encode(m.method.output, res);
          } catch (e) {
            const err = toConnectError(e);
            logger.error("grpc response not serialisable", { method: path, error: err.rawMessage });
            callback(statusOf(err));
            return;
          }
          if (hasEntries(ctx.responseHeader)) call.sendMetadata(metadataFrom(ctx.responseHeader));
          callback(null, body, metadataFrom(ctx.responseTrailer));
        },
        (e: unknown) => callback(statusOf(toConnectError(e))),
      )
      .finally(() => ctx.abort());
  };
}

function serverStreamHandler(
  m: Extract<MethodImplSpec, { kind: "server_streaming" }>,
  path: string,
  shutdown: AbortSignal,
): grpc.handleServerStreamingCall<unknown, Buffer> {
  return (call) => {
    const ctx = contextFor(m, path, call, shutdown);
    (async () => {
      let headersSent = false;
      for await (const res of m.impl(call.request as never, ctx)) {
        if (ctx.signal.aborted) break;
        if (!headersSent && hasEntries(ctx.responseHeader))
          call.sendMetadata(metadataFrom(ctx.responseHeader));
        headersSent = true;
        // Respect HTTP/2 flow control: a slow reader must not make us buffer the whole stream.
        if (!call.write(encode(m.method.output, res))) await drained(call, ctx.signal);
      }
      call.end(metadataFrom(ctx.responseTrailer));
    })()
      .catch((e: unknown) => call.emit("error", statusOf(toConnectError(e))))
      .finally(() => ctx.abort());
  };
}

function drained(call: grpc.ServerWritableStream<unknown, Buffer>, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      call.off("drain", done);
      signal.removeEventListener("abort", done);
      resolve();
    };
    call.once("drain", done);
    signal.addEventListener("abort", done);
  });
}

function unsupported(kind: string) {
  const status: Partial<grpc.StatusObject> = {
    code: grpc.status.UNIMPLEMENTED,
    details: `${kind} RPCs are not supported by lib/grpc`,
  };
  return (call: AnyServerCall, callback?: grpc.sendUnaryData<Buffer>) => {
    if (callback) callback(status);
    else call.emit("error", status);
  };
}

/** A ConnectError as a grpc-js status; the Code enum shares gRPC's numbering. */
function statusOf(err: ConnectError): Partial<grpc.StatusObject> {
  return {
    code: err.code as number as grpc.status,
    details: err.rawMessage,
    metadata: metadataFrom(err.metadata),
  };
}

function hasEntries(h: Headers): boolean {
  for (const _ of h.keys()) return true;
  return false;
}

function headersFrom(md: grpc.Metadata): Headers {
  const h = new Headers();
  for (const [k, values] of Object.entries(md.toJSON())) {
    for (const v of values) h.append(k, typeof v === "string" ? v : encodeBinaryHeader(v));
  }
  return h;
}

function metadataFrom(h: Headers): grpc.Metadata {
  const md = new grpc.Metadata();
  for (const [k, v] of h) {
    if (k.endsWith("-bin")) md.add(k, Buffer.from(decodeBinaryHeader(v)));
    else md.add(k, v);
  }
  return md;
}
