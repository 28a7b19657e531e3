// The emulated RPC server's clock, stepped poll by poll through an injected timer: a reply leaves
// one poll after its request is received, each poll accepts one connection, a pipelined batch is
// answered in one poll, and an asynchronous method's reply waits for the poll after it completes
// (lib/jsonrpc/jsonrpc_server_tcp.c spdk_jsonrpc_server_poll: accept, then send before recv).
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "../../../lib/log.ts";
import { ANY_STATE, type MethodSpec } from "./method-table.ts";
import { RawRpcConnection } from "./raw-rpc-client.ts";
import { type PollTimer, RPC_POLL_MS, RpcServer } from "./rpc-server.ts";

/** A poller clock that only moves when the test says so. */
class SteppedTimer implements PollTimer {
  #now = 0;
  #pending: { at: number; fn: () => void } | undefined;
  now(): number {
    return this.#now;
  }
  after(ms: number, fn: () => void): () => void {
    const entry = { at: this.#now + ms, fn };
    this.#pending = entry;
    return () => {
      if (this.#pending === entry) this.#pending = undefined;
    };
  }
  get armed(): boolean {
    return this.#pending !== undefined;
  }
  /** Runs the next poll; throws when none is due (the server has nothing to do). */
  poll(): void {
    const p = this.#pending;
    if (!p) throw new Error("no poll is armed");
    this.#pending = undefined;
    this.#now = p.at;
    p.fn();
  }
}

/** Lets socket I/O already in flight land (bytes written before this point arrive). */
async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  await Bun.sleep(5);
}

/** Waits, bounded, until the timer is armed: the server saw the bytes or the connection. */
async function untilArmed(t: SteppedTimer): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!t.armed) {
    if (Date.now() > deadline) throw new Error("the server never asked for a poll");
    await Bun.sleep(1);
  }
}

let root: string | undefined;
let server: RpcServer | undefined;
afterEach(async () => {
  await server?.stop(false);
  if (root) rmSync(root, { recursive: true, force: true });
});

let asyncDone: (() => void) | undefined;
const METHODS: MethodSpec[] = [
  { name: "sync", states: ANY_STATE, handler: () => 1 },
  {
    name: "async",
    states: ANY_STATE,
    handler: () =>
      new Promise((resolve) => {
        asyncDone = () => resolve(2);
      }),
  },
];

async function start(): Promise<{ timer: SteppedTimer; path: string }> {
  root = mkdtempSync(join(tmpdir(), "distort-rpc-clock-"));
  const timer = new SteppedTimer();
  const path = join(root, "spdk.sock");
  server = new RpcServer({
    socketPath: path,
    logger: silentLogger,
    methods: new Map(METHODS.map((m) => [m.name, m])),
    state: () => "runtime",
    asyncDelayMs: 0,
    pollMs: RPC_POLL_MS,
    pollTimer: timer,
  });
  await server.start();
  return { timer, path };
}

const req = (method: string, id: number) => JSON.stringify({ jsonrpc: "2.0", method, id });

test("a call costs two polls: accepted and received in the first, answered in the second", async () => {
  const { timer, path } = await start();
  const c = await RawRpcConnection.connect(path);
  c.send(req("sync", 1));
  await untilArmed(timer);
  await settle();
  timer.poll(); // accept, recv, dispatch: the reply is queued, not sent
  await settle();
  expect(c.received).toBe("");
  expect(timer.armed).toBe(true);
  timer.poll(); // send
  expect(await c.replies(1)).toEqual([{ jsonrpc: "2.0", id: 1, result: 1 }]);
  await settle();
  expect(timer.armed).toBe(false); // idle: no poll is scheduled
  c.close();
});

test("one accept per poll: the second of two connections is served a poll later", async () => {
  const { timer, path } = await start();
  const a = await RawRpcConnection.connect(path);
  const b = await RawRpcConnection.connect(path);
  a.send(req("sync", 1));
  b.send(req("sync", 2));
  await untilArmed(timer);
  await settle();
  timer.poll(); // accepts a; a's request received
  timer.poll(); // a answered; accepts b; b's request received
  expect(await a.replies(1)).toEqual([{ jsonrpc: "2.0", id: 1, result: 1 }]);
  await settle();
  expect(b.received).toBe("");
  timer.poll(); // b answered
  expect(await b.replies(1)).toEqual([{ jsonrpc: "2.0", id: 2, result: 1 }]);
  a.close();
  b.close();
});

test("pipelined requests in one recv are answered together in the next poll", async () => {
  const { timer, path } = await start();
  const c = await RawRpcConnection.connect(path);
  c.send(req("sync", 1) + req("sync", 2) + req("sync", 3));
  await untilArmed(timer);
  await settle();
  timer.poll();
  timer.poll();
  const replies = (await c.replies(3)) as { id: number }[];
  expect(replies.map((r) => r.id)).toEqual([1, 2, 3]);
  c.close();
});

test("an asynchronous method's reply goes out at the first poll after it completes", async () => {
  const { timer, path } = await start();
  const c = await RawRpcConnection.connect(path);
  c.send(req("async", 7));
  await untilArmed(timer);
  await settle();
  timer.poll(); // received; the handler is pending
  await settle();
  expect(timer.armed).toBe(false); // nothing to send yet
  asyncDone?.();
  await untilArmed(timer); // completion asks for a poll
  expect(c.received).toBe("");
  timer.poll();
  expect(await c.replies(1)).toEqual([{ jsonrpc: "2.0", id: 7, result: 2 }]);
  c.close();
});

test("malformed JSON after a good request in the same recv: both are lost with the connection", async () => {
  const { timer, path } = await start();
  const c = await RawRpcConnection.connect(path);
  c.send(`${req("sync", 1)}{"jsonrpc":`);
  c.send("]");
  await untilArmed(timer);
  await settle();
  timer.poll();
  expect(await c.waitClosed()).toBe(true);
  expect(c.received).toBe("");
});
