// The lab initiator over lvols, with losetup scripted (a table of loop devices that the emulator
// consults as its extentInUse): a loop device over a thick lvol's extent of the drive file, a
// resize followed on rescan (size limit raised), a relocation refused while mapped and allowed
// once disconnected (the next connect maps the new place), an extent that moves during the attach
// re-attached, a thin lvol over its own file (grown while mapped), and snapshots refused with
// nothing left attached.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ScriptedExec } from "../../../csi/host/scripted-exec.ts";
import type { FileExtent } from "../spdk/block-io.ts";
import type { LoopControl } from "./loop-control.ts";
import { type NamespaceBackingResolver, spdkRpcBackingResolver } from "./namespace-backing.ts";
import { SimNvmeInitiator } from "./sim-initiator.ts";
import { type ExportSpec, startTestTarget, TEST_LVSTORE, type TestTarget } from "./test-target.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:7d1c3a55-2b0e-4f7a-9c41-5e6f7a8b9c0d";
const spec = (n: number, over: Partial<ExportSpec> = {}): ExportSpec => ({
  nqn: `nqn.2026-01.io.distort:lvol-${n}`,
  sizeBytes: 8 * MIB,
  hosts: [HOST],
  uuid: `11111111-2222-4333-8444-${String(n).padStart(12, "0")}`,
  trsvcid: String(4430 + n),
  ...over,
});
const params = (s: ExportSpec) => ({
  transport: "tcp" as const,
  address: "127.0.0.1",
  port: Number(s.trsvcid),
  nqn: s.nqn,
  hostNqn: HOST,
});

/** Attached loop devices, as losetup and the kernel would keep them. */
const attached = new Map<string, { file: string; offset: number; sizelimit: number }>();
let next = 20;

/** losetup over `attached`, honouring --offset and --sizelimit. */
function fakeLosetup() {
  return new ScriptedExec()
    .on(["losetup", "--list"], () => ({
      stdout: JSON.stringify({
        loopdevices: [...attached].map(([name, a]) => ({
          name,
          "back-file": a.file,
          ro: false,
          offset: a.offset,
          sizelimit: a.sizelimit,
        })),
      }),
    }))
    .on(["losetup", "--find"], (argv) => {
      const opt = (flag: string) => {
        const at = argv.indexOf(flag);
        return at < 0 ? 0 : Number(argv[at + 1]);
      };
      const name = `/dev/loop${next++}`;
      attached.set(name, {
        file: argv.at(-1) as string,
        offset: opt("--offset"),
        sizelimit: opt("--sizelimit"),
      });
      return { stdout: `${name}\n` };
    })
    .on(["losetup", "--detach"], (argv) => {
      attached.delete(argv[2] as string);
      return {};
    });
}

/** LOOP_SET_STATUS64 on the table. */
const loopControl: LoopControl & { calls: [string, number, number][] } = {
  calls: [],
  async setExtent(device, offset, sizeLimit) {
    this.calls.push([device, offset, sizeLimit]);
    const a = attached.get(device);
    if (a === undefined) throw new Error(`${device} is not attached`);
    attached.set(device, { ...a, offset, sizelimit: sizeLimit });
  },
};

/** The emulator's question: does a loop device in the table overlap the extent? */
const inUse = (e: FileExtent) =>
  [...attached.values()].some(
    (a) =>
      a.file === e.path && a.offset < e.offset + e.length && e.offset < a.offset + (a.sizelimit || Infinity),
  );

let target: TestTarget;
let stateDir: string;

beforeAll(async () => {
  target = await startTestTarget({
    drives: [{ pciAddress: "0000:af:00.0", serial: "LAB00001", model: "Sim NVMe", sizeBytes: 256 * MIB }],
    extentInUse: inUse,
  });
  stateDir = mkdtempSync(join(tmpdir(), "sim-init-lvol-"));
});
afterAll(async () => {
  await target.close();
  rmSync(stateDir, { recursive: true, force: true });
});

const initiator = (
  exec: ScriptedExec,
  backing: NamespaceBackingResolver = spdkRpcBackingResolver(target.rpc),
) => new SimNvmeInitiator({ fabric: target.fabric, stateDir, exec, backing, loopControl });

type Extent = { filename: string; offset: number; length: number };
const extentOf = async (bdev: string) =>
  (
    (await target.rpc.call("bdev_get_bdevs", { name: bdev })) as {
      driver_specific: { sim_extent?: Extent };
    }[]
  )[0]?.driver_specific.sim_extent;

/** Polls until `fn` is true (the target's namespace notices arrive asynchronously). */
async function until(fn: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 100 && !(await fn()); i++) await Bun.sleep(5);
}

test("thick lvols attach over their extent; resizes are followed or refused; disconnect lets them move", async () => {
  const one = spec(1);
  const two = spec(2);
  const bdev1 = await target.exportLvol(one, "vol1");
  const bdev2 = await target.exportLvol(two, "vol2");
  const e1 = (await extentOf(bdev1)) as Extent;
  const e2 = (await extentOf(bdev2)) as Extent;
  expect(e2.offset).toBe(e1.offset + 8 * MIB);
  const exec = fakeLosetup();
  const init = initiator(exec);
  try {
    await init.connect(params(one));
    await init.connect(params(two));
    expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toEqual([
      [
        "losetup",
        "--find",
        "--show",
        "--offset",
        String(e1.offset),
        "--sizelimit",
        String(8 * MIB),
        e1.filename,
      ],
      [
        "losetup",
        "--find",
        "--show",
        "--offset",
        String(e2.offset),
        "--sizelimit",
        String(8 * MIB),
        e2.filename,
      ],
    ]);
    const dev1 = (await init.findNamespaceDevice(one.nqn, one.uuid)) as string;
    const dev2 = (await init.findNamespaceDevice(two.nqn, two.uuid)) as string;
    expect([dev1, dev2]).toEqual(["/dev/loop20", "/dev/loop21"]);

    // vol2 is last on the drive: it grows in place, and rescan raises the loop device's limit.
    await target.rpc.call("bdev_lvol_resize", { name: bdev2, size_in_mib: 20 });
    await until(async () => {
      await init.rescan(two.nqn);
      return loopControl.calls.length > 0;
    });
    expect(loopControl.calls).toEqual([[dev2, e2.offset, 20 * MIB]]);
    expect(attached.get(dev2)).toEqual({ file: e2.filename, offset: e2.offset, sizelimit: 20 * MIB });
    await init.rescan(two.nqn);
    expect(loopControl.calls).toHaveLength(1);
    expect(await init.findNamespaceDevice(two.nqn, two.uuid)).toBe(dev2);

    // vol1 is boxed in by vol2 and mapped: the target refuses to move it from under the device.
    const refused = await target.rpc.call("bdev_lvol_resize", { name: bdev1, size_in_mib: 16 }).then(
      () => "resized",
      (e: Error) => e.message,
    );
    expect(refused).toContain("Device or resource busy");
    expect(await extentOf(bdev1)).toEqual(e1);

    // Disconnected, it moves; the next connect maps the new place.
    await init.disconnect(one.nqn);
    expect(attached.has(dev1)).toBe(false);
    await target.rpc.call("bdev_lvol_resize", { name: bdev1, size_in_mib: 16 });
    const moved = (await extentOf(bdev1)) as Extent;
    expect(moved.offset).toBeGreaterThanOrEqual(e2.offset + 20 * MIB);
    await init.connect(params(one));
    const dev1b = (await init.findNamespaceDevice(one.nqn, one.uuid)) as string;
    expect(attached.get(dev1b)).toEqual({ file: moved.filename, offset: moved.offset, sizelimit: 16 * MIB });
  } finally {
    await init.disconnect(one.nqn);
    await init.disconnect(two.nqn);
    init.close();
  }
  expect(attached.size).toBe(0);
});

test("an extent that moves while it is being attached is attached again at its new place", async () => {
  const three = spec(3);
  const bdev = await target.exportLvol(three, "vol3");
  const real = spdkRpcBackingResolver(target.rpc);
  let first = true;
  // The first lookup is stale: it names where the lvol was before a (simulated) relocation.
  const stale: NamespaceBackingResolver = async (nqn, ns) => {
    const b = await real(nqn, ns);
    if (!first) return b;
    first = false;
    return { ...b, offset: b.offset + 64 * MIB };
  };
  const exec = fakeLosetup();
  const init = initiator(exec, stale);
  try {
    await init.connect(params(three));
    const e = (await extentOf(bdev)) as Extent;
    const finds = exec.argvOf("losetup").filter((a) => a[1] === "--find");
    expect(finds.map((a) => a[4])).toEqual([String(e.offset + 64 * MIB), String(e.offset)]);
    expect(exec.argvOf("losetup").filter((a) => a[1] === "--detach")).toHaveLength(1);
    const dev = (await init.findNamespaceDevice(three.nqn)) as string;
    expect(attached.get(dev)?.offset).toBe(e.offset);
    expect(attached.size).toBe(1);
  } finally {
    await init.disconnect(three.nqn);
    init.close();
  }
  expect(attached.size).toBe(0);
});

/** Exports an existing bdev as namespace 1 of `sp`'s subsystem, to HOST. */
async function exportBdev(sp: ExportSpec, bdev: string): Promise<void> {
  await target.rpc.call("nvmf_create_subsystem", { nqn: sp.nqn });
  await target.rpc.call("nvmf_subsystem_add_ns", {
    nqn: sp.nqn,
    namespace: { bdev_name: bdev, nsid: 1, uuid: sp.uuid },
  });
  await target.rpc.call("nvmf_subsystem_add_listener", {
    nqn: sp.nqn,
    listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.1", trsvcid: sp.trsvcid },
  });
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: sp.nqn, host: HOST });
}

test("a thin lvol attaches over its own file, whole, and is followed when it grows while mapped", async () => {
  const four = spec(4);
  await target.rpc.call("bdev_lvol_create", {
    lvs_name: TEST_LVSTORE,
    lvol_name: "thin4",
    size_in_mib: 8,
    thin_provision: true,
  });
  await exportBdev(four, `${TEST_LVSTORE}/thin4`);
  const e = (await extentOf(`${TEST_LVSTORE}/thin4`)) as Extent;
  expect(e).toMatchObject({ offset: 0, length: 8 * MIB });
  expect(e.filename).toEndWith(".img");
  const exec = fakeLosetup().on(["losetup", "--set-capacity"], () => ({}));
  const init = initiator(exec);
  try {
    await init.connect(params(four));
    // The whole file: no offset or size limit, so --set-capacity follows its length.
    expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toEqual([
      ["losetup", "--find", "--show", e.filename],
    ]);
    const dev = (await init.findNamespaceDevice(four.nqn, four.uuid)) as string;
    // Mapped, it still grows (the file gets longer in place); rescan re-reads the size.
    await target.rpc.call("bdev_lvol_resize", { name: `${TEST_LVSTORE}/thin4`, size_in_mib: 12 });
    expect(await extentOf(`${TEST_LVSTORE}/thin4`)).toEqual({ ...e, length: 12 * MIB });
    await until(async () => {
      await init.rescan(four.nqn);
      return exec.argvOf("losetup").some((a) => a[1] === "--set-capacity");
    });
    expect(exec.argvOf("losetup").filter((a) => a[1] === "--set-capacity")).toEqual([
      ["losetup", "--set-capacity", dev],
    ]);
    // Shrinking under the mapping is refused.
    const refused = await target.rpc
      .call("bdev_lvol_resize", { name: `${TEST_LVSTORE}/thin4`, size_in_mib: 4 })
      .then(
        () => "resized",
        (x: Error) => x.message,
      );
    expect(refused).toContain("Device or resource busy");
  } finally {
    await init.disconnect(four.nqn);
    init.close();
  }
  expect(attached.size).toBe(0);
});

test("a snapshot is refused with the reason, and nothing stays attached or connected", async () => {
  const five = spec(5);
  await target.exportLvol(spec(6), "origin6");
  await target.rpc.call("bdev_lvol_snapshot", {
    lvol_name: `${TEST_LVSTORE}/origin6`,
    snapshot_name: "snap6",
  });
  await exportBdev(five, `${TEST_LVSTORE}/snap6`);
  const exec = fakeLosetup();
  const init = initiator(exec);
  try {
    const err = await init.connect(params(five)).catch((e) => e);
    expect(err.kind).toBe("unimplemented");
    expect(err.message).toContain("a snapshot");
    expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toEqual([]);
    expect(await init.list()).toEqual([]);
    await until(
      () => target.emulator.state().subsystems.find((x) => x.nqn === five.nqn)?.controllers.length === 0,
    );
    expect(target.emulator.state().subsystems.find((x) => x.nqn === five.nqn)?.controllers).toEqual([]);
  } finally {
    init.close();
  }
});
