// Target and initiator emulators on one SimFabric: host ACL enforcement on attach (-5), nothing
// listening (-19), the data path from an initiator bdev to the target lvol's bytes, namespace
// changes and host removal seen by the initiator, and reconnect after a target restart.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../../lib/clock.ts";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { createFabric, type SimFabric } from "./fabric.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const NQN = "nqn.2026-02.io.distort:volume-v1";
const HOST = "nqn.2014-08.org.nvmexpress:uuid:6f1c2d3e-4b5a-4978-8a1b-2c3d4e5f6a7b";
const ADDR = { trtype: "rdma", adrfam: "ipv4", traddr: "192.168.100.7", trsvcid: "4420" };

let root: string;
let fabric: SimFabric;
let target: SpdkEmulator;
let snap: SpdkEmulator;
const clock = new ManualClock(Date.now());

/** Configures the target's export of lvs0/v1 (after start or restart). */
async function exportVolume(t: string, firstTime: boolean): Promise<void> {
  await call(t, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  if (firstTime) {
    await call(t, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
    await call(t, "bdev_lvol_create", {
      lvs_name: "lvs0",
      lvol_name: "v1",
      size_in_mib: 8,
      thin_provision: true,
    });
  }
  await call(t, "nvmf_create_transport", { trtype: "RDMA" });
  await call(t, "nvmf_create_subsystem", { nqn: NQN, serial_number: "DISTORT0001" });
  await call(t, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "lvs0/v1" } });
  await call(t, "nvmf_subsystem_add_listener", { nqn: NQN, listen_address: ADDR });
}

const attach = (name: string, extra: Record<string, unknown> = {}) =>
  rpc(snap.socketPath, "bdev_nvme_attach_controller", {
    name,
    trtype: "rdma",
    traddr: ADDR.traddr,
    adrfam: "ipv4",
    trsvcid: ADDR.trsvcid,
    subnqn: NQN,
    ...extra,
  });

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-fab-"));
  fabric = createFabric(join(root, "f"));
  target = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "S5E", model: "Sim", sizeBytes: 64 * MIB }],
  });
  snap = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "snap.sock"),
    dataDir: join(root, "snap"),
    fabric,
    hostNqn: HOST,
    trtypeAliases: { NVDA_TCP: "TCP" },
    clock,
  });
  await exportVolume(target.socketPath, true);
});

afterAll(async () => {
  await snap.close();
  await target.close();
  rmSync(root, { recursive: true, force: true });
});

test("attach is refused with -5 while the host is not allowed, -19 where nothing listens", async () => {
  expect((await attach("nvme_denied")).error).toEqual({ code: -5, message: "Input/output error" });
  expect((await attach("nvme_other", { hostnqn: "nqn.2016-06.io.spdk:someone-else" })).error?.code).toBe(-5);
  expect((await attach("nvme_nowhere", { trsvcid: "4999" })).error).toEqual({
    code: -19,
    message: "No such device",
  });
  // A subsystem that does not listen on that address refuses the connect too.
  expect((await attach("nvme_wrongsub", { subnqn: "nqn.2026-02.io.distort:volume-none" })).error?.code).toBe(
    -5,
  );
  expect(snap.state().nvmeControllers).toEqual([]);
});

test("an allowed host attaches; its writes land in the target lvol's bytes and read back", async () => {
  await call(target.socketPath, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  const r = await attach("nvme_vol1");
  expect(r.result).toEqual(["nvme_vol1n1"]);
  const [bdev] = (await call(snap.socketPath, "bdev_get_bdevs", { name: "nvme_vol1n1" })) as {
    aliases: string[];
    num_blocks: number;
    driver_specific: { nvme: { trid: unknown; ctrlr_data: { serial_number: string } }[] };
  }[];
  const lvol = target.state().lvols.find((l) => l.name === "v1");
  expect(bdev?.aliases).toEqual([lvol?.uuid as string]);
  expect(bdev?.num_blocks).toBe((8 * MIB) / 4096);
  expect(bdev?.driver_specific.nvme[0]?.trid).toEqual({
    trtype: "RDMA",
    adrfam: "IPv4",
    traddr: ADDR.traddr,
    trsvcid: ADDR.trsvcid,
    subnqn: NQN,
  });
  expect(bdev?.driver_specific.nvme[0]?.ctrlr_data.serial_number).toBe("DISTORT0001");

  const payload = Buffer.from("written by the DPU through the fabric");
  await snap.bdev("nvme_vol1n1").write(MIB + 512, payload);
  expect((await target.bdev("lvs0/v1").read(MIB + 512, payload.length)).equals(payload)).toBe(true);
  expect((await snap.bdev("nvme_vol1n1").read(MIB + 512, payload.length)).equals(payload)).toBe(true);

  const ctrls = (await call(target.socketPath, "nvmf_subsystem_get_controllers", { nqn: NQN })) as {
    hostnqn: string;
    hostid: string;
  }[];
  expect(ctrls.map((c) => [c.hostnqn, c.hostid])).toEqual([[HOST, snap.hostId]]);
});

test("namespace changes on the target reach the initiator's bdevs", async () => {
  await call(target.socketPath, "bdev_malloc_create", { name: "M1", num_blocks: 1024, block_size: 4096 });
  expect(
    await call(target.socketPath, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "M1" } }),
  ).toBe(2);
  await until(() => snap.state().bdevs.some((b) => b.name === "nvme_vol1n2"));
  await call(target.socketPath, "nvmf_subsystem_remove_ns", { nqn: NQN, nsid: 2 });
  await until(() => !snap.state().bdevs.some((b) => b.name === "nvme_vol1n2"));
  // A resize of the exported lvol is seen as a bigger namespace.
  await call(target.socketPath, "bdev_lvol_resize", { name: "lvs0/v1", size_in_mib: 12 });
  await until(
    () => snap.state().bdevs.find((b) => b.name === "nvme_vol1n1")?.numBlocks === (12 * MIB) / 4096,
  );
});

test("removing the host cuts its controller: reconnects are refused, the path reads resetting, I/O errors", async () => {
  await call(target.socketPath, "nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  // As the [3 qos/stats] records show after remove_host (seq 206-207): refused reconnects.
  await until(() => snap.state().nvmeControllers[0]?.state === "resetting");
  await expect(snap.bdev("nvme_vol1n1").read(0, 512)).rejects.toThrow();
  expect(await call(snap.socketPath, "bdev_nvme_detach_controller", { name: "nvme_vol1" })).toBe(true);
  expect((await rpc(snap.socketPath, "bdev_nvme_detach_controller", { name: "nvme_vol1" })).error?.code).toBe(
    -19,
  );
});

test("with reconnect_delay_sec the initiator reconnects after the target restarts and is configured again", async () => {
  await call(target.socketPath, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  // SNAP spells NVMe/TCP as NVDA_TCP; the emulator maps it when told to. This path is RDMA.
  const r = await attach("nvme_r", { ctrlr_loss_timeout_sec: -1, reconnect_delay_sec: 1 });
  expect(r.result).toEqual(["nvme_rn1"]);
  await target.crash();
  await until(() => snap.state().nvmeControllers[0]?.state === "reconnect_is_delayed");
  await target.restart();
  await exportVolume(target.socketPath, false);
  await call(target.socketPath, "nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  clock.advance(1000);
  await until(() => snap.state().nvmeControllers[0]?.state === "enabled");
  const payload = Buffer.from("written by the DPU through the fabric");
  expect((await snap.bdev("nvme_rn1").read(MIB + 512, payload.length)).equals(payload)).toBe(true);
  await call(snap.socketPath, "bdev_nvme_detach_controller", { name: "nvme_r" });
});

test("a SNAP-flavoured initiator reaches an NVMe/TCP listener with trtype NVDA_TCP", async () => {
  const t = target.socketPath;
  await call(t, "nvmf_create_transport", { trtype: "TCP" });
  await call(t, "nvmf_subsystem_add_listener", {
    nqn: NQN,
    listen_address: { ...ADDR, trtype: "tcp", trsvcid: "4421" },
  });
  const r = await attach("nvme_tcp", { trtype: "NVDA_TCP", trsvcid: "4421" });
  expect(r.result).toEqual(["nvme_tcpn1"]);
  // The path keeps the spelling it was attached with, so a DPF-style lookup by trid finds it.
  expect(snap.state().nvmeControllers.find((c) => c.name === "nvme_tcp")?.trtype).toBe("NVDA_TCP");
  await call(snap.socketPath, "bdev_nvme_detach_controller", { name: "nvme_tcp" });
});

/** Polls `cond` every 5 ms for up to a second. */
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !cond(); i++) await Bun.sleep(5);
  expect(cond()).toBe(true);
}
