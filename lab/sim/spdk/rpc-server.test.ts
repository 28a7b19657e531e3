// Framing and dispatch on a real unix socket: completion-order replies, malformed JSON and
// oversized requests closing the connection, id-less fragments, envelope and params errors,
// --wait-for-rpc state gating, the core mask in framework_get_reactors, a crash's stale socket.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, RawRpcConnection, rpc } from "./raw-rpc-client.ts";

let root: string;
let emu: SpdkEmulator;
const NQN = "nqn.2016-06.io.spdk:cnode1";

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-rpc-"));
  emu = await startSpdkEmulator({ socketPath: join(root, "spdk.sock"), dataDir: join(root, "data") });
  await call(emu.socketPath, "bdev_malloc_create", { name: "M0", num_blocks: 2048, block_size: 4096 });
  await call(emu.socketPath, "nvmf_create_subsystem", { nqn: NQN });
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

const req = (method: string, id: unknown, params?: unknown) =>
  JSON.stringify(
    params === undefined ? { jsonrpc: "2.0", method, id } : { jsonrpc: "2.0", method, id, params },
  );

test("replies in completion order: a pipelined async add_ns is overtaken by a sync call", async () => {
  const c = await RawRpcConnection.connect(emu.socketPath);
  c.send(
    req("nvmf_subsystem_add_ns", "slow", { nqn: NQN, namespace: { bdev_name: "M0" } }) +
      req("spdk_get_version", "fast"),
  );
  const replies = (await c.replies(2)) as { id: string; result: unknown }[];
  expect(replies.map((r) => r.id)).toEqual(["fast", "slow"]);
  expect(replies[1]?.result).toBe(1);
  c.close();
});

test("a synchronous method keeps request order (allow_any_host)", async () => {
  const c = await RawRpcConnection.connect(emu.socketPath);
  c.send(
    req("nvmf_subsystem_allow_any_host", "a", { nqn: NQN, allow_any_host: false }) +
      req("spdk_get_version", "b"),
  );
  expect(((await c.replies(2)) as { id: string }[]).map((r) => r.id)).toEqual(["a", "b"]);
  c.close();
});

test("every reply is one compact object plus a newline, whatever the request's layout", async () => {
  const c = await RawRpcConnection.connect(emu.socketPath);
  c.send('{\n  "jsonrpc": "2.0",\n  "method": "bdev_get_bdevs",\n  "params": {"name": "M0"},\n  "id": 7\n}');
  await c.replies(1);
  expect(c.received.endsWith("}\n")).toBe(true);
  expect(c.received.indexOf("\n")).toBe(c.received.length - 1);
  expect(c.received.startsWith('{"jsonrpc":"2.0","id":7,"result":[{"name":"M0",')).toBe(true);
  c.close();
});

test("malformed JSON: no reply at all, the connection is closed, earlier replies are lost", async () => {
  const c = await RawRpcConnection.connect(emu.socketPath);
  c.send(`${req("spdk_get_version", 1)}{"jsonrpc":"2.0",,"method":"x","id":2}${req("spdk_get_version", 3)}`);
  expect(await c.waitClosed()).toBe(true);
  expect(c.received).toBe("");
});

test("a request over 32 KiB is dropped with the connection; one just below is answered", async () => {
  const big = await RawRpcConnection.connect(emu.socketPath);
  big.send(req("bdev_get_bdevs", 1, { name: "x".repeat(33 * 1024) }));
  expect(await big.waitClosed()).toBe(true);
  expect(big.received).toBe("");

  const ok = await RawRpcConnection.connect(emu.socketPath);
  ok.send(req("bdev_get_bdevs", 2, { name: "x".repeat(30 * 1024) }));
  expect(await ok.replies(1)).toEqual([
    { jsonrpc: "2.0", id: 2, error: { code: -19, message: "No such device" } },
  ]);
  ok.close();
});

test("a request without id gets the cut-off, unterminated fragment; errors stay complete", async () => {
  const c = await RawRpcConnection.connect(emu.socketPath);
  c.send('{"jsonrpc":"2.0","method":"spdk_get_version"}');
  const got = await c.settle(30);
  expect(got.startsWith('{"jsonrpc":"2.0","id":null,"result":{"version":"SPDK v25.05.1')).toBe(true);
  expect(got.endsWith("}}")).toBe(true);
  expect(got.endsWith("\n")).toBe(false);
  c.close();

  const e = await RawRpcConnection.connect(emu.socketPath);
  e.send('{"jsonrpc":"2.0","method":"no_such_method"}');
  expect(await e.replies(1)).toEqual([
    { jsonrpc: "2.0", id: null, error: { code: -32601, message: "Method not found" } },
  ]);
  e.close();
});

test("envelope, method and params errors as v25.05.1 answers them", async () => {
  const s = emu.socketPath;
  expect((await rpc(s, "no_such_method")).error).toEqual({ code: -32601, message: "Method not found" });
  expect((await rpc(s, "spdk_get_version", {})).error).toEqual({
    code: -32602,
    message: "spdk_get_version method requires no parameters",
  });
  // nvmf methods: -32602 "Invalid parameters"; bdev methods: -32603 "spdk_json_decode_object failed".
  expect((await rpc(s, "nvmf_create_subsystem", { nqn: 5 })).error).toEqual({
    code: -32602,
    message: "Invalid parameters",
  });
  expect((await rpc(s, "nvmf_subsystem_add_listener")).error).toEqual({
    code: -32602,
    message: "Invalid parameters",
  });
  expect((await rpc(s, "bdev_malloc_create", { name: "M9" })).error).toEqual({
    code: -32603,
    message: "spdk_json_decode_object failed",
  });
  const c = await RawRpcConnection.connect(s);
  c.send('{"jsonrpc":"2.0","method":"spdk_get_version","id":1,"extra":true}');
  c.send('[{"jsonrpc":"2.0","method":"spdk_get_version","id":2}]');
  c.send('{"jsonrpc":"2.0","method":"bdev_get_bdevs","params":"M0","id":3}');
  c.send('{"jsonrpc":"2.0","method":"spdk_get_version","id":1.5e3}');
  await c.replies(4);
  expect(c.received.split("\n").slice(0, 4)).toEqual([
    '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}',
    '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}',
    '{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"Invalid request"}}',
    '{"jsonrpc":"2.0","id":1.5e3,"result":{"version":"SPDK v25.05.1 git sha1 44b23be7c3","fields":{"major":25,"minor":5,"patch":1,"suffix":"","commit":"44b23be7c3"}}}',
  ]);
  c.close();
});

test("--wait-for-rpc: only startup methods until framework_start_init; reactors follow the core mask", async () => {
  const e = await startSpdkEmulator({
    socketPath: join(root, "wait.sock"),
    dataDir: join(root, "wait"),
    waitForRpc: true,
    coreMask: "0x5",
  });
  try {
    const s = e.socketPath;
    expect((await rpc(s, "bdev_get_bdevs")).error).toEqual({
      code: -1,
      message: "Method may only be called after framework is initialized using framework_start_init RPC.",
    });
    expect(await call(s, "iobuf_set_options", { small_pool_count: 16384 })).toBe(true);
    expect(await call(s, "framework_start_init")).toBe(true);
    expect(await call(s, "framework_wait_init")).toBe(true);
    expect((await rpc(s, "iobuf_set_options", { small_pool_count: 8192 })).error?.code).toBe(-1);
    expect((await rpc(s, "framework_start_init")).error?.code).toBe(-1);
    const r = (await call(s, "framework_get_reactors")) as {
      pid: number;
      reactors: { lcore: number; lw_threads: { name: string; cpumask: string }[] }[];
    };
    expect(r.pid).toBe(process.pid);
    expect(r.reactors.map((x) => x.lcore)).toEqual([0, 2]);
    expect(r.reactors.flatMap((x) => x.lw_threads.map((t) => `${t.name}@${t.cpumask}`))).toEqual([
      "app_thread@5",
      "nvmf_tgt_poll_group_000@1",
      "nvmf_tgt_poll_group_001@4",
    ]);
  } finally {
    await e.close();
  }
});

test("nvmf_set_max_subsystems: startup only, once; the limit counts discovery and refuses like SPDK", async () => {
  const e = await startSpdkEmulator({
    socketPath: join(root, "max.sock"),
    dataDir: join(root, "max"),
    waitForRpc: true,
  });
  try {
    const s = e.socketPath;
    expect((await rpc(s, "nvmf_set_max_subsystems", { max_subsystems: "3" })).error).toEqual({
      code: -32602,
      message: "Invalid parameters",
    });
    expect(await call(s, "nvmf_set_max_subsystems", { max_subsystems: 3 })).toBe(true);
    expect((await rpc(s, "nvmf_set_max_subsystems", { max_subsystems: 4 })).error).toEqual({
      code: -32603,
      message: "Must not call more than once",
    });
    expect(await call(s, "framework_start_init")).toBe(true);
    expect((await rpc(s, "nvmf_set_max_subsystems", { max_subsystems: 4 })).error?.code).toBe(-1);
    // Discovery holds one of the three IDs: two NVMe subsystems fit, the third is refused.
    for (const n of [1, 2]) {
      expect(await call(s, "nvmf_create_subsystem", { nqn: `nqn.2016-06.io.spdk:cnode${n}` })).toBe(true);
    }
    expect((await rpc(s, "nvmf_create_subsystem", { nqn: "nqn.2016-06.io.spdk:cnode3" })).error).toEqual({
      code: -32603,
      message: "Unable to create subsystem nqn.2016-06.io.spdk:cnode3",
    });
    expect(await call(s, "nvmf_delete_subsystem", { nqn: "nqn.2016-06.io.spdk:cnode1" })).toBe(true);
    expect(await call(s, "nvmf_create_subsystem", { nqn: "nqn.2016-06.io.spdk:cnode3" })).toBe(true);
  } finally {
    await e.close();
  }
});

test("a crash leaves a stale socket (ECONNREFUSED) and loses runtime state; restart serves again", async () => {
  const e = await startSpdkEmulator({ socketPath: join(root, "crash.sock"), dataDir: join(root, "crash") });
  try {
    await call(e.socketPath, "nvmf_create_transport", { trtype: "TCP" });
    const pending = await RawRpcConnection.connect(e.socketPath);
    await e.crash();
    expect(await pending.waitClosed()).toBe(true);
    const err = await RawRpcConnection.connect(e.socketPath).catch((x: NodeJS.ErrnoException) => x.code);
    expect(err).toBe("ECONNREFUSED");
    expect(e.state().status).toBe("down");
    await e.restart();
    expect(await call(e.socketPath, "nvmf_get_transports")).toEqual([]);
  } finally {
    await e.close();
  }
});

test("a second emulator on a live socket is refused; lifecycle calls in the wrong state reject", async () => {
  const err = await startSpdkEmulator({ socketPath: emu.socketPath, dataDir: join(root, "dup") }).catch(
    (e: unknown) => e,
  );
  expect((err as { kind?: string }).kind).toBe("precondition");
  expect(await call(emu.socketPath, "spdk_get_version")).toBeDefined();
  await expect(emu.restart()).rejects.toThrow("emulator is up");
  const e = await startSpdkEmulator({ socketPath: join(root, "life.sock"), dataDir: join(root, "life") });
  await e.close();
  await e.close();
  await expect(e.crash()).rejects.toThrow("emulator is closed");
});

test("beyond 64 connections a client waits un-served until a slot frees", async () => {
  const held = await Promise.all(Array.from({ length: 64 }, () => RawRpcConnection.connect(emu.socketPath)));
  const extra = await RawRpcConnection.connect(emu.socketPath);
  extra.send(req("spdk_get_version", 1));
  expect(await extra.replies(1, 100)).toEqual([]);
  held[0]?.close();
  expect((await extra.replies(1)).length).toBe(1);
  for (const c of [...held, extra]) c.close();
});
