// raid1 over a local bdev and a remote NVMe-oF replica whose controller loses its path, on a
// manual clock: a write is acknowledged only when every member has completed it, so it waits
// for a reconnecting member (ctrlr_loss_timeout_sec -1) and completes after the reconnect with
// both members written; once the member's I/O fails (fast_io_fail_timeout_sec, or the controller
// declared lost) the member is failed out, the write succeeds on the other one and the surviving
// member's superblock records the raid degraded. Reads avoid a member that is holding one.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../../lib/clock.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { createFabric } from "./fabric.ts";
import { holdClock, track } from "./hold-clock.ts";
import { call } from "./raw-rpc-client.ts";

const NQN = "nqn.2016-06.io.spdk:replica-b";
const HOST = "nqn.2016-06.io.spdk:host-a";
const LISTEN = { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.201", trsvcid: "4420" };
/** A superblock raid keeps 256 blocks of 4 KiB at the start of every member. */
const DATA_OFFSET = 256 * 4096;

let root: string;
let target: SpdkEmulator;
let host: SpdkEmulator;
const clock = new ManualClock(1_000_000);

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-rhold-"));
  const fabric = createFabric(join(root, "f"));
  const opts = { fabric, rpcPollMs: 0 };
  target = await startSpdkEmulator({ socketPath: join(root, "t.sock"), dataDir: join(root, "t"), ...opts });
  host = await startSpdkEmulator({
    socketPath: join(root, "h.sock"),
    dataDir: join(root, "h"),
    hostNqn: HOST,
    clock,
    ...opts,
  });
  const t = target.socketPath;
  await call(t, "nvmf_create_transport", { trtype: "TCP" });
  await call(t, "nvmf_create_subsystem", { nqn: NQN, allow_any_host: false });
  await call(t, "nvmf_subsystem_add_listener", { nqn: NQN, listen_address: LISTEN });
  await call(t, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

afterAll(async () => {
  await host?.close();
  await target?.close();
  rmSync(root, { recursive: true, force: true });
});

const { settle, until, advance } = holdClock(clock, () => host.socketPath);

const removeHost = () => call(target.socketPath, "nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
const addHost = () => call(target.socketPath, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
const block = (c: string) => Buffer.alloc(4096, c);

interface RaidInfo {
  state: string;
  num_base_bdevs_discovered: number;
  base_bdevs_list: { name: string | null; is_configured: boolean }[];
}
async function raid(name: string): Promise<RaidInfo | undefined> {
  const all = (await call(host.socketPath, "bdev_raid_get_bdevs", { category: "all" })) as (RaidInfo & {
    name: string;
  })[];
  return all.find((r) => r.name === name);
}

/**
 * A raid1 `name` over a local malloc and the target's replica `replica` attached with `opts`;
 * `remoteFirst` puts the remote member in slot 0.
 */
async function build(name: string, opts: Record<string, number>, remoteFirst = false): Promise<void> {
  const t = target.socketPath;
  const h = host.socketPath;
  await call(t, "bdev_malloc_create", { name: `${name}_r`, num_blocks: 1024, block_size: 4096 });
  await call(t, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: `${name}_r` } });
  await call(h, "bdev_malloc_create", { name: `${name}_l`, num_blocks: 1024, block_size: 4096 });
  await call(h, "bdev_nvme_attach_controller", {
    name: `${name}_c`,
    trtype: "tcp",
    adrfam: "ipv4",
    traddr: LISTEN.traddr,
    trsvcid: LISTEN.trsvcid,
    subnqn: NQN,
    hostnqn: HOST,
    ...opts,
  });
  const remote = `${name}_cn1`;
  await call(h, "bdev_raid_create", {
    name,
    raid_level: "raid1",
    base_bdevs: remoteFirst ? [remote, `${name}_l`] : [`${name}_l`, remote],
    superblock: true,
  });
}

async function teardown(name: string): Promise<void> {
  await call(host.socketPath, "bdev_raid_delete", { name }).catch(() => {});
  await call(host.socketPath, "bdev_nvme_detach_controller", { name: `${name}_c` }).catch(() => {});
  await call(target.socketPath, "nvmf_subsystem_remove_ns", { nqn: NQN, nsid: 1 });
}

test("a write waits for the reconnecting member and completes on both once it is back", async () => {
  await build("ra", { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 1 });
  await host.bdev("ra").write(0, block("1"));
  await removeHost();
  await settle();
  const w = track(host.bdev("ra").write(4096, block("2")));
  await advance(5000);
  expect(w.done).toBe(false);
  expect(await raid("ra")).toMatchObject({ state: "online", num_base_bdevs_discovered: 2 });
  await addHost();
  await advance(3000);
  await until(() => w.done);
  expect(w).toMatchObject({ done: true, error: undefined });
  expect((await host.bdev("ra_l").read(DATA_OFFSET + 4096, 4096)).equals(block("2"))).toBe(true);
  expect((await target.bdev("ra_r").read(DATA_OFFSET + 4096, 4096)).equals(block("2"))).toBe(true);
  expect(await raid("ra")).toMatchObject({ state: "online", num_base_bdevs_discovered: 2 });
  await teardown("ra");
});

test("once the member's I/O fails (fast_io_fail_timeout_sec) it is failed out and the write succeeds on the other", async () => {
  await build("rb", { ctrlr_loss_timeout_sec: 30, reconnect_delay_sec: 1, fast_io_fail_timeout_sec: 2 });
  await removeHost();
  await settle();
  const w = track(host.bdev("rb").write(0, block("3")));
  await advance(1000);
  expect(w.done).toBe(false);
  await advance(2000);
  await until(() => w.done);
  expect(w).toMatchObject({ done: true, error: undefined });
  await settle();
  expect(await raid("rb")).toMatchObject({
    state: "online",
    num_base_bdevs_discovered: 1,
    base_bdevs_list: [
      { name: "rb_l", is_configured: true },
      { name: null, is_configured: false },
    ],
  });
  expect((await host.bdev("rb_l").read(DATA_OFFSET, 4096)).equals(block("3"))).toBe(true);
  // The survivor's superblock no longer counts the failed member as configured.
  const sb = (await host.bdev("rb_l").read(0, 4096)).toString("utf8");
  const parsed = JSON.parse(sb.slice(sb.indexOf("{"), sb.indexOf("\n"))) as {
    slots: { configured: boolean }[];
  };
  expect(parsed.slots.map((s) => s.configured)).toEqual([true, false]);
  await addHost();
  await teardown("rb");
});

test("the controller declared lost (ctrlr_loss_timeout_sec) takes its bdev out of the raid; the held write succeeds", async () => {
  await build("rc", { ctrlr_loss_timeout_sec: 2, reconnect_delay_sec: 1 });
  await removeHost();
  await settle();
  const w = track(host.bdev("rc").write(0, block("4")));
  await advance(1000);
  expect(w.done).toBe(false);
  await advance(3000);
  await until(() => w.done);
  expect(w).toMatchObject({ done: true, error: undefined });
  expect(host.state().bdevs.some((b) => b.name === "rc_cn1")).toBe(false);
  expect(await raid("rc")).toMatchObject({ state: "online", num_base_bdevs_discovered: 1 });
  await addHost();
  await teardown("rc");
});

test("a read held by the reconnecting member in slot 0 does not hold the next read, which the other member serves", async () => {
  await build("rd", { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 1 }, true);
  await host.bdev("rd").write(0, block("5"));
  await removeHost();
  await settle();
  const first = track(host.bdev("rd").read(0, 4096));
  await settle();
  const second = await host.bdev("rd").read(0, 4096);
  expect(second.equals(block("5"))).toBe(true);
  expect(first.done).toBe(false);
  // The reconnect comes within a second; the held read is retried on the one-second tick after it.
  await addHost();
  await advance(3000);
  await until(() => first.done);
  expect(first).toMatchObject({ done: true, error: undefined });
  await teardown("rd");
});
