// bdev_nvme's I/O error resiliency over the SimFabric, on a manual clock: what an initiator's
// namespace bdev does with I/O while its controller resets and reconnects after a path loss
// (held, failed at fast_io_fail_timeout_sec, failed when ctrlr_loss_timeout_sec deletes the
// controller, failed by a detach), the states bdev_nvme_get_controllers prints meanwhile, and
// ANA: path choice by state, I/O held while every path is inaccessible, the target's refusal.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../../lib/clock.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { connectController, createFabric, type SimFabric } from "./fabric.ts";
import { holdClock, track } from "./hold-clock.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const NQN = "nqn.2016-06.io.spdk:replica-b";
const HOST = "nqn.2016-06.io.spdk:host-a";
const LISTEN = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.201", trsvcid: "4420" };

let root: string;
let fabric: SimFabric;
let target: SpdkEmulator;
let host: SpdkEmulator;
const clock = new ManualClock(1_000_000);

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-hold-"));
  fabric = createFabric(join(root, "f"));
  // rpcPollMs 0: these tests count clock steps, not RPC round trips.
  target = await startSpdkEmulator({
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    rpcPollMs: 0,
  });
  host = await startSpdkEmulator({
    socketPath: join(root, "h.sock"),
    dataDir: join(root, "h"),
    fabric,
    hostNqn: HOST,
    clock,
    rpcPollMs: 0,
  });
  const t = target.socketPath;
  await call(t, "nvmf_create_transport", { trtype: "TCP" });
  await call(t, "bdev_malloc_create", { name: "m0", num_blocks: 1024, block_size: 4096 });
  await call(t, "nvmf_create_subsystem", { nqn: NQN, serial_number: "REPLICAB0001", allow_any_host: false });
  await call(t, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "m0" } });
  await call(t, "nvmf_subsystem_add_listener", { nqn: NQN, listen_address: LISTEN });
  await call(t, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

afterAll(async () => {
  await host?.close();
  await target?.close();
  rmSync(root, { recursive: true, force: true });
});

function attach(name: string, opts: Record<string, number> = {}) {
  return call(host.socketPath, "bdev_nvme_attach_controller", {
    name,
    trtype: "tcp",
    adrfam: "ipv4",
    traddr: LISTEN.traddr,
    trsvcid: LISTEN.trsvcid,
    subnqn: NQN,
    hostnqn: HOST,
    ...opts,
  });
}

async function stateOf(name: string): Promise<string | undefined> {
  const [c] = (await call(host.socketPath, "bdev_nvme_get_controllers", { name })) as {
    ctrlrs: { state: string }[];
  }[];
  return c?.ctrlrs[0]?.state;
}

const { settle, until, advance } = holdClock(clock, () => host.socketPath);

const removeHost = () => call(target.socketPath, "nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
const addHost = () => call(target.socketPath, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
const block = (c: string) => Buffer.alloc(4096, c);

test("default options: I/O fails at once after a path loss; the controller keeps resetting and comes back by itself", async () => {
  expect(await attach("d0")).toEqual(["d0n1"]);
  const bdev = host.bdev("d0n1");
  await bdev.write(0, block("a"));
  await removeHost();
  await settle();
  // Refused at CONNECT: read as resetting, like the [3 qos/stats] records after remove_host.
  expect(await stateOf("d0")).toBe("resetting");
  await expect(bdev.read(0, 4096)).rejects.toThrow("no usable path");
  // The admin queue poller starts another reset every 10 ms for as long as the controller stays.
  await addHost();
  await advance(20);
  expect(await stateOf("d0")).toBe("enabled");
  expect((await bdev.read(0, 4096)).equals(block("a"))).toBe(true);
  expect(await call(host.socketPath, "bdev_nvme_detach_controller", { name: "d0" })).toBe(true);
});

test("ctrlr_loss_timeout_sec -1: I/O is held for as long as reconnects are refused and completes after one succeeds", async () => {
  expect(await attach("f0", { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 1 })).toEqual(["f0n1"]);
  const bdev = host.bdev("f0n1");
  await removeHost();
  await settle();
  expect(await stateOf("f0")).toBe("reconnect_is_delayed");
  const w = track(bdev.write(4096, block("b")));
  const r = track(bdev.read(0, 4096));
  for (let i = 0; i < 5; i++) {
    await advance(1000);
    expect(w.done || r.done).toBe(false);
    expect(["reconnect_is_delayed", "resetting"]).toContain((await stateOf("f0")) as string);
  }
  // Held I/O is resubmitted on the next one-second retry after the reconnect.
  await addHost();
  await advance(1000);
  expect(await stateOf("f0")).toBe("enabled");
  await advance(1000);
  await until(() => w.done);
  expect(w).toMatchObject({ done: true, error: undefined });
  await until(() => r.done);
  expect(r).toMatchObject({ done: true, error: undefined });
  expect((await target.bdev("m0").read(4096, 4096)).equals(block("b"))).toBe(true);
  expect(await call(host.socketPath, "bdev_nvme_detach_controller", { name: "f0" })).toBe(true);
});

test("fast_io_fail_timeout_sec: held I/O fails once a reset fails past it, and (v25.05.1) the next outage fails I/O at once", async () => {
  await attach("ff", { ctrlr_loss_timeout_sec: 30, reconnect_delay_sec: 1, fast_io_fail_timeout_sec: 3 });
  const bdev = host.bdev("ffn1");
  await removeHost();
  await settle();
  const w = track(bdev.write(0, block("c")));
  await advance(2000);
  expect(w.done).toBe(false);
  await advance(2000);
  await until(() => w.done);
  expect(w.done).toBe(true);
  expect(String(w.error)).toContain("Input/output error");
  await expect(bdev.write(0, block("c"))).rejects.toThrow();
  expect(await stateOf("ff")).toBe("reconnect_is_delayed");
  await addHost();
  await advance(1000);
  expect(await stateOf("ff")).toBe("enabled");
  await bdev.write(0, block("d"));
  // fast_io_fail_timedout is never cleared: the second outage does not hold I/O at all.
  await removeHost();
  await settle();
  await expect(bdev.write(0, block("e"))).rejects.toThrow();
  await addHost();
  await call(host.socketPath, "bdev_nvme_detach_controller", { name: "ff" });
});

test("ctrlr_loss_timeout_sec elapsed: the controller and its bdev are deleted and held I/O fails", async () => {
  await attach("lt", { ctrlr_loss_timeout_sec: 3, reconnect_delay_sec: 1 });
  const bdev = host.bdev("ltn1");
  await removeHost();
  await settle();
  const w = track(bdev.write(0, block("f")));
  await advance(2000);
  expect(w.done).toBe(false);
  expect(await stateOf("lt")).toBe("reconnect_is_delayed");
  await advance(2000);
  expect((await rpc(host.socketPath, "bdev_nvme_get_controllers", { name: "lt" })).error).toEqual({
    code: -22,
    message: "Controller lt does not exist",
  });
  expect(host.state().bdevs.some((b) => b.name === "ltn1")).toBe(false);
  await advance(1000);
  await until(() => w.done);
  expect(w.done).toBe(true);
  expect(w.error).toBeDefined();
  await addHost();
});

test("bdev_nvme_detach_controller while I/O is held: the I/O fails on its next retry", async () => {
  await attach("dt", { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 1 });
  const bdev = host.bdev("dtn1");
  await removeHost();
  await settle();
  const w = track(bdev.write(0, block("g")));
  await advance(1000);
  expect(w.done).toBe(false);
  expect(await call(host.socketPath, "bdev_nvme_detach_controller", { name: "dt" })).toBe(true);
  await advance(1000);
  await until(() => w.done);
  expect(w.done).toBe(true);
  expect(String(w.error)).toContain("no usable path");
  await addHost();
});

test("a target that is gone (nothing listens) reads failed, not resetting, with default options", async () => {
  const sub = "nqn.2016-06.io.spdk:gone";
  const la = { ...LISTEN, trsvcid: "4430" };
  await call(target.socketPath, "nvmf_create_subsystem", { nqn: sub, allow_any_host: true });
  await call(target.socketPath, "nvmf_subsystem_add_listener", { nqn: sub, listen_address: la });
  await call(target.socketPath, "bdev_malloc_create", { name: "mg", num_blocks: 256, block_size: 4096 });
  await call(target.socketPath, "nvmf_subsystem_add_ns", { nqn: sub, namespace: { bdev_name: "mg" } });
  await call(host.socketPath, "bdev_nvme_attach_controller", {
    name: "g0",
    trtype: "tcp",
    traddr: la.traddr,
    trsvcid: la.trsvcid,
    subnqn: sub,
  });
  await call(target.socketPath, "nvmf_subsystem_remove_listener", { nqn: sub, listen_address: la });
  await settle();
  expect(await stateOf("g0")).toBe("failed");
  await advance(30);
  expect(await stateOf("g0")).toBe("failed");
  await call(host.socketPath, "bdev_nvme_detach_controller", { name: "g0" });
  await call(target.socketPath, "nvmf_delete_subsystem", { nqn: sub });
});

test("ANA: ana_reporting shows in the bdev, I/O avoids an inaccessible path and is held while no path is accessible", async () => {
  const sub = "nqn.2016-06.io.spdk:mp";
  const a = { ...LISTEN, traddr: "127.0.0.210" };
  const b = { ...LISTEN, traddr: "127.0.0.211" };
  const t = target.socketPath;
  await call(t, "nvmf_create_subsystem", { nqn: sub, allow_any_host: true, ana_reporting: true });
  await call(t, "bdev_malloc_create", { name: "mm", num_blocks: 256, block_size: 4096 });
  await call(t, "nvmf_subsystem_add_ns", { nqn: sub, namespace: { bdev_name: "mm" } });
  for (const l of [a, b]) await call(t, "nvmf_subsystem_add_listener", { nqn: sub, listen_address: l });
  await call(t, "nvmf_subsystem_listener_set_ana_state", {
    nqn: sub,
    listen_address: b,
    ana_state: "non_optimized",
  });
  for (const l of [a, b]) {
    await call(host.socketPath, "bdev_nvme_attach_controller", {
      name: "mp",
      trtype: "tcp",
      adrfam: "ipv4",
      traddr: l.traddr,
      trsvcid: l.trsvcid,
      subnqn: sub,
      multipath: "multipath",
      ctrlr_loss_timeout_sec: -1,
      reconnect_delay_sec: 1,
    });
  }
  const [mp] = (await call(host.socketPath, "bdev_get_bdevs", { name: "mpn1" })) as {
    driver_specific: { nvme: { ctrlr_data: { ana_reporting: boolean }; ns_data: unknown }[] };
  }[];
  expect(mp?.driver_specific.nvme.map((n) => [n.ctrlr_data.ana_reporting, n.ns_data])).toEqual([
    [true, { id: 1, ana_state: "optimized", can_share: true }],
    [true, { id: 1, ana_state: "non_optimized", can_share: true }],
  ]);
  const bdev = host.bdev("mpn1");
  const qpairsOn = async (l: typeof a) => {
    const st = (await call(t, "bdev_get_iostat", { name: "mm" })) as { bdevs: { num_read_ops: number }[] };
    return { l: l.traddr, reads: st.bdevs[0]?.num_read_ops ?? 0 };
  };
  // Optimized first; with .210 inaccessible the reads go to the non-optimized .211.
  await call(t, "nvmf_subsystem_listener_set_ana_state", {
    nqn: sub,
    listen_address: a,
    ana_state: "inaccessible",
  });
  await settle();
  const before = await qpairsOn(b);
  await bdev.read(0, 4096);
  expect((await qpairsOn(b)).reads).toBe(before.reads + 1);
  // Both inaccessible: connected paths may still become accessible, so the read is held.
  await call(t, "nvmf_subsystem_listener_set_ana_state", {
    nqn: sub,
    listen_address: b,
    ana_state: "inaccessible",
  });
  await settle();
  const r = track(bdev.read(0, 4096));
  await advance(3000);
  expect(r.done).toBe(false);
  await call(t, "nvmf_subsystem_listener_set_ana_state", {
    nqn: sub,
    listen_address: a,
    ana_state: "optimized",
  });
  await advance(1000);
  await until(() => r.done);
  expect(r).toMatchObject({ done: true, error: undefined });
  await call(host.socketPath, "bdev_nvme_detach_controller", { name: "mp" });
});

test("the target fails I/O through a listener whose ANA group is inaccessible, with a path status", async () => {
  const sub = "nqn.2016-06.io.spdk:fence";
  const t = target.socketPath;
  const la = { ...LISTEN, traddr: "127.0.0.212" };
  await call(t, "nvmf_create_subsystem", { nqn: sub, allow_any_host: true, ana_reporting: true });
  await call(t, "bdev_malloc_create", { name: "mf", num_blocks: 256, block_size: 4096 });
  await call(t, "nvmf_subsystem_add_ns", { nqn: sub, namespace: { bdev_name: "mf" } });
  await call(t, "nvmf_subsystem_add_listener", { nqn: sub, listen_address: la });
  const c = await connectController(fabric, {
    trtype: "TCP",
    traddr: la.traddr,
    trsvcid: la.trsvcid,
    subnqn: sub,
    hostnqn: HOST,
    hostid: "h-1",
  });
  await c.write(1, 0, block("h"));
  await call(t, "nvmf_subsystem_listener_set_ana_state", {
    nqn: sub,
    listen_address: la,
    ana_state: "inaccessible",
  });
  await expect(c.write(1, 0, block("i"))).rejects.toMatchObject({ errno: 121 });
  await expect(c.read(1, 0, 4096)).rejects.toMatchObject({ errno: 121 });
  expect((await target.bdev("mf").read(0, 4096)).equals(block("h"))).toBe(true);
  c.close();
});
