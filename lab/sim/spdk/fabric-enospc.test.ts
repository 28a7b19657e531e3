// A full lvstore seen through the fabric, as on SPDK: two thin lvols overcommit one lvstore, the
// first takes every free cluster, a write to the second that needs a new cluster fails with EIO
// at the initiator (SPDK's Internal Device Error, not ENOSPC), rewriting allocated clusters still
// works, and deleting the first lvol frees clusters the second can then allocate.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SpdkEmulator, startSpdkEmulator } from "./emulator.ts";
import { connectController, createFabric, type FabricController, type SimFabric } from "./fabric.ts";
import { call } from "./raw-rpc-client.ts";

const MIB = 1024 * 1024;
const CLUSTER = 4 * MIB;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:1b0f4a52-93e7-4b5e-a0c4-7e3b2d9f6c11";
const ADDR = { trtype: "TCP", adrfam: "ipv4", traddr: "10.9.0.3", trsvcid: "4420" };
const nqn = (n: string) => `nqn.2026-02.io.distort:${n}`;

let root: string;
let target: SpdkEmulator;
let fabric: SimFabric;
let free0: number;
const ctrls: FabricController[] = [];

async function freeClusters(): Promise<number> {
  const [s] = (await call(target.socketPath, "bdev_lvol_get_lvstores")) as { free_clusters: number }[];
  return s?.free_clusters ?? -1;
}

async function exportLvol(name: string, mib: number): Promise<FabricController> {
  const t = target.socketPath;
  await call(t, "bdev_lvol_create", {
    lvs_name: "lvs0",
    lvol_name: name,
    size_in_mib: mib,
    thin_provision: true,
  });
  await call(t, "nvmf_create_subsystem", { nqn: nqn(name), serial_number: `S-${name}` });
  await call(t, "nvmf_subsystem_add_ns", { nqn: nqn(name), namespace: { bdev_name: `lvs0/${name}` } });
  await call(t, "nvmf_subsystem_add_listener", { nqn: nqn(name), listen_address: ADDR });
  await call(t, "nvmf_subsystem_add_host", { nqn: nqn(name), host: HOST });
  const c = await connectController(fabric, {
    ...ADDR,
    subnqn: nqn(name),
    hostnqn: HOST,
    hostid: "h-enospc",
  });
  ctrls.push(c);
  return c;
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "distort-enospc-"));
  fabric = createFabric(join(root, "f"));
  target = await startSpdkEmulator({
    // What is answered, not when: rpc-clock.test.ts covers the poller.
    rpcPollMs: 0,
    socketPath: join(root, "t.sock"),
    dataDir: join(root, "t"),
    fabric,
    drives: [{ pciAddress: "0000:5e:00.0", serial: "SENOSPC", model: "Sim", sizeBytes: 64 * MIB }],
  });
  const t = target.socketPath;
  await call(t, "bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
  await call(t, "bdev_lvol_create_lvstore", { bdev_name: "Nvme0n1", lvs_name: "lvs0" });
  await call(t, "nvmf_create_transport", { trtype: "TCP" });
  free0 = await freeClusters();
});

afterAll(async () => {
  for (const c of ctrls) c.close();
  await target?.close();
  rmSync(root, { recursive: true, force: true });
});

test("the second thin lvol's write fails with EIO once the first took every cluster; deleting frees", async () => {
  expect(free0).toBeGreaterThan(2);
  // Each lvol as large as the whole store: together 2x overcommitted.
  const mib = (free0 * CLUSTER) / MIB;
  const a = await exportLvol("fill", mib);
  const b = await exportLvol("other", mib);
  await b.write(1, 0, Buffer.alloc(4096, 0xbb)); // b owns one cluster
  for (let c = 0; c < free0 - 1; c++) await a.write(1, c * CLUSTER, Buffer.alloc(4096, 0xaa));
  expect(await freeClusters()).toBe(0);

  // A new cluster is needed: the command fails, and the initiator sees EIO (5), not ENOSPC (28).
  const err = await b.write(1, CLUSTER, Buffer.alloc(4096, 0xcc)).catch((e: { errno?: number }) => e);
  expect((err as { errno?: number }).errno).toBe(5);
  // The same for the filler past its last cluster.
  expect(await a.write(1, (free0 - 1) * CLUSTER, Buffer.alloc(512)).catch((e) => e.errno)).toBe(5);
  // Clusters already allocated still take writes, and what failed left nothing behind.
  await b.write(1, 4096, Buffer.alloc(4096, 0xdd));
  expect(
    (await b.read(1, 0, 8192)).equals(Buffer.concat([Buffer.alloc(4096, 0xbb), Buffer.alloc(4096, 0xdd)])),
  ).toBe(true);
  expect((await b.read(1, CLUSTER, 4096)).equals(Buffer.alloc(4096))).toBe(true);

  // Deleting the filler frees its clusters: the write that failed now succeeds.
  ctrls.shift()?.close();
  await call(target.socketPath, "nvmf_delete_subsystem", { nqn: nqn("fill") });
  await call(target.socketPath, "bdev_lvol_delete", { name: "lvs0/fill" });
  expect(await freeClusters()).toBe(free0 - 1);
  await b.write(1, CLUSTER, Buffer.alloc(4096, 0xcc));
  expect((await b.read(1, CLUSTER, 4096)).equals(Buffer.alloc(4096, 0xcc))).toBe(true);
});
