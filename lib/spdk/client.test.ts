// SpdkClient against purpose-built fake SPDK servers on real unix sockets: multiplexing and id
// matching, framing under any chunking, every way the stream or the connection can fail, deadlines,
// reconnect backoff, request limits, and the keyed mutex.

import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock, settle } from "../clock.ts";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { seededRandom, shuffled } from "../seeded-random.ts";
import { SpdkClient, type SpdkClientOptions } from "./client.ts";
import { SpdkError } from "./errors.ts";
import { FakeSpdkServer, loadTranscript, type RequestHandler, type WireRequest } from "./testing.ts";

const root = await mkdtemp(join(tmpdir(), "distort-spdk-client-"));
afterAll(() => rm(root, { recursive: true, force: true }));

const records = loadTranscript();
const rawResponse = (seq: number) =>
  (records.find((r) => r.seq === seq) as { raw_response: string }).raw_response;

let sockets = 0;
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

async function setup(opts: Partial<SpdkClientOptions> = {}, handler?: RequestHandler) {
  const server = await FakeSpdkServer.start(root, `s${++sockets}.sock`, handler);
  const client = new SpdkClient({ socketPath: server.path, logger: silentLogger, ...opts });
  cleanups.push(async () => {
    await client.close();
    await server.close();
  });
  return { server, client };
}

/** Answers every request with its own method and params. */
const echo: RequestHandler = (req, conn) =>
  conn.reply(req.id, { method: req.method, params: req.params ?? null });

const realTick = (ms = 0) => new Promise((r) => setTimeout(r, ms));

async function failure(p: Promise<unknown>): Promise<StorageError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof StorageError)) throw new Error(`expected a StorageError, got ${String(err)}`);
  return err;
}

describe("multiplexing", () => {
  test("1000 concurrent calls share one connection and each gets its own reply, answered in shuffled order", async () => {
    const random = seededRandom(42);
    let replyOrder: unknown[] = [];
    const { server, client } = await setup({}, (_req, conn) => {
      if (conn.requests.length < 1000) return;
      const order = shuffled(conn.requests, random);
      replyOrder = order.map((r) => r.id);
      const text = order
        .map(
          (r) =>
            `${JSON.stringify({ jsonrpc: "2.0", id: r.id, result: { n: (r.params as { n: number }).n } })}\n`,
        )
        .join("");
      // Cut the reply stream at arbitrary points, not at reply boundaries.
      for (let i = 0; i < text.length; ) {
        const len = 1 + Math.floor(random() * 5000);
        conn.write(text.slice(i, i + len));
        i += len;
      }
    });
    const started = performance.now();
    const results = await Promise.all(Array.from({ length: 1000 }, (_, n) => client.call("echo", { n })));
    const elapsedMs = performance.now() - started;

    expect(results).toEqual(Array.from({ length: 1000 }, (_, n) => ({ n })));
    expect(server.connections).toHaveLength(1);
    const ids = server.requests.map((r) => r.id);
    expect(new Set(ids).size).toBe(1000);
    expect(ids.every((id) => Number.isSafeInteger(id))).toBe(true);
    expect(replyOrder).not.toEqual(ids); // the shuffle really reordered the replies
    expect(elapsedMs).toBeLessThan(3000);
  });

  test("replies arrive in completion order: a sync call overtakes an async one (as seq 152 showed)", async () => {
    const { server, client } = await setup({}, (req, conn) => {
      if (req.method !== "spdk_get_version") return;
      const addNs = conn.requests.find((r) => r.method === "nvmf_subsystem_add_ns") as WireRequest;
      conn.reply(req.id, { version: "SPDK v25.05.1" });
      setTimeout(() => conn.reply(addNs.id, 3), 5);
    });
    const settledOrder: string[] = [];
    const addNs = client
      .call("nvmf_subsystem_add_ns", {
        nqn: "nqn.2016-06.io.spdk:cnode1",
        namespace: { bdev_name: "Malloc1" },
      })
      .then((r) => {
        settledOrder.push("add_ns");
        return r;
      });
    const version = client.call("spdk_get_version").then((r) => {
      settledOrder.push("version");
      return r;
    });
    expect(await Promise.all([addNs, version])).toEqual([3, { version: "SPDK v25.05.1" }]);
    expect(settledOrder).toEqual(["version", "add_ns"]);
    expect(server.connections).toHaveLength(1);
  });

  test("a reply written one byte at a time is reassembled", async () => {
    const { client } = await setup({}, (req, conn) => {
      const text = `${JSON.stringify({ jsonrpc: "2.0", id: req.id, result: { name: "Malloc0", note: 'é}{\\"' } })}\n`;
      void (async () => {
        for (const byte of Buffer.from(text)) {
          conn.write(Uint8Array.of(byte));
          await realTick();
        }
      })();
    });
    expect(await client.call("bdev_get_bdevs")).toEqual({ name: "Malloc0", note: 'é}{\\"' });
  });

  test("several replies in one chunk: SPDK's own bytes from seq 146, ids rewritten", async () => {
    const { server, client } = await setup({}, (_req, conn) => {
      if (conn.requests.length < 3) return;
      const [r1, r2, r3] = conn.requests.map((r) => r.id);
      conn.write(
        rawResponse(146)
          .replace('"id":"r1"', `"id":${r1}`)
          .replace('"id":"r2"', `"id":${r2}`)
          .replace('"id":"r3"', `"id":${r3}`),
      );
    });
    const lvstores = client.call("bdev_lvol_get_lvstores");
    const missing = failure(client.call("this_method_does_not_exist"));
    const version = client.call("spdk_get_version");
    expect(await lvstores).toEqual([
      {
        uuid: "782d72f1-c0a2-49e9-87b0-427b850e7db1",
        name: "lvs0",
        base_bdev: "Malloc0",
        total_data_clusters: 15,
        free_clusters: 3,
        block_size: 4096,
        cluster_size: 4194304,
      },
    ]);
    const err = await missing;
    expect(err).toBeInstanceOf(SpdkError);
    expect((err as SpdkError).code).toBe(-32601);
    expect(err.kind).toBe("unimplemented");
    expect(await version).toMatchObject({ version: "SPDK v25.05.1 git sha1 44b23be7c3" });
    expect(server.connections).toHaveLength(1);
  });

  test("an error reply rejects only its call with SpdkError and keeps the connection", async () => {
    const { server, client } = await setup({}, (req, conn) => {
      if (req.method === "bdev_lvol_create") conn.fail(req.id, -17, "File exists");
      else conn.reply(req.id, true);
    });
    const err = await failure(
      client.call("bdev_lvol_create", { lvol_name: "v", size_in_mib: 4, lvs_name: "lvs0" }),
    );
    expect(err).toBeInstanceOf(SpdkError);
    expect(err).toMatchObject({
      kind: "already-exists",
      code: -17,
      method: "bdev_lvol_create",
      spdkMessage: "File exists",
    });
    expect(err.message).toBe('bdev_lvol_create failed: SPDK error -17 "File exists"');
    expect(client.connected).toBe(true);
    expect(await client.call("framework_wait_init")).toBe(true);
    expect(server.connections).toHaveLength(1);
  });
});

describe("what goes on the wire", () => {
  test("every request carries a fresh integer id; none is ever sent without one", async () => {
    const { server, client } = await setup({}, (req, conn) =>
      req.method === "bad" ? conn.fail(req.id, -32602, "Invalid parameters") : conn.reply(req.id, true),
    );
    await client.call("spdk_get_version");
    await client.call("bdev_get_bdevs", { name: "Malloc0" });
    await failure(client.call("bad", { x: 1 }));
    await Promise.all([client.call("a"), client.call("b", {}), client.call("c")]);
    const ids = server.requests.map((r) => r.id);
    expect(ids).toHaveLength(6);
    for (const id of ids) expect(Number.isSafeInteger(id)).toBe(true);
    expect(new Set(ids).size).toBe(6);
    expect(ids).toEqual([...(ids as number[])].sort((a, b) => a - b));
    expect(server.connections[0]?.received).not.toContain('"id":null');
  });

  test("params are omitted when undefined or empty, sent when not", async () => {
    const { server, client } = await setup({}, (req, conn) => conn.reply(req.id, true));
    await client.call("spdk_get_version");
    await client.call("framework_start_init", {});
    await client.call("framework_get_reactors", undefined);
    await client.call("rpc_get_methods", { current: undefined });
    await client.call("bdev_get_bdevs", []);
    await client.call("bdev_get_bdevs", { name: "Malloc0" });
    const [a, b, c, d, e, f] = server.requests;
    for (const r of [a, b, c, d, e])
      expect(Object.keys(r as object).sort()).toEqual(["id", "jsonrpc", "method"]);
    expect(f?.params).toEqual({ name: "Malloc0" });
    // The exact bytes of a params-less request: compact, no params key, no newline.
    expect(
      server.connections[0]?.received.startsWith(
        `{"jsonrpc":"2.0","method":"spdk_get_version","id":${a?.id}}`,
      ),
    ).toBe(true);
  });

  test("a request over 32 KiB is refused before anything is written (SPDK would drop it silently)", async () => {
    const { server, client } = await setup({}, echo);
    const err = await failure(client.call("bdev_get_bdevs", { name: "x".repeat(40 * 1024) }));
    expect(err.kind).toBe("invalid");
    expect(err.message).toMatch(/over the 32768-byte limit/);
    await realTick(20);
    expect(server.connections).toHaveLength(0);
    expect(server.bytesReceived).toBe(0);
    expect(client.connected).toBe(false);
  });

  test("the byte limit is inclusive: a request of exactly maxRequestBytes is sent", async () => {
    const { server, client } = await setup({ maxRequestBytes: 200 }, echo);
    expect((await failure(client.call("m", { s: "x".repeat(200) }))).kind).toBe("invalid");
    // The refused call used id 1; this one gets id 2.
    const overhead = JSON.stringify({ jsonrpc: "2.0", method: "m", id: 2, params: { s: "" } }).length;
    await client.call("m", { s: "x".repeat(200 - overhead) });
    expect(server.bytesReceived).toBe(200);
  });

  test("a request with more JSON values than SPDK parses is refused before anything is written", async () => {
    const { server, client } = await setup({}, echo);
    const err = await failure(client.call("bdev_get_bdevs", { list: Array.from({ length: 1100 }, () => 0) }));
    expect(err.kind).toBe("invalid");
    expect(err.message).toMatch(/JSON values/);
    await realTick(20);
    expect(server.bytesReceived).toBe(0);
  });

  test("params that cannot be serialised are refused as invalid", async () => {
    const { server, client } = await setup({}, echo);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect((await failure(client.call("m", cyclic))).kind).toBe("invalid");
    expect((await failure(client.call("m", { n: 10n }))).kind).toBe("invalid");
    expect((await failure(client.call(""))).kind).toBe("invalid");
    await realTick(20);
    expect(server.bytesReceived).toBe(0);
  });
});

describe("failures of the stream and the connection", () => {
  test("server dies mid-call: pending calls fail as unavailable, the next call reconnects and succeeds", async () => {
    const { server, client } = await setup({}, (req, conn) => {
      if (req.method === "die") conn.destroy();
      if (req.method === "spdk_get_version") conn.reply(req.id, "v25.05.1");
    });
    const slow = failure(client.call("bdev_nvme_attach_controller", { name: "n" }));
    await server.waitForRequests(1);
    const dying = failure(client.call("die"));
    for (const err of [await slow, await dying]) {
      expect(err.kind).toBe("unavailable");
      expect(err.message).toMatch(/connection lost before the reply/);
      expect(err.message).toMatch(/re-read state/);
      expect(err.details.reason).toBe("closed-by-server");
    }
    expect(client.connected).toBe(false);
    expect(await client.call("spdk_get_version")).toBe("v25.05.1");
    expect(server.connections).toHaveLength(2);
  });

  test("a server closing an idle connection (an SPDK restart) costs nothing: the next call reconnects", async () => {
    const { server, client } = await setup({}, (req, conn) => conn.reply(req.id, true));
    await client.call("a");
    server.connections[0]?.destroy();
    for (let i = 0; i < 100 && client.connected; i++) await realTick(2);
    expect(client.connected).toBe(false);
    expect(await client.call("b")).toBe(true);
    expect(server.connections).toHaveLength(2);
  });

  test("connectionGeneration names the established connection: undefined between two, new after a reconnect", async () => {
    const { server, client } = await setup({}, (req, conn) => conn.reply(req.id, true));
    expect(client.connectionGeneration).toBeUndefined();
    await client.call("a");
    const first = client.connectionGeneration;
    expect(first).toBeNumber();
    server.connections[0]?.destroy();
    for (let i = 0; i < 100 && client.connected; i++) await realTick(2);
    expect(client.connectionGeneration).toBeUndefined();
    await client.call("b");
    expect(client.connectionGeneration).toBe((first as number) + 1);
  });

  const garbage: Array<[string, string, RegExp]> = [
    ["invalid JSON", '{"jsonrpc":"2.0","id":1,,}\n', /not valid JSON/],
    ["a fragment starting mid-object (seq 121)", rawResponse(121), /expected "\{"/],
    ["a cut-off reply with the next glued on (seq 120)", rawResponse(120), /newline inside/],
    ["a reply that is not an object", "[1,2,3]\n", /expected "\{"/],
    ["a reply with neither result nor error", '{"jsonrpc":"2.0","id":1}\n', /neither result nor error/],
    [
      "an error object without a code",
      '{"jsonrpc":"2.0","id":1,"error":{"message":"x"}}\n',
      /malformed reply/,
    ],
  ];
  for (const [what, text, why] of garbage) {
    test(`${what}: every pending call fails as unavailable, and the next call reconnects`, async () => {
      let broken = false;
      const { server, client } = await setup({}, (req, conn) => {
        if (!broken && conn.requests.length === 3) {
          broken = true;
          conn.write(text);
        } else if (broken) conn.reply(req.id, "fresh");
      });
      const calls = [client.call("a"), client.call("b"), client.call("c")].map(failure);
      for (const err of await Promise.all(calls)) {
        expect(err.kind).toBe("unavailable");
        expect(err.message).toMatch(why);
        expect(err.details.reason).toBe("malformed");
      }
      expect(await client.call("d")).toBe("fresh");
      expect(server.connections).toHaveLength(2);
    });
  }

  test("a reply for an id nobody sent: the stream is untrusted, all pending calls fail, reconnect after", async () => {
    const { server, client } = await setup({}, (req, conn) => {
      if (conn === server.connections[0]) {
        if (conn.requests.length === 2) conn.reply(999, true);
      } else conn.reply(req.id, "ok");
    });
    const errs = await Promise.all([failure(client.call("a")), failure(client.call("b"))]);
    for (const err of errs) {
      expect(err.kind).toBe("unavailable");
      expect(err.message).toMatch(/id 999/);
      expect(err.details.reason).toBe("unknown-id");
    }
    expect(await client.call("c")).toBe("ok");
    expect(server.connections).toHaveLength(2);
  });

  test("a reply without id (SPDK's -32600 answer carries id null) fails every pending call", async () => {
    const { client } = await setup({}, (_req, conn) =>
      conn.write('{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}\n'),
    );
    const err = await failure(client.call("a"));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toMatch(/without id \(error -32600 "Invalid request"\)/);
  });

  test("nothing listening: unavailable naming the socket, without waiting for the deadline", async () => {
    const client = new SpdkClient({ socketPath: join(root, "nobody.sock"), logger: silentLogger });
    cleanups.push(() => client.close());
    const err = await failure(client.call("spdk_get_version"));
    expect(err.kind).toBe("unavailable");
    expect(err.message).toMatch(/cannot reach SPDK at .*nobody\.sock/);
    expect(err.details.reason).toBe("connect-failed");
  });
});

describe("deadlines", () => {
  test("a call that gets no reply times out; its late reply is discarded and the connection stays usable", async () => {
    const clock = new ManualClock(0);
    const { server, client } = await setup({ clock, callTimeoutMs: 1000 }, (req, conn) => {
      if (req.method !== "slow") conn.reply(req.id, "ok");
    });
    const slow = failure(client.call("slow"));
    await server.waitForRequests(1);
    clock.advance(999);
    await settle();
    clock.advance(1);
    const err = await slow;
    expect(err.kind).toBe("timeout");
    expect(err.message).toMatch(/no reply from SPDK within 1000 ms/);

    const conn = server.connections[0];
    conn?.reply(server.requests[0]?.id, "late");
    expect(await client.call("fast")).toBe("ok");
    expect(client.connected).toBe(true);
    expect(server.connections).toHaveLength(1);
  });

  test("past 1024 calls without a reply the connection counts as wedged and is replaced", async () => {
    const clock = new ManualClock(0);
    const { server, client } = await setup({ clock, callTimeoutMs: 100 }, (req, conn) => {
      if (conn !== server.connections[0]) conn.reply(req.id, "ok");
    });
    const calls = Array.from({ length: 1025 }, () => failure(client.call("stuck")));
    await server.waitForRequests(1025);
    clock.advance(100);
    for (const err of await Promise.all(calls)) expect(err.kind).toBe("timeout");
    expect(client.connected).toBe(false);
    expect(await client.call("fresh")).toBe("ok");
    expect(server.connections).toHaveLength(2);
  });

  test("timeoutMs per call overrides the client default", async () => {
    const clock = new ManualClock(0);
    const { server, client } = await setup({ clock, callTimeoutMs: 60_000 }, () => {});
    const slow = failure(client.call("slow", undefined, { timeoutMs: 50 }));
    await server.waitForRequests(1);
    clock.advance(50);
    expect((await slow).kind).toBe("timeout");
  });

  test("an aborted signal rejects the call; its late reply is discarded", async () => {
    const { server, client } = await setup({}, (req, conn) => {
      if (req.method === "fast") conn.reply(req.id, "ok");
    });
    const ac = new AbortController();
    const call = failure(client.call("slow", undefined, { signal: ac.signal }));
    await server.waitForRequests(1);
    ac.abort(new Error("reconcile cancelled"));
    const err = await call;
    expect(err.kind).toBe("timeout");
    expect(err.message).toMatch(/cancelled by the caller: reconcile cancelled/);
    server.connections[0]?.reply(server.requests[0]?.id, "late");
    expect(await client.call("fast")).toBe("ok");
    expect(server.connections).toHaveLength(1);
    // Already aborted: refused at once, nothing sent.
    const before = server.requests.length;
    expect((await failure(client.call("x", undefined, { signal: ac.signal }))).kind).toBe("timeout");
    await realTick(10);
    expect(server.requests.length).toBe(before);
  });
});

describe("reconnect backoff", () => {
  test("consecutive failures back off initialMs, doubling up to maxMs; a reply resets it", async () => {
    const clock = new ManualClock(1000);
    const path = join(root, "late.sock");
    const client = new SpdkClient({
      socketPath: path,
      logger: silentLogger,
      clock,
      reconnect: { initialMs: 100, maxMs: 400 },
    });
    cleanups.push(() => client.close());

    // Failure 1 and 2 reconnect at once, then 100, 200, 400, 400 ms.
    for (const delay of [0, 0, 100, 200, 400, 400]) {
      let settled = false;
      const call = failure(client.call("x")).finally(() => {
        settled = true;
      });
      if (delay > 0) {
        await clock.advanceAsync(delay - 1);
        await realTick(10);
        expect(settled).toBe(false);
        await clock.advanceAsync(1);
      }
      const err = await call;
      expect(err.details.reason).toBe("connect-failed");
    }

    // A server appears; after the backoff the call connects and succeeds.
    const server = await FakeSpdkServer.start(root, "late.sock", (req, conn) => conn.reply(req.id, "up"));
    cleanups.push(() => server.close());
    const up = client.call("x");
    await clock.advanceAsync(400);
    expect(await up).toBe("up");
    // The reply reset the count: a drop now reconnects at once.
    server.connections[0]?.destroy();
    for (let i = 0; i < 100 && client.connected; i++) await realTick(2);
    expect(await client.call("y")).toBe("up");
    expect(server.connections).toHaveLength(2);
  });
});

describe("lifecycle", () => {
  test("close() fails pending calls, closes the socket, refuses later calls; idempotent", async () => {
    const { server, client } = await setup({}, () => {});
    const pending = failure(client.call("slow"));
    await server.waitForRequests(1);
    await client.close();
    const err = await pending;
    expect(err.kind).toBe("unavailable");
    expect(err.message).toMatch(/closed/);
    expect(client.connected).toBe(false);
    expect((await failure(client.call("x"))).kind).toBe("unavailable");
    await client.close();
    for (let i = 0; i < 100 && !server.connections[0]?.closed; i++) await realTick(2);
    expect(server.connections[0]?.closed).toBe(true);
  });

  test("the constructor refuses unusable options", () => {
    expect(() => new SpdkClient({ socketPath: "", logger: silentLogger })).toThrow(/socketPath/);
    expect(
      () =>
        new SpdkClient({ socketPath: "/x", logger: silentLogger, reconnect: { initialMs: 500, maxMs: 100 } }),
    ).toThrow(/maxMs/);
    expect(() => new SpdkClient({ socketPath: "/x", logger: silentLogger, callTimeoutMs: 0 })).toThrow(
      StorageError,
    );
  });
});

describe("serialize", () => {
  test("tasks under one key run their calls one task at a time, in arrival order, while other keys interleave", async () => {
    const random = seededRandom(3);
    const { server, client } = await setup({}, (req, conn) => {
      setTimeout(() => conn.reply(req.id, true), Math.floor(random() * 4));
    });
    const task = (key: string, i: number) =>
      client.serialize(key, async () => {
        await client.call("nvmf_get_subsystems", { tag: `${key}-${i}` });
        await client.call("nvmf_subsystem_add_ns", { tag: `${key}-${i}` });
        return i;
      });
    const runs = [];
    for (let i = 0; i < 20; i++) runs.push(task("nqn-a", i), task("nqn-b", i));
    await Promise.all(runs);

    const tags = (key: string) =>
      server.requests.map((r) => (r.params as { tag: string }).tag).filter((t) => t.startsWith(key));
    for (const key of ["nqn-a", "nqn-b"]) {
      // Each task's read and write are adjacent, and tasks ran in the order they were queued.
      expect(tags(key)).toEqual(Array.from({ length: 20 }, (_, i) => [`${key}-${i}`, `${key}-${i}`]).flat());
    }
    // The keys did not wait for each other: nqn-b's first read went out before nqn-a's first write.
    const all = server.requests.map((r) => (r.params as { tag: string }).tag);
    expect(all.indexOf("nqn-b-0")).toBeLessThan(all.lastIndexOf("nqn-a-0"));
  });
});
