// The simulated host looks like the kernel's: class symlinks into /sys/devices (relative, so any
// root works), space-padded identify fields, sizes in 512-byte sectors, multipath path and head
// disks, infiniband port attributes, and lsblk/ip answers that match the tree.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import { StorageError } from "../../../lib/errors.ts";
import { buildSysfs, rateText, type SimSysfs } from "./build-sysfs.ts";
import { type ScratchRoot, scratchRoot } from "./scratch-root.ts";

const GiB = 1024 ** 3;
let root: ScratchRoot;
let sim: SimSysfs;
beforeAll(async () => {
  root = await scratchRoot("distort-simfs");
  sim = await buildSysfs(root.path, {
    controllers: [
      {
        name: "nvme0",
        transport: "pcie",
        pciAddress: "0000:3b:00.0",
        serial: "S4EWNX0R123456",
        model: "SAMSUNG MZQL23T8HCLS",
        numaNode: 1,
        ns1Bytes: 3_840_755_982_336,
      },
      {
        name: "nvme1",
        transport: "pcie",
        pciAddress: "0000:5e:00.0",
        serial: "DUALPORT",
        model: "M",
        ns1Bytes: GiB,
        multipath: true,
        mounted: "/srv",
      },
      {
        name: "nvme2",
        transport: "tcp",
        serial: "SPDK00000000000001",
        model: "SPDK bdev Controller",
        ns1Bytes: GiB,
      },
    ],
    rdma: [
      { device: "mlx5_0", state: "ACTIVE", rateGbps: 100, netdev: "ens1f0", address: "192.168.100.10/24" },
    ],
  });
});
afterAll(async () => {
  await root.remove();
});

const read = (p: string) => readFileSync(join(root.path, p), "utf8");

test("controller attributes: padding, address, transport, NUMA node", () => {
  expect(read("sys/class/nvme/nvme0/serial")).toBe("S4EWNX0R123456      \n");
  expect(read("sys/class/nvme/nvme0/model")).toBe(`${"SAMSUNG MZQL23T8HCLS".padEnd(40)}\n`);
  expect(read("sys/class/nvme/nvme0/address")).toBe("0000:3b:00.0\n");
  expect(read("sys/class/nvme/nvme0/transport")).toBe("pcie\n");
  expect(read("sys/class/nvme/nvme0/numa_node")).toBe("1\n");
  expect(read("sys/class/nvme/nvme0/state")).toBe("live\n");
  expect(read("sys/class/nvme/nvme2/address")).toBe(
    "traddr=192.168.100.20,trsvcid=4420,src_addr=192.168.100.10\n",
  );
  expect(read("sys/class/nvme/nvme2/transport")).toBe("tcp\n");
});

test("class entries are relative symlinks into /sys/devices", () => {
  expect(readlinkSync(join(root.path, "sys/class/nvme/nvme0"))).toBe(
    "../../devices/pci0000:00/0000:00:01.0/0000:3b:00.0/nvme/nvme0",
  );
  expect(readlinkSync(join(root.path, "sys/class/nvme/nvme0/device"))).toBe("../../../0000:3b:00.0");
  expect(read("sys/class/nvme/nvme0/device/class")).toBe("0x010802\n");
  expect(readlinkSync(join(root.path, "sys/class/block/nvme0n1"))).toBe(
    "../../devices/pci0000:00/0000:00:01.0/0000:3b:00.0/nvme/nvme0/nvme0n1",
  );
});

test("namespace sizes are 512-byte sectors; multipath has a hidden path and a visible head", () => {
  expect(read("sys/class/block/nvme0n1/size")).toBe(`${3_840_755_982_336 / 512}\n`);
  expect(read("sys/class/block/nvme0n1/nsid")).toBe("1\n");
  expect(read("sys/class/block/nvme1c1n1/hidden")).toBe("1\n");
  expect(read("sys/class/block/nvme1n1/hidden")).toBe("0\n");
  expect(readlinkSync(join(root.path, "sys/class/block/nvme1n1"))).toBe(
    "../../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1",
  );
  expect(read("sys/class/block/nvme1n1p1/partition")).toBe("1\n");
});

test("infiniband port attributes", () => {
  expect(read("sys/class/infiniband/mlx5_0/ports/1/state")).toBe("4: ACTIVE\n");
  expect(read("sys/class/infiniband/mlx5_0/ports/1/rate")).toBe("100 Gb/sec (4X EDR)\n");
  expect(read("sys/class/infiniband/mlx5_0/ports/1/link_layer")).toBe("Ethernet\n");
  expect(read("sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0")).toBe("ens1f0\n");
  expect(read("sys/class/infiniband/mlx5_0/ports/1/gids/2")).toBe("::ffff:192.168.100.10\n");
  expect(read("sys/class/net/ens1f0/operstate")).toBe("up\n");
});

test.each([
  [100, "100 Gb/sec (4X EDR)"],
  [200, "200 Gb/sec (4X HDR)"],
  [56, "56 Gb/sec (4X FDR)"],
  [25, "25 Gb/sec (1X EDR)"],
  [2.5, "2.5 Gb/sec (1X SDR)"],
  [10, "10 Gb/sec (4X SDR)"],
])("rate %p Gb/s prints as %p", (gbps, text) => {
  expect(rateText(gbps)).toBe(text);
});

test("rates no link can have are refused", () => {
  expect(() => rateText(33)).toThrow(/not a width x speed/);
});

test("lsblk shows visible disks only, with mounts of their partitions", async () => {
  const r = await sim.exec.run(["lsblk", "-J", "-o", "NAME,MOUNTPOINTS"]);
  expect(r.code).toBe(0);
  const tree = JSON.parse(r.stdout) as {
    blockdevices: { name: string; children?: { mountpoints: string[] }[] }[];
  };
  expect(tree.blockdevices.map((d) => d.name)).toEqual(["nvme0n1", "nvme1n1", "nvme2n1", "sda"]);
  expect(tree.blockdevices[1]?.children?.[0]?.mountpoints).toEqual(["/srv"]);
});

test("ip answers for known interfaces and fails like ip for unknown ones", async () => {
  const ok = await sim.exec.run(["ip", "-j", "addr", "show", "dev", "ens1f0"]);
  expect(ok.code).toBe(0);
  expect(JSON.parse(ok.stdout)[0].addr_info[0]).toMatchObject({
    family: "inet",
    local: "192.168.100.10",
    prefixlen: 24,
  });
  const missing = await sim.exec.run(["ip", "-j", "addr", "show", "dev", "eth9"]);
  expect(missing).toEqual({ code: 1, stdout: "", stderr: 'Device "eth9" does not exist.\n' });
});

test("commands the host does not simulate cannot start", async () => {
  const err = await sim.exec.run(["nvme", "list"]).catch((e) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("unavailable");
});

test("rebuild swaps the hardware in place", async () => {
  const other = await buildSysfs(join(root.path, "other"), {
    controllers: [
      {
        name: "nvme0",
        transport: "pcie",
        pciAddress: "0000:3b:00.0",
        serial: "A",
        model: "M",
        ns1Bytes: GiB,
      },
    ],
  });
  await other.rebuild({ controllers: [] });
  expect(await other.fs.readdir("/sys/class/nvme")).toEqual([]);
  const r = await other.exec.run(["lsblk", "-J", "-o", "NAME,MOUNTPOINTS"]);
  expect(JSON.parse(r.stdout).blockdevices.map((d: { name: string }) => d.name)).toEqual(["sda"]);
});
