// Lvol stores on a simulated PCIe drive through the RPC socket: thin vs thick accounting, data on
// the drive's bytes, copy-on-write snapshots, and crash(): nvmf state gone, lvols rediscovered
// (with their data) when the drive is attached again.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { call, rpc } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const NQN = "nqn.2026-02.io.distort:volume-a";
let root: string;
let emu: SpdkEmulator;
let s: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-lvol-"));
  emu = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "spdk.sock"),
    dataDir: join(root, "data"),
    drives: [{ pciAddress: "0000:3b:00.0", serial: "PHLJ0001", model: "Sim NVMe", sizeBytes: 128 * MIB }],
  });
  s = emu.socketPath;
  expect(
    await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "3b:00.0" }),
  ).toEqual(["Nvme0n1"]);
});

afterAll(async () => {
  await emu.close();
  rmSync(root, { recursive: true, force: true });
});

type Lvstore = { free_clusters: number; total_data_clusters: number };
const freeClusters = async () =>
  ((await call(s, "bdev_lvol_get_lvstores", { lvs_name: "lvs0" })) as Lvstore[])[0];

test("the drive shows up like a PCIe NVMe bdev; attaching it twice is refused", async () => {
  const [bdev] = (await call(s, "bdev_get_bdevs", { name: "Nvme0n1" })) as {
    num_blocks: number;
    driver_specific: {
      nvme: { pci_address: string; trid: unknown; ctrlr_data: { serial_number: string } }[];
    };
  }[];
  expect(bdev?.num_blocks).toBe((128 * MIB) / 4096);
  expect(bdev?.driver_specific.nvme[0]?.pci_address).toBe("0000:3b:00.0");
  expect(bdev?.driver_specific.nvme[0]?.trid).toEqual({ trtype: "PCIe", traddr: "0000:3b:00.0" });
  expect(bdev?.driver_specific.nvme[0]?.ctrlr_data.serial_number).toBe("PHLJ0001");
  expect(
    (await rpc(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:3b:00.0" }))
      .error,
  ).toEqual({
    code: -114,
    message: "A controller named Nvme0 already exists with the specified network path",
  });
  expect(
    (await rpc(s, "bdev_nvme_attach_controller", { name: "Other", trtype: "PCIe", traddr: "0000:3b:00.0" }))
      .error?.code,
  ).toBe(-17);
  expect(
    (await rpc(s, "bdev_nvme_attach_controller", { name: "X", trtype: "PCIe", traddr: "0000:99:00.0" })).error
      ?.code,
  ).toBe(-19);
});

test("thick lvols take clusters when created, thin ones when written", async () => {
  const lvs = await call(s, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  expect(typeof lvs).toBe("string");
  expect(await freeClusters()).toMatchObject({ total_data_clusters: 31, free_clusters: 31 });
  await call(s, "bdev_lvol_create", { lvs_name: "lvs0", lvol_name: "thick", size_in_mib: 16 });
  expect((await freeClusters())?.free_clusters).toBe(27);
  await call(s, "bdev_lvol_create", {
    lvs_name: "lvs0",
    lvol_name: "thin",
    size_in_mib: 64,
    thin_provision: true,
  });
  expect((await freeClusters())?.free_clusters).toBe(27);
  // Writing 1 byte into two distinct 4 MiB clusters of the thin lvol allocates exactly two.
  const thin = emu.bdev("lvs0/thin");
  await thin.write(0, Buffer.from("a"));
  await thin.write(5 * MIB, Buffer.from("b"));
  await thin.write(5 * MIB + 1, Buffer.from("c"));
  expect((await freeClusters())?.free_clusters).toBe(25);
  const lvols = (await call(s, "bdev_lvol_get_lvols", { lvs_name: "lvs0" })) as {
    name: string;
    num_allocated_clusters: number;
  }[];
  expect(lvols.map((l) => [l.name, l.num_allocated_clusters])).toEqual([
    ["thick", 4],
    ["thin", 2],
  ]);
  // A thick lvol bigger than the free space fails asynchronously with ENOSPC's text.
  expect(
    (await rpc(s, "bdev_lvol_create", { lvs_name: "lvs0", lvol_name: "big", size_in_mib: 1024 })).error,
  ).toEqual({
    code: -32602,
    message: "No space left on device",
  });
});

test("lvol bytes live on the drive; snapshots are copy-on-write", async () => {
  const thick = emu.bdev("lvs0/thick");
  const data = Buffer.alloc(8192, 0x5a);
  await thick.write(4096, data);
  expect((await thick.read(4096, 8192)).equals(data)).toBe(true);
  // Unwritten bytes of a fresh lvol read as zeros, even where the drive held something else.
  expect((await thick.read(0, 4096)).equals(Buffer.alloc(4096))).toBe(true);
  // The bytes are on the drive (some cluster of Nvme0n1 holds them).
  const drive = emu.bdev("Nvme0n1");
  let found = false;
  for (let c = 1; c < 32 && !found; c++) {
    found = (await drive.read(c * 4 * MIB + 4096, 8192)).equals(data);
  }
  expect(found).toBe(true);

  await call(s, "bdev_lvol_snapshot", { lvol_name: "lvs0/thick", snapshot_name: "snap" });
  await thick.write(4096, Buffer.alloc(4096, 0x11));
  const snap = emu.bdev("lvs0/snap");
  expect((await snap.read(4096, 4096)).equals(Buffer.alloc(4096, 0x5a))).toBe(true);
  expect(
    (await thick.read(4096, 8192)).equals(
      Buffer.concat([Buffer.alloc(4096, 0x11), Buffer.alloc(4096, 0x5a)]),
    ),
  ).toBe(true);
  await call(s, "bdev_lvol_clone", { snapshot_name: "lvs0/snap", clone_name: "clone" });
  expect((await emu.bdev("lvs0/clone").read(4096, 4096)).equals(Buffer.alloc(4096, 0x5a))).toBe(true);
  await expect(snap.write(0, Buffer.alloc(1))).rejects.toThrow();
});

test("crash drops nvmf state but the lvols come back, with their bytes, when the drive is attached again", async () => {
  await call(s, "nvmf_create_transport", { trtype: "RDMA" });
  await call(s, "nvmf_create_subsystem", { nqn: NQN });
  await call(s, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "lvs0/thin" } });
  await call(s, "nvmf_subsystem_add_host", { nqn: NQN, host: "nqn.2016-06.io.spdk:host1" });
  const before = emu.state();
  expect(before.subsystems.map((x) => x.nqn)).toContain(NQN);

  await emu.crash();
  expect(emu.state().status).toBe("down");
  await emu.restart();
  const after = emu.state();
  expect(after.subsystems.map((x) => x.nqn)).toEqual(["nqn.2014-08.org.nvmexpress.discovery"]);
  expect(after.transports).toEqual([]);
  expect(after.lvstores).toEqual([]);
  expect(after.bdevs).toEqual([]);

  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:3b:00.0" });
  const again = emu.state();
  expect(again.lvstores).toEqual(before.lvstores);
  expect(again.lvols).toEqual(before.lvols);
  // Same bdev names (lvol UUIDs) and aliases as before the crash.
  const names = (st: typeof before) => st.bdevs.map((b) => [b.name, ...b.aliases].join(" "));
  expect(names(again)).toEqual(names(before));
  expect((await emu.bdev("lvs0/thin").read(5 * MIB, 2)).toString()).toBe("bc");
  expect((await emu.bdev("lvs0/snap").read(4096, 1))[0]).toBe(0x5a);
});

test("deleting an exported lvol hot-removes its namespace", async () => {
  await call(s, "nvmf_create_subsystem", { nqn: NQN });
  await call(s, "bdev_lvol_create", {
    lvs_name: "lvs0",
    lvol_name: "gone",
    size_in_mib: 4,
    thin_provision: true,
  });
  expect(await call(s, "nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: "lvs0/gone" } })).toBe(1);
  expect(await call(s, "bdev_lvol_delete", { name: "lvs0/gone" })).toBe(true);
  expect(emu.state().subsystems.find((x) => x.nqn === NQN)?.namespaces).toEqual([]);
});

test("deleting the lvstore wipes its header: a new attach finds nothing to load", async () => {
  expect(await call(s, "bdev_lvol_delete_lvstore", { lvs_name: "lvs0" })).toBe(true);
  expect((await rpc(s, "bdev_lvol_delete_lvstore", { lvs_name: "lvs0" })).error?.code).toBe(-19);
  await call(s, "bdev_nvme_detach_controller", { name: "Nvme0" });
  await call(s, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:3b:00.0" });
  expect(await call(s, "bdev_lvol_get_lvstores")).toEqual([]);
});
