// storage-prep: in-node paths map onto a node's own directories only; a prepared storage node is
// one the emulated nvmf_tgt serves from its drives file and data directory (the backing files it
// finds are the ones prepared, bytes kept across a second preparation); the sysfs tree names the
// drives; every node gets the NVMe host directory and a host NQN that survives re-preparation.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startSpdkEmulator } from "../sim/spdk/emulator.ts";
import { loadDrives } from "../sim/spdk/nvmf-tgt.ts";
import { call } from "../sim/spdk/raw-rpc-client.ts";
import { type ScratchRoot, scratchRoot } from "../sim/sysfs/scratch-root.ts";
import { hostPathOf, LAB_DRIVE_MODEL, NODE_PATHS, prepareLabNode, storageLayout } from "./storage-prep.ts";

const MIB = 1024 * 1024;
const DRIVES = [
  { serial: "LABA0001", pciAddress: "0000:5e:00.0", sizeBytes: 64 * MIB },
  { serial: "LABA0002", pciAddress: "0000:5f:00.0", sizeBytes: 128 * MIB },
];

let scratch: ScratchRoot;
beforeAll(async () => {
  scratch = await scratchRoot("storage-prep");
});
afterAll(async () => {
  await scratch?.remove();
});

describe("hostPathOf", () => {
  test("maps the node's /run, /var/lib and /var/log onto its directories", () => {
    expect(hostPathOf("/lab/nodes/n1", "/run/distort-lab/nvme-host")).toBe(
      "/lab/nodes/n1/run/distort-lab/nvme-host",
    );
    expect(hostPathOf("/lab/nodes/n1", "/var/lib/distort-lab/storage")).toBe(
      "/lab/nodes/n1/var-lib/distort-lab/storage",
    );
    expect(hostPathOf("/lab/nodes/n1", "/var/log")).toBe("/lab/nodes/n1/var-log");
  });

  test("refuses the machine's own paths and relative ones", () => {
    for (const p of ["/etc/nvme", "/var/libx/a", "/run/../etc", "/var", "var/lib/x"])
      expect(() => hostPathOf("/lab/nodes/n1", p)).toThrow();
  });
});

describe("prepareLabNode", () => {
  test("a storage node: sysfs tree, drives.json and backing files the emulator serves", async () => {
    const nodeDir = join(scratch.path, "nodes", "storage-a");
    const node = await prepareLabNode(nodeDir, { drives: DRIVES });
    const layout = storageLayout(hostPathOf(nodeDir, NODE_PATHS.storage));
    expect(node.storage).toEqual(layout);

    // drives.json is what the emulator's --sim-drives loads: the drives, with the lab's model.
    expect(loadDrives(layout.drivesFile)).toEqual(DRIVES.map((d) => ({ ...d, model: LAB_DRIVE_MODEL })));

    // The sysfs tree: one PCIe controller per drive with its serial, linked by a relative symlink.
    const ctrls = readdirSync(join(layout.hostRoot, "sys/class/nvme")).sort();
    expect(ctrls).toEqual(["nvme0", "nvme1"]);
    for (const [i, d] of DRIVES.entries()) {
      const dir = join(layout.hostRoot, "sys/class/nvme", `nvme${i}`);
      expect(readFileSync(join(dir, "serial"), "utf8").trim()).toBe(d.serial);
      expect(readlinkSync(dir).startsWith("/")).toBe(false);
    }

    // Sparse backing files at the drives' sizes.
    const files = readdirSync(join(layout.dataDir, "drives")).sort();
    expect(files).toEqual(["0000_5e_00.0.img", "0000_5f_00.0.img"]);
    const first = join(layout.dataDir, "drives", files[0] as string);
    expect(statSync(first).size).toBe(64 * MIB);
    expect(statSync(first).blocks * 512).toBeLessThan(MIB);

    // Bytes written to a drive survive a second preparation (a lab restart).
    writeFileSync(first, "keep me", { flag: "r+" });
    await prepareLabNode(nodeDir, { drives: DRIVES });
    expect(readFileSync(first).subarray(0, 7).toString()).toBe("keep me");
    expect(statSync(first).size).toBe(64 * MIB);

    // The emulator, given the chart's --sim-data-dir and --sim-drives, attaches both drives.
    const socketPath = join(scratch.path, "spdk.sock");
    const tgt = await startSpdkEmulator({
      // What is answered, not when: rpc-clock.test.ts covers the poller.
      rpcPollMs: 0,
      socketPath,
      dataDir: layout.dataDir,
      drives: loadDrives(layout.drivesFile),
    });
    try {
      const names = await call(socketPath, "bdev_nvme_attach_controller", {
        name: "Nvme1",
        trtype: "PCIe",
        traddr: "0000:5f:00.0",
      });
      expect(names).toEqual(["Nvme1n1"]);
      const [bdev] = (await call(socketPath, "bdev_get_bdevs", { name: "Nvme1n1" })) as {
        block_size: number;
        num_blocks: number;
      }[];
      expect((bdev?.block_size ?? 0) * (bdev?.num_blocks ?? 0)).toBe(128 * MIB);
    } finally {
      await tgt.close();
    }
  });

  test("every node: the NVMe host directory and a host NQN kept across preparations", async () => {
    const nodeDir = join(scratch.path, "nodes", "worker-a");
    const a = await prepareLabNode(nodeDir);
    expect(a.storage).toBeUndefined();
    expect(statSync(hostPathOf(nodeDir, NODE_PATHS.nvmeHostDir)).isDirectory()).toBe(true);
    expect(a.nvmeHostDir).toBe(join(nodeDir, "run/distort-lab/nvme-host"));
    expect(a.hostNqn).toMatch(/^nqn\.2014-08\.org\.nvmexpress:uuid:[0-9a-f-]{36}$/);
    expect(readFileSync(join(a.nvmeConfigDir, "hostnqn"), "utf8")).toBe(`${a.hostNqn}\n`);
    const again = await prepareLabNode(nodeDir);
    expect(again.hostNqn).toBe(a.hostNqn);
    const other = await prepareLabNode(join(scratch.path, "nodes", "worker-b"));
    expect(other.hostNqn).not.toBe(a.hostNqn);
  });

  test("a storage node without drives is refused", async () => {
    await expect(prepareLabNode(join(scratch.path, "nodes", "empty"), { drives: [] })).rejects.toThrow(
      "at least one drive",
    );
  });
});
