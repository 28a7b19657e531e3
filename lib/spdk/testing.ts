// Test support for lib/spdk, imported by its tests only: a small scriptable fake of SPDK's JSON-RPC
// server on a real unix socket, and the SPDK v25.05.1 transcript records kept in testdata/.

import { readFileSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import * as v from "valibot";
import { JsonObjectStream } from "./json-stream.ts";

/** One request as the fake server parsed it off the wire. */
export type WireRequest = Record<string, unknown>;

/** One accepted client connection of a FakeSpdkServer. */
export class FakeConnection {
  readonly requests: WireRequest[] = [];
  /** Exact request bytes received, for byte-level assertions. */
  received = "";
  closed = false;

  constructor(readonly socket: Socket) {}

  /** Writes raw bytes, unchanged. */
  write(text: string | Uint8Array): void {
    if (!this.closed) this.socket.write(text);
  }

  /** Sends a success reply the way SPDK does: compact JSON plus one newline. */
  reply(id: unknown, result: unknown): void {
    this.write(`${JSON.stringify({ jsonrpc: "2.0", id, result })}\n`);
  }

  /** Sends an error reply the way SPDK does. */
  fail(id: unknown, code: number, message: string): void {
    this.write(`${JSON.stringify({ jsonrpc: "2.0", id, error: { code, message } })}\n`);
  }

  /** Closes the connection abruptly, as SPDK does after a parse error or when it exits. */
  destroy(): void {
    this.closed = true;
    this.socket.destroy();
  }
}

export type RequestHandler = (req: WireRequest, conn: FakeConnection) => void;

/**
 * A fake SPDK RPC server: parses the request stream with the same framing rules as SPDK (concatenated
 * JSON objects, any chunking) and hands each request to `onRequest`, which decides what to answer,
 * when, and how it is cut. Unhandled requests get no answer.
 */
export class FakeSpdkServer {
  readonly connections: FakeConnection[] = [];
  onRequest: RequestHandler = () => {};
  readonly #server: Server;
  readonly #waiters: Array<{ n: number; resolve: () => void }> = [];

  private constructor(
    readonly path: string,
    server: Server,
  ) {
    this.#server = server;
  }

  /** Listens on `<dir>/<name>`. */
  static async start(dir: string, name = "spdk.sock", onRequest?: RequestHandler): Promise<FakeSpdkServer> {
    const path = join(dir, name);
    let self: FakeSpdkServer | undefined;
    const server = createServer((sock) => self?.accept(sock));
    self = new FakeSpdkServer(path, server);
    if (onRequest) self.onRequest = onRequest;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(path, () => resolve());
    });
    return self;
  }

  private accept(sock: Socket): void {
    const conn = new FakeConnection(sock);
    this.connections.push(conn);
    const stream = new JsonObjectStream({ maxValueBytes: 1 << 20 });
    sock.on("data", (chunk: Buffer) => {
      conn.received += chunk.toString("utf8");
      try {
        stream.push(chunk, (value) => {
          const req = value as WireRequest;
          conn.requests.push(req);
          this.#notify();
          this.onRequest(req, conn);
        });
      } catch {
        conn.destroy(); // as SPDK does on a parse error
      }
    });
    sock.on("close", () => {
      conn.closed = true;
    });
    sock.on("error", () => {});
  }

  /** Every request received, over all connections, in arrival order per connection. */
  get requests(): WireRequest[] {
    return this.connections.flatMap((c) => c.requests);
  }

  /** Total request bytes received. */
  get bytesReceived(): number {
    return this.connections.reduce((n, c) => n + Buffer.byteLength(c.received), 0);
  }

  /** Resolves once `n` requests in total have arrived; rejects after `timeoutMs` (real time). */
  waitForRequests(n: number, timeoutMs = 2000): Promise<void> {
    if (this.requests.length >= n) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`fake SPDK got ${this.requests.length} of ${n} requests in ${timeoutMs} ms`)),
        timeoutMs,
      );
      this.#waiters.push({
        n,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
    });
  }

  #notify(): void {
    const have = this.requests.length;
    for (let i = this.#waiters.length - 1; i >= 0; i--) {
      const w = this.#waiters[i] as { n: number; resolve: () => void };
      if (have >= w.n) {
        this.#waiters.splice(i, 1);
        w.resolve();
      }
    }
  }

  /** Stops listening and drops every connection. */
  async close(): Promise<void> {
    for (const c of this.connections) c.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

const RecordSchema = v.looseObject({
  seq: v.number(),
  method: v.string(),
  request: v.unknown(),
  response: v.unknown(),
  note: v.nullish(v.string()),
  app: v.string(),
  client: v.string(),
  raw_request: v.string(),
  raw_response: v.string(),
  request_methods: v.optional(v.array(v.unknown())),
  server_closed_connection: v.optional(v.boolean()),
});
export type TranscriptRecord = v.InferOutput<typeof RecordSchema>;

/** Records captured from SPDK v25.05.1 (testdata/<file>, the 189-record capture by default), in capture order. */
export function loadTranscript(file = "spdk-v25.05.1.jsonl"): TranscriptRecord[] {
  const text = readFileSync(new URL(`../../testdata/${file}`, import.meta.url), "utf8");
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => v.parse(RecordSchema, JSON.parse(line)));
}
