// A small @grpc/grpc-js client for protoc-gen-es service descriptors: the peer our tests and the
// transport bench use, since grpc-js speaks the same HTTP/2 gRPC wire as the Go clients do.

import {
  create,
  type DescMessage,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  fromBinary,
  type MessageInitShape,
  type MessageShape,
  toBinary,
} from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

/** A failed call: the gRPC status code (numerically equal to Connect's Code) and message. */
export class GrpcCallError extends Error {
  override readonly name = "GrpcCallError";
  constructor(
    /** The gRPC status code; compare with @connectrpc/connect's Code, which uses the same numbers. */
    readonly code: number,
    readonly details: string,
  ) {
    super(`${grpc.status[code] ?? code}: ${details}`);
  }
}

export interface UnaryCallOptions {
  /** Milliseconds until the deadline the client sends (grpc-timeout) and enforces. */
  timeoutMs?: number;
}

/**
 * One channel to `address` (e.g. "unix:///run/x.sock"). Calls are multiplexed on it and may run
 * concurrently. close() releases the channel; in-flight calls then fail with CANCELLED.
 */
export class GrpcJsClient {
  private readonly client: grpc.Client;

  constructor(address: string, options: grpc.ChannelOptions = {}) {
    this.client = new grpc.Client(address, grpc.credentials.createInsecure(), {
      "grpc.max_receive_message_length": 64 << 20,
      "grpc.max_send_message_length": 64 << 20,
      ...options,
    });
  }

  /** Calls a unary method; rejects with GrpcCallError on any non-OK status. */
  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    request: MessageInitShape<I>,
    opts: UnaryCallOptions = {},
  ): Promise<MessageShape<O>> {
    const path = `/${method.parent.typeName}/${method.name}`;
    const message = create(method.input, request);
    const callOptions: grpc.CallOptions = {};
    if (opts.timeoutMs !== undefined) callOptions.deadline = Date.now() + opts.timeoutMs;
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(
        path,
        (m: MessageShape<I>) => Buffer.from(toBinary(method.input, m)),
        (b: Buffer) => fromBinary(method.output, b),
        message,
        new grpc.Metadata(),
        callOptions,
        (err, res) => {
          if (err) reject(new GrpcCallError(err.code, err.details));
          else if (res === undefined) reject(new GrpcCallError(grpc.status.INTERNAL, "empty response"));
          else resolve(res);
        },
      );
    });
  }

  /** Calls a server-streaming method and collects every response; rejects like unary(). */
  serverStream<I extends DescMessage, O extends DescMessage>(
    method: DescMethodServerStreaming<I, O>,
    request: MessageInitShape<I>,
    opts: UnaryCallOptions = {},
  ): Promise<MessageShape<O>[]> {
    const path = `/${method.parent.typeName}/${method.name}`;
    const callOptions: grpc.CallOptions = {};
    if (opts.timeoutMs !== undefined) callOptions.deadline = Date.now() + opts.timeoutMs;
    const call = this.client.makeServerStreamRequest(
      path,
      (m: MessageShape<I>) => Buffer.from(toBinary(method.input, m)),
      (b: Buffer) => fromBinary(method.output, b),
      create(method.input, request),
      new grpc.Metadata(),
      callOptions,
    );
    return new Promise((resolve, reject) => {
      const out: MessageShape<O>[] = [];
      call.on("data", (m: MessageShape<O>) => out.push(m));
      call.on("error", (e: grpc.ServiceError) => reject(new GrpcCallError(e.code, e.details)));
      call.on("status", (s: grpc.StatusObject) => {
        if (s.code === grpc.status.OK) resolve(out);
      });
    });
  }

  close(): void {
    this.client.close();
  }
}
