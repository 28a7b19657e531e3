// The SPDK JSON-RPC client: one persistent unix-socket connection per client, requests multiplexed
// by integer id, replies matched in completion order, per-call timeouts, reconnect with backoff, and
// a keyed FIFO mutex for callers that serialise mutations of one SPDK object.

import { createConnection, type Socket } from "node:net";
import * as v from "valibot";
import { type Clock, realClock } from "../clock.ts";
import { KeyedMutex } from "../concurrency/keyed-mutex.ts";
import { StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import { SpdkError } from "./errors.ts";
import { JsonObjectStream, StreamFramingError } from "./json-stream.ts";

/** Per-call options. */
export interface CallOptions {
  /** Overrides the client's callTimeoutMs for this call. */
  timeoutMs?: number;
  /** Aborting rejects the call with StorageError("timeout"); SPDK may still carry it out. */
  signal?: AbortSignal;
}

/**
 * What typed wrappers (SpdkMethods) need from a client: the port the agent and the DPU plugin
 * receive, so tests can substitute a recording fake.
 */
export interface SpdkRpc {
  /** Sends one request; resolves with its `result`, rejects with SpdkError or StorageError. */
  call(method: string, params?: object, opts?: CallOptions): Promise<unknown>;
  /** Runs `fn` with exclusive use of `key` among serialize() callers (FIFO, not reentrant). */
  serialize<T>(key: string, fn: () => Promise<T>): Promise<T>;
  /**
   * Identifies the established connection: a new value after every reconnect, undefined while
   * none is established. A restarted target is only ever reached over a new connection, so state
   * read under one value is state of one target incarnation. Implementations that cannot tell
   * leave it undefined, and callers then reuse nothing (TargetFacts).
   */
  readonly connectionGeneration?: number | undefined;
}

export interface SpdkClientOptions {
  /** The application's RPC socket, e.g. /var/tmp/spdk.sock. */
  socketPath: string;
  logger: Logger;
  clock?: Clock;
  /** Default per-call deadline, also bounding connect(). Default 30000. */
  callTimeoutMs?: number;
  /**
   * Largest serialized request. Default 32768: SPDK up to v26.01 receives into a 32 KiB buffer and
   * drops a connection whose request does not fit, without any reply.
   */
  maxRequestBytes?: number;
  /**
   * Most JSON values (objects, arrays, their ends, member names, scalars) in one request. Default
   * 1024, SPDK's limit up to v26.01; beyond it SPDK treats the request as a parse error and closes
   * the connection without a reply.
   */
  maxRequestValues?: number;
  /** Delay before reconnecting after consecutive failures; doubles up to maxMs. Default 100/5000. */
  reconnect?: { initialMs: number; maxMs: number };
}

/** Why a connection ended; carried in the details of the StorageErrors it causes. */
export type DropReason =
  | "connect-failed"
  | "closed-by-server"
  | "socket-error"
  | "malformed"
  | "unknown-id"
  | "wedged";

const OptionsSchema = v.object({
  socketPath: v.pipe(v.string(), v.minLength(1, "socketPath must not be empty")),
  callTimeoutMs: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1)), 30_000),
  maxRequestBytes: v.optional(v.pipe(v.number(), v.integer(), v.minValue(64)), 32_768),
  maxRequestValues: v.optional(v.pipe(v.number(), v.integer(), v.minValue(8)), 1024),
  reconnect: v.optional(
    v.pipe(
      v.object({
        initialMs: v.pipe(v.number(), v.integer(), v.minValue(0)),
        maxMs: v.pipe(v.number(), v.integer(), v.minValue(0)),
      }),
      v.check((r) => r.maxMs >= r.initialMs, "reconnect.maxMs must be >= reconnect.initialMs"),
    ),
    { initialMs: 100, maxMs: 5000 },
  ),
});

// Only the envelope is checked here; `result` is the wrapper's business.
const ReplySchema = v.looseObject({
  id: v.optional(v.nullable(v.union([v.number(), v.string()]))),
  error: v.optional(
    v.looseObject({
      code: v.pipe(v.number(), v.integer()),
      message: v.string(),
    }),
  ),
});

// SPDK grows a reply buffer up to 32 MiB; anything larger is not SPDK talking.
const MAX_REPLY_BYTES = 64 * 1024 * 1024;
// Ids of calls that timed out but whose reply may still come. Past this many, the connection is
// treated as wedged and dropped rather than remembering ids forever.
const MAX_ABANDONED = 1024;

interface Connection {
  readonly gen: number;
  readonly sock: Socket;
  readonly stream: JsonObjectStream;
  /** Ids sent on this connection whose caller gave up; their replies are discarded silently. */
  readonly abandoned: Set<number>;
  ready: boolean;
  closed: boolean;
  cancelConnectTimer: () => void;
}

interface Pending {
  readonly id: number;
  readonly method: string;
  readonly params: object | undefined;
  readonly text: string;
  readonly resolve: (value: unknown) => void;
  readonly reject: (err: unknown) => void;
  /** Generation of the connection the request was written to; 0 while waiting for one. */
  sentOn: number;
  cleanup: () => void;
}

/**
 * A JSON-RPC 2.0 client for one SPDK application socket.
 *
 * Connection: lazy; exactly one at a time, shared by all calls. It is node:net rather than
 * Bun.connect: node:net buffers writes that the kernel does not take at once (Bun.connect's
 * write() returns a short count and leaves the rest to the caller) and reports peer close, errors
 * and connect failures as ordinary events, on Bun and Node alike.
 *
 * Calls: every request carries a fresh integer id (an id-less request makes SPDK v25.05.1 send a
 * cut-off reply that corrupts the stream) and `params` only when non-empty (several methods reject
 * `{}`). Calls are pipelined and complete in the order SPDK finishes them. Requests over
 * maxRequestBytes or maxRequestValues are refused with "invalid" before anything is written.
 *
 * Failures: an error reply rejects that call with SpdkError. Output that breaks framing, a reply
 * without id or with an id never sent means the stream cannot be trusted: every pending call fails
 * with "unavailable", the connection is dropped, and the next call reconnects. A server close does
 * the same (SPDK drops replies still owed when it closes). After two or more consecutive failures
 * the next connect waits initialMs, doubling up to maxMs; a reply received resets the count. A
 * call's deadline rejects it with "timeout" and its late reply is discarded; SPDK may still
 * complete the operation, so callers re-read state before retrying a mutation.
 *
 * Thread-safety: JS is single-threaded; any number of concurrent calls is safe.
 */
export class SpdkClient implements SpdkRpc {
  readonly #path: string;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #callTimeoutMs: number;
  readonly #maxRequestBytes: number;
  readonly #maxRequestValues: number;
  readonly #reconnect: { initialMs: number; maxMs: number };
  readonly #mutex = new KeyedMutex();
  readonly #pending = new Map<number, Pending>();
  #conn: Connection | undefined;
  #connecting = false;
  #gen = 0;
  #nextId = 1;
  #outbox: string[] = [];
  #flushScheduled = false;
  #failures = 0;
  #lastFailureAt = 0;
  #closed = false;
  readonly #backoffAbort = new AbortController();

  /** Throws StorageError("invalid") for unusable options. Opens nothing until the first call. */
  constructor(opts: SpdkClientOptions) {
    const parsed = v.safeParse(OptionsSchema, {
      socketPath: opts.socketPath,
      callTimeoutMs: opts.callTimeoutMs,
      maxRequestBytes: opts.maxRequestBytes,
      maxRequestValues: opts.maxRequestValues,
      reconnect: opts.reconnect,
    });
    if (!parsed.success) {
      const issue = parsed.issues[0];
      throw new StorageError(
        "invalid",
        `SpdkClient options: ${v.getDotPath(issue) ?? "<root>"}: ${issue.message}`,
      );
    }
    this.#path = parsed.output.socketPath;
    this.#callTimeoutMs = parsed.output.callTimeoutMs;
    this.#maxRequestBytes = parsed.output.maxRequestBytes;
    this.#maxRequestValues = parsed.output.maxRequestValues;
    this.#reconnect = parsed.output.reconnect;
    this.#clock = opts.clock ?? realClock;
    this.#log = opts.logger.with({ component: "spdk-client", socket: this.#path });
  }

  /** True while a connection is established (not while connecting). */
  get connected(): boolean {
    return this.#conn?.ready === true;
  }

  /** See SpdkRpc.connectionGeneration: the established connection's number, counting from 1. */
  get connectionGeneration(): number | undefined {
    return this.#conn?.ready ? this.#conn.gen : undefined;
  }

  /**
   * Sends `method` with `params` and resolves with the reply's `result`. Rejects with:
   * SpdkError for an error reply (kind from classifySpdkError); StorageError "invalid" for a bad
   * method name, unserialisable or oversized request (nothing sent); "timeout" when the deadline
   * passes or `signal` aborts; "unavailable" when SPDK cannot be reached, the connection is lost
   * or the stream goes bad, or the client is closed. Never idempotent by itself: after "timeout"
   * or "unavailable" the operation may or may not have happened.
   */
  call(method: string, params?: object, opts: CallOptions = {}): Promise<unknown> {
    if (this.#closed) {
      return Promise.reject(new StorageError("unavailable", `SPDK client for ${this.#path} is closed`));
    }
    if (typeof method !== "string" || method.length === 0) {
      return Promise.reject(new StorageError("invalid", "SPDK method name must be a non-empty string"));
    }
    const timeoutMs = opts.timeoutMs ?? this.#callTimeoutMs;
    if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
      return Promise.reject(
        new StorageError("invalid", `${method}: timeoutMs must be > 0, got ${timeoutMs}`),
      );
    }
    const id = this.#nextId++;
    const request: Record<string, unknown> = { jsonrpc: "2.0", method, id };
    if (params !== undefined && params !== null && !isEmpty(params)) request.params = params;
    let text: string;
    try {
      text = JSON.stringify(request);
    } catch (err) {
      return Promise.reject(
        new StorageError(
          "invalid",
          `${method}: params cannot be serialised to JSON: ${(err as Error).message}`,
          {
            cause: err,
          },
        ),
      );
    }
    const bytes = Buffer.byteLength(text);
    if (bytes > this.#maxRequestBytes) {
      return Promise.reject(
        new StorageError(
          "invalid",
          `${method}: request is ${bytes} bytes, over the ${this.#maxRequestBytes}-byte limit (SPDK up to v26.01 drops larger requests without a reply)`,
          { details: { method, bytes } },
        ),
      );
    }
    const values = countJsonValues(JSON.parse(text));
    if (values > this.#maxRequestValues) {
      return Promise.reject(
        new StorageError(
          "invalid",
          `${method}: request holds ${values} JSON values, over SPDK's limit of ${this.#maxRequestValues} (it would close the connection without a reply)`,
          { details: { method, values } },
        ),
      );
    }
    if (opts.signal?.aborted) return Promise.reject(this.#abortError(method, id, opts.signal));

    return new Promise<unknown>((resolve, reject) => {
      const p: Pending = {
        id,
        method,
        params: request.params as object | undefined,
        text,
        resolve,
        reject,
        sentOn: 0,
        cleanup: () => {},
      };
      const cancelTimer = this.#clock.setTimeout(
        () =>
          this.#giveUp(
            p,
            new StorageError(
              "timeout",
              `${method} (id ${id}): no reply from SPDK within ${timeoutMs} ms; SPDK may still complete it, re-read state before retrying`,
              { details: { method, id, timeoutMs } },
            ),
          ),
        timeoutMs,
      );
      const signal = opts.signal;
      const onAbort = () => this.#giveUp(p, this.#abortError(method, id, signal as AbortSignal));
      signal?.addEventListener("abort", onAbort, { once: true });
      p.cleanup = () => {
        cancelTimer();
        signal?.removeEventListener("abort", onAbort);
      };
      this.#pending.set(id, p);
      this.#log.debug("spdk call", { method, id });
      if (this.#conn?.ready) this.#write(this.#conn, p);
      else this.#ensureConnection();
    });
  }

  /**
   * Runs `fn` once every earlier serialize() task under `key` has finished (FIFO); tasks under
   * other keys run concurrently. Not reentrant: calling serialize() with the same key from inside
   * `fn` deadlocks. The outcome of `fn` is passed through; a failure releases the key.
   */
  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.#mutex.run(key, fn);
  }

  /**
   * Fails every pending call with "unavailable", closes the connection and refuses later calls.
   * Idempotent; resolves once the socket is closed.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#backoffAbort.abort();
    const conn = this.#conn;
    this.#conn = undefined;
    this.#connecting = false;
    this.#outbox = [];
    this.#failAll((p) => new StorageError("unavailable", `${p.method} (id ${p.id}): SPDK client closed`));
    if (!conn) return;
    conn.cancelConnectTimer();
    if (conn.closed) return;
    await new Promise<void>((resolve) => {
      conn.sock.once("close", () => resolve());
      conn.sock.destroy();
    });
  }

  #abortError(method: string, id: number, signal: AbortSignal): StorageError {
    const reason = signal.reason;
    const why = reason instanceof Error ? `: ${reason.message}` : "";
    return new StorageError("timeout", `${method} (id ${id}) cancelled by the caller${why}`, {
      cause: reason,
      details: { method, id },
    });
  }

  /** The caller stops waiting; a reply that still comes for this id is dropped silently. */
  #giveUp(p: Pending, err: StorageError): void {
    if (this.#pending.get(p.id) !== p) return;
    this.#pending.delete(p.id);
    p.cleanup();
    const conn = this.#conn;
    if (conn && p.sentOn === conn.gen) {
      conn.abandoned.add(p.id);
      if (conn.abandoned.size > MAX_ABANDONED) {
        this.#drop(conn, "wedged", `${conn.abandoned.size} calls got no reply; the connection looks wedged`);
      }
    }
    p.reject(err);
  }

  #write(conn: Connection, p: Pending): void {
    p.sentOn = conn.gen;
    this.#outbox.push(p.text);
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    // Requests issued in the same turn go out in one write: fewer syscalls, same byte stream.
    queueMicrotask(() => {
      this.#flushScheduled = false;
      const out = this.#outbox;
      this.#outbox = [];
      if (out.length === 0 || this.#conn !== conn || !conn.ready) return;
      conn.sock.write(out.join(""));
    });
  }

  #ensureConnection(): void {
    if (this.#connecting || this.#conn || this.#closed) return;
    this.#connecting = true;
    void this.#connect();
  }

  #backoffMs(): number {
    // One failure (a restart, a dropped stream) reconnects at once; repeated ones back off.
    if (this.#failures < 2) return 0;
    const { initialMs, maxMs } = this.#reconnect;
    const delay = Math.min(maxMs, initialMs * 2 ** Math.min(this.#failures - 2, 30));
    return Math.max(0, this.#lastFailureAt + delay - this.#clock.now());
  }

  async #connect(): Promise<void> {
    const wait = this.#backoffMs();
    if (wait > 0) {
      this.#log.debug("spdk reconnect backoff", { waitMs: wait, failures: this.#failures });
      try {
        await this.#clock.sleep(wait, this.#backoffAbort.signal);
      } catch {
        return; // closed meanwhile; close() has failed the pending calls
      }
    }
    if (this.#closed) return;
    const gen = ++this.#gen;
    const sock = createConnection({ path: this.#path });
    const conn: Connection = {
      gen,
      sock,
      stream: new JsonObjectStream({ maxValueBytes: MAX_REPLY_BYTES }),
      abandoned: new Set(),
      ready: false,
      closed: false,
      cancelConnectTimer: () => {},
    };
    this.#conn = conn;
    conn.cancelConnectTimer = this.#clock.setTimeout(
      () => this.#drop(conn, "connect-failed", `no connection within ${this.#callTimeoutMs} ms`),
      this.#callTimeoutMs,
    );
    sock.once("connect", () => {
      conn.cancelConnectTimer();
      if (this.#conn !== conn) return;
      conn.ready = true;
      this.#connecting = false;
      this.#log.debug("spdk connected", { gen });
      for (const p of this.#pending.values()) if (p.sentOn === 0) this.#write(conn, p);
    });
    sock.on("data", (chunk: Buffer) => this.#onData(conn, chunk));
    sock.on("error", (err: Error) =>
      this.#drop(conn, conn.ready ? "socket-error" : "connect-failed", err.message),
    );
    sock.on("close", () => {
      conn.closed = true;
      const partial = conn.stream.pendingBytes;
      this.#drop(
        conn,
        conn.ready ? "closed-by-server" : "connect-failed",
        partial > 0
          ? `the server closed the connection in the middle of a reply (${partial} bytes)`
          : "the server closed the connection",
      );
    });
  }

  #onData(conn: Connection, chunk: Buffer): void {
    if (this.#conn !== conn) return;
    try {
      conn.stream.push(chunk, (value) => {
        if (this.#conn === conn) this.#onReply(conn, value);
      });
    } catch (err) {
      if (!(err instanceof StreamFramingError)) throw err;
      this.#drop(conn, "malformed", `malformed output from SPDK: ${err.message}`);
    }
  }

  #onReply(conn: Connection, value: unknown): void {
    const parsed = v.safeParse(ReplySchema, value);
    if (!parsed.success) {
      const issue = parsed.issues[0];
      this.#drop(
        conn,
        "malformed",
        `malformed reply from SPDK: ${v.getDotPath(issue) ?? "<root>"}: ${issue.message}`,
      );
      return;
    }
    const { id, error } = parsed.output;
    if (id === undefined || id === null) {
      const what = error ? ` (error ${error.code} "${error.message}")` : "";
      this.#drop(conn, "malformed", `SPDK sent a reply without id${what}; replies can no longer be matched`);
      return;
    }
    const p = typeof id === "number" ? this.#pending.get(id) : undefined;
    if (!p || p.sentOn !== conn.gen) {
      if (typeof id === "number" && conn.abandoned.delete(id)) {
        this.#log.debug("spdk late reply discarded", { id });
        return;
      }
      this.#drop(
        conn,
        "unknown-id",
        `SPDK sent a reply for id ${JSON.stringify(id)}, which no pending call has`,
      );
      return;
    }
    if (!error && !Object.hasOwn(value as object, "result")) {
      this.#drop(conn, "malformed", `SPDK reply for id ${id} carries neither result nor error`);
      return;
    }
    this.#pending.delete(p.id);
    p.cleanup();
    this.#failures = 0;
    if (error) p.reject(new SpdkError(p.method, error.code, error.message, { params: p.params }));
    else p.resolve((value as { result: unknown }).result);
  }

  /** Ends `conn` (if still current) and fails every pending call with "unavailable". */
  #drop(conn: Connection, reason: DropReason, why: string): void {
    if (this.#conn !== conn) return;
    this.#conn = undefined;
    this.#connecting = false;
    this.#outbox = [];
    conn.cancelConnectTimer();
    conn.sock.destroy();
    this.#failures++;
    this.#lastFailureAt = this.#clock.now();
    const failed = this.#failAll((p) => {
      const details = { method: p.method, id: p.id, socketPath: this.#path, reason };
      if (reason === "connect-failed") {
        return new StorageError("unavailable", `${p.method}: cannot reach SPDK at ${this.#path}: ${why}`, {
          details,
        });
      }
      return new StorageError(
        "unavailable",
        `${p.method} (id ${p.id}): SPDK connection lost before the reply: ${why}; the request may still have been carried out, re-read state before retrying`,
        { details },
      );
    });
    this.#log.warn("spdk connection dropped", { reason, why, failedCalls: failed, failures: this.#failures });
  }

  #failAll(errorFor: (p: Pending) => StorageError): number {
    const all = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of all) {
      p.cleanup();
      p.reject(errorFor(p));
    }
    return all.length;
  }
}

function isEmpty(params: object): boolean {
  if (Array.isArray(params)) return params.length === 0;
  for (const k in params) {
    if ((params as Record<string, unknown>)[k] !== undefined) return false;
  }
  return true;
}

/**
 * Counts JSON values the way SPDK's parser does: each scalar, each member name, and the begin and
 * end of every object and array.
 */
export function countJsonValues(value: unknown): number {
  if (Array.isArray(value)) {
    let n = 2;
    for (const el of value) n += countJsonValues(el);
    return n;
  }
  if (value !== null && typeof value === "object") {
    let n = 2;
    for (const el of Object.values(value)) n += 1 + countJsonValues(el);
    return n;
  }
  return 1;
}
