// SPDK v25.05.1's JSON-RPC server on a unix socket: JSON value streams in, compact replies plus
// "\n" out in completion order, envelope (-32600) and state (-1) checks, the cut-off reply to an
// id-less request, and a silent close (owed replies lost) on malformed JSON or >32 KiB requests.
// Its clock is SPDK's: one poller every RPC_SELECT_INTERVAL accepts at most one connection, then
// per connection sends what is complete and makes one recv, so a reply goes out a poll later.
import { createServer, type Server, type Socket } from "node:net";
import type { Logger } from "../../../lib/log.ts";
import { DUPLICATE_KEY_PREFIX, type JsonValue, scanJsonValue, type TopMember } from "./json-stream.ts";
import type { MethodSpec, RpcContext, RpcRequest, RpcState } from "./method-table.ts";
import { ErrnoError, RpcCode, RpcError } from "./rpc-error.ts";
import { closeServer, listenOn, takeSocketPath } from "./unix-socket.ts";

/** SPDK_JSONRPC_RECV_BUF_SIZE up to v26.01: the largest request a connection can hold. */
export const MAX_REQUEST_BYTES = 32 * 1024;
/** SPDK_JSONRPC_MAX_VALUES up to v26.01. */
export const MAX_VALUES = 1024;
/** SPDK_JSONRPC_MAX_CONNS: further connections wait un-accepted. */
export const MAX_CONNECTIONS = 64;
/** RPC_SELECT_INTERVAL in lib/init/rpc.c (a constant, 4000 µs): the RPC server's poll period. */
export const RPC_POLL_MS = 4;
// The JSON writer flushes in chunks of this size; an id-less reply loses all but the last chunk.
const WRITER_CHUNK = 4096;

const STARTUP_ONLY_MSG =
  "Method may only be called before framework is initialized. Use --wait-for-rpc command line parameter and then issue this RPC before the framework_start_init RPC.";
const RUNTIME_ONLY_MSG =
  "Method may only be called after framework is initialized using framework_start_init RPC.";

/** What an RpcServer serves, and where. */
export interface RpcServerOptions {
  readonly socketPath: string;
  readonly logger: Logger;
  /** The methods, looked up per request (the table never changes while running). */
  readonly methods: ReadonlyMap<string, MethodSpec>;
  /** The framework state requests are checked against. */
  readonly state: () => RpcState;
  /** How long an asynchronous method takes before it completes (ms). */
  readonly asyncDelayMs: number;
  /**
   * The poll period in ms (RPC_POLL_MS on a real target). 0 answers as soon as data arrives, for
   * tests of the protocol rather than of the target's clock.
   */
  readonly pollMs: number;
  /** Runs the poller; default the process's timers. Tests step polls by hand through it. */
  readonly pollTimer?: PollTimer;
}

/** What the poller needs of time: now, and a one-shot timer. */
export interface PollTimer {
  now(): number;
  /** Calls `fn` once after `ms`; the returned function cancels it. */
  after(ms: number, fn: () => void): () => void;
}

const PROCESS_TIMER: PollTimer = {
  now: () => performance.now(),
  after(ms, fn) {
    const t = setTimeout(fn, ms);
    return () => clearTimeout(t);
  },
};

/**
 * One listening RPC server. start() binds the socket (a stale one is replaced; a live owner is
 * ErrnoError EBUSY). stop() cuts every connection without flushing owed replies; asynchronous
 * handlers still pending never reply afterwards.
 */
export class RpcServer {
  readonly #opts: RpcServerOptions;
  #server: Server | undefined;
  readonly #active = new Set<RpcConnection>();
  readonly #waiting: Socket[] = [];
  /** Polled: connections the kernel queued that no poll accepted yet. */
  readonly #backlog: RpcConnection[] = [];
  #paused = false;
  #alive = true;
  #cancelTick: (() => void) | undefined;
  /** The period index (time ÷ pollMs) of the last poll. */
  #lastPoll = -1;

  constructor(opts: RpcServerOptions) {
    this.#opts = opts;
  }

  get opts(): RpcServerOptions {
    return this.#opts;
  }

  get paused(): boolean {
    return this.#paused;
  }

  async start(): Promise<void> {
    await takeSocketPath(this.#opts.socketPath);
    const server = createServer((sock) => this.#accept(sock));
    await listenOn(server, this.#opts.socketPath);
    this.#server = server;
  }

  /** Stops processing requests (framework_start_init pauses the server while it initialises). */
  pause(): void {
    this.#paused = true;
  }

  /** Resumes processing, including data that arrived while paused. */
  resume(): void {
    this.#paused = false;
    if (this.polled) this.wake();
    else for (const c of this.#active) c.process();
  }

  /** Whether requests wait for the poller (a real target's clock) rather than run on arrival. */
  get polled(): boolean {
    return this.#opts.pollMs > 0;
  }

  /**
   * Something waits for the poller (a connection to accept, data, a reply): the next poll runs at
   * the next multiple of the period, as a free-running poller would, without spinning while idle.
   */
  wake(): void {
    if (this.#cancelTick || !this.#alive || !this.polled) return;
    const timer = this.#opts.pollTimer ?? PROCESS_TIMER;
    const period = this.#opts.pollMs;
    // The next period boundary after both now and the last poll: never two polls in one period.
    this.#pollAt(Math.max(Math.floor(timer.now() / period) + 1, this.#lastPoll + 1), timer, period);
  }

  #pollAt(index: number, timer: PollTimer, period: number): void {
    // Timers round; waiting the whole milliseconds up to the boundary never polls before it.
    this.#cancelTick = timer.after(Math.max(0, Math.ceil(index * period - timer.now())), () => {
      this.#cancelTick = undefined;
      if (timer.now() < index * period) {
        this.#pollAt(index, timer, period);
        return;
      }
      this.#lastPoll = index;
      this.#poll();
    });
  }

  /**
   * One spdk_jsonrpc_server_poll: accept one connection while a slot is free, then on each
   * connection send what is complete and make one recv.
   */
  #poll(): void {
    if (!this.#alive) return;
    const accepted = this.#active.size < MAX_CONNECTIONS ? this.#backlog.shift() : undefined;
    if (accepted) this.#active.add(accepted);
    for (const c of [...this.#active]) c.poll();
    const canAccept = this.#backlog.length > 0 && this.#active.size < MAX_CONNECTIONS;
    if (canAccept || [...this.#active].some((c) => c.busy)) this.wake();
  }

  /**
   * Closes the server. `crash` leaves the socket file (a dead process's leftover); otherwise it
   * is removed like SPDK's clean shutdown does.
   */
  async stop(crash: boolean): Promise<void> {
    this.#alive = false;
    this.#cancelTick?.();
    this.#cancelTick = undefined;
    for (const c of [...this.#active, ...this.#backlog.splice(0)]) c.drop();
    for (const s of this.#waiting.splice(0)) s.destroy();
    if (this.#server) await closeServer(this.#server, this.#opts.socketPath, crash);
    this.#server = undefined;
  }

  /** A context for one request; defer() never resolves once this server stopped. */
  context(): RpcContext {
    return {
      defer: () =>
        new Promise<void>((resolve) => {
          setTimeout(() => {
            if (this.#alive) resolve();
          }, this.#opts.asyncDelayMs);
        }),
    };
  }

  #accept(sock: Socket): void {
    if (!this.#alive) {
      sock.destroy();
      return;
    }
    if (this.polled) {
      // The kernel queues the connection and buffers its bytes; each poll accepts one.
      this.#backlog.push(this.#connection(sock));
      this.wake();
      return;
    }
    if (this.#active.size >= MAX_CONNECTIONS) {
      // Beyond the limit SPDK leaves sockets in the listen backlog: the client hangs.
      sock.pause();
      this.#waiting.push(sock);
      sock.on("close", () => {
        const at = this.#waiting.indexOf(sock);
        if (at >= 0) this.#waiting.splice(at, 1);
      });
      return;
    }
    this.#active.add(this.#connection(sock));
  }

  #connection(sock: Socket): RpcConnection {
    const conn = new RpcConnection(this, sock, () => {
      this.#active.delete(conn);
      const at = this.#backlog.indexOf(conn);
      if (at >= 0) this.#backlog.splice(at, 1);
      if (this.polled) {
        this.wake();
        return;
      }
      const next = this.#waiting.shift();
      if (next) {
        next.removeAllListeners("close");
        this.#active.add(this.#connection(next));
        next.resume();
      }
    });
    return conn;
  }
}

/** The framing state of one client connection. */
class RpcConnection {
  #buf: Buffer = Buffer.alloc(0);
  /** Bytes the kernel holds for this socket that no recv() took yet (polled mode). */
  #incoming: Buffer = Buffer.alloc(0);
  #queue: string[] = [];
  #eof = false;
  #flushScheduled = false;
  #closed = false;

  constructor(
    private readonly server: RpcServer,
    private readonly sock: Socket,
    private readonly onGone: () => void,
  ) {
    sock.on("data", (chunk: Buffer) => {
      if (this.#closed) return;
      if (server.polled) {
        this.#incoming = this.#incoming.length === 0 ? chunk : Buffer.concat([this.#incoming, chunk]);
        server.wake();
        return;
      }
      this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
      this.process();
    });
    // A peer shutting its write side is "connection closed" to SPDK: nothing more is sent.
    sock.on("end", () => {
      // Polled, the bytes before the end are still received first; the end is seen by the recv
      // after them.
      if (!server.polled) this.drop();
      else {
        this.#eof = true;
        server.wake();
      }
    });
    sock.on("error", () => this.drop());
    sock.on("close", () => {
      this.#closed = true;
      this.onGone();
    });
  }

  /** Whether the poller has work here: bytes not yet received, or replies not yet sent. */
  get busy(): boolean {
    return !this.#closed && (this.#incoming.length > 0 || this.#queue.length > 0 || this.#eof);
  }

  /**
   * This connection's part of one poll (polled mode): send every reply already complete, then one
   * recv() of what fits the receive buffer, parsed and dispatched; replies it makes wait a poll.
   */
  poll(): void {
    if (this.#closed) return;
    this.#send();
    if (this.server.paused) return;
    if (this.#incoming.length === 0) {
      if (this.#eof) this.drop();
      return;
    }
    const room = MAX_REQUEST_BYTES - this.#buf.length;
    if (room <= 0) {
      this.drop();
      return;
    }
    const take = this.#incoming.subarray(0, room);
    this.#incoming = this.#incoming.subarray(take.length);
    this.#buf = this.#buf.length === 0 ? Buffer.from(take) : Buffer.concat([this.#buf, take]);
    this.process();
  }

  /** Parses and dispatches every complete request in the buffer. */
  process(): void {
    if (this.#closed || this.server.paused) return;
    for (;;) {
      const r = scanJsonValue(this.#buf);
      if (r.kind === "empty") {
        this.#buf = Buffer.alloc(0);
        break;
      }
      if (r.kind === "incomplete") {
        // A full receive buffer without a complete request: SPDK's recv() gets 0 bytes to read
        // into, which it takes for a closed peer.
        if (this.#buf.length >= MAX_REQUEST_BYTES) this.drop();
        break;
      }
      if (r.kind === "invalid" || r.end > MAX_REQUEST_BYTES || r.values > MAX_VALUES) {
        this.drop();
        break;
      }
      this.#buf = this.#buf.subarray(r.end);
      const env = parseEnvelope(r.value, r.members, r.duplicateKeys);
      if ("invalidId" in env) {
        this.#reply(env.invalidId, { error: new RpcError(RpcCode.invalidRequest, "Invalid request") });
      } else {
        this.#dispatch(env.req, env.id);
      }
      if (this.#closed || this.server.paused) break;
    }
    this.#flushSoon();
  }

  /** Closes at once; replies still owed are lost. */
  drop(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#queue = [];
    this.sock.destroy();
  }

  #dispatch(req: RpcRequest, id: string | null): void {
    const spec = this.server.opts.methods.get(req.method);
    if (!spec) {
      this.#reply(id, { error: new RpcError(RpcCode.methodNotFound, "Method not found") });
      return;
    }
    const state = this.server.opts.state();
    if (!spec.states.includes(state)) {
      const msg = state === "startup" ? RUNTIME_ONLY_MSG : STARTUP_ONLY_MSG;
      this.#reply(id, { error: new RpcError(RpcCode.invalidState, msg) });
      return;
    }
    let out: unknown;
    try {
      out = spec.handler(req, this.server.context());
    } catch (err) {
      this.#reply(id, { error: this.#asRpcError(req, err) });
      return;
    }
    if (out instanceof Promise) {
      out.then(
        (result: unknown) => this.#reply(id, { result }, true),
        (err: unknown) => this.#reply(id, { error: this.#asRpcError(req, err) }, true),
      );
    } else {
      this.#reply(id, { result: out });
    }
  }

  #asRpcError(req: RpcRequest, err: unknown): RpcError {
    if (err instanceof RpcError) return err;
    if (err instanceof ErrnoError) return RpcError.errno(err.errno);
    this.server.opts.logger.error("emulated method failed unexpectedly", {
      method: req.method,
      err: String(err),
    });
    return RpcError.internal();
  }

  /**
   * Queues a reply. An id-less request's success reply carries v25.05.1's bug: only the last
   * writer chunk is sent, without the closing brace and newline.
   */
  #reply(id: string | null, body: { result?: unknown; error?: RpcError }, late = false): void {
    if (this.#closed) {
      if (late) this.server.opts.logger.debug("reply dropped: connection closed");
      return;
    }
    let text: string;
    if (body.error) {
      const e = body.error;
      text = `{"jsonrpc":"2.0","id":${id ?? "null"},"error":${JSON.stringify({ code: e.code, message: e.message })}}\n`;
    } else if (id === null) {
      const whole = Buffer.from(`{"jsonrpc":"2.0","id":null,"result":${resultJson(body.result)}`);
      const cut = Math.floor((whole.length - 1) / WRITER_CHUNK) * WRITER_CHUNK;
      text = whole.subarray(cut).toString("utf8");
    } else {
      text = `{"jsonrpc":"2.0","id":${id},"result":${resultJson(body.result)}}\n`;
    }
    this.#queue.push(text);
    if (late) this.#flushSoon();
  }

  #flushSoon(): void {
    if (this.server.polled) {
      // The next poll's send phase writes them.
      if (this.#queue.length > 0) this.server.wake();
      return;
    }
    if (this.#flushScheduled || this.#queue.length === 0) return;
    this.#flushScheduled = true;
    // Replies go out on the next poll, not inside the parse loop: a parse error later in the
    // same read therefore loses them, as on a real target.
    setImmediate(() => {
      this.#flushScheduled = false;
      this.#send();
    });
  }

  #send(): void {
    if (this.#closed || this.#queue.length === 0) return;
    const out = this.#queue.join("");
    this.#queue = [];
    this.sock.write(out);
  }
}

/**
 * The JSON-RPC envelope checks of SPDK's parse_single_request: a request object with only
 * jsonrpc ("2.0" when present), method (string), id (string, number or null) and params (object,
 * array or null), no key twice. A failure carries the id to answer with: null, except for bad
 * params, which are checked after the id was taken.
 */
function parseEnvelope(
  value: JsonValue,
  members: readonly TopMember[] | undefined,
  duplicateKeys: boolean,
): { req: RpcRequest; id: string | null } | { invalidId: string | null } {
  if (!members) return { invalidId: null };
  const keys = members.map((m) => m.key);
  if (new Set(keys).size !== keys.length) return { invalidId: null };
  if (keys.some((k) => !["jsonrpc", "method", "id", "params"].includes(k))) return { invalidId: null };
  const obj = value as { [key: string]: JsonValue };
  if ("jsonrpc" in obj && obj.jsonrpc !== "2.0") return { invalidId: null };
  if (typeof obj.method !== "string") return { invalidId: null };
  let id: string | null = null;
  if ("id" in obj) {
    const raw = obj.id;
    if (raw !== null && typeof raw !== "string" && typeof raw !== "number") return { invalidId: null };
    // Numbers are echoed exactly as written (1.5e3, -0); strings re-encoded from their value.
    if (typeof raw === "string") id = JSON.stringify(raw);
    else if (typeof raw === "number") id = members.find((m) => m.key === "id")?.raw ?? String(raw);
  }
  let params: JsonValue | undefined;
  if ("params" in obj && obj.params !== null) {
    if (typeof obj.params !== "object") return { invalidId: id };
    params = obj.params;
  }
  return { req: { method: obj.method, params, duplicateKeys }, id };
}

/** The escaped form of DUPLICATE_KEY_PREFIX as JSON.stringify writes it in a key. */
const DUPLICATE_KEY_JSON = JSON.stringify(DUPLICATE_KEY_PREFIX).slice(0, -1);

/**
 * A result as JSON text. Keys carrying DUPLICATE_KEY_PREFIX are written without it, which is how
 * a reply repeats a key as SPDK's bdev_raid_get_bdevs does ("uuid" twice).
 */
function resultJson(result: unknown): string {
  const text = JSON.stringify(result);
  return text.includes(DUPLICATE_KEY_JSON) ? text.replaceAll(DUPLICATE_KEY_JSON, '"') : text;
}
