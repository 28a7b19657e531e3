// The lab host's NVMe driver against a real emulated target, a real FUSE mount and real loop
// devices: the ACL refuses unknown hosts, every block a writer puts on the loop device arrives in
// the target's bdev (and nowhere else), a removed host's I/O is held and then failed with EIO after
// fast_io_fail_tmo, a restored one reconnects and its held I/O completes, a controller lost past
// ctrl_loss_tmo takes its device with it, and a second portal carries I/O when the first goes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostExec } from "../../../lib/exec.ts";
import { type BlockFileServer, mountBlockFiles } from "../fuse/block-files.ts";
import { NvmeHost } from "./nvme-host.ts";
import { startTestTarget, type TestTarget } from "./test-target.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0";
const OTHER = "nqn.2014-08.org.nvmexpress:uuid:00000000-1111-2222-3333-444444444444";
const NQN = "nqn.2026-01.io.distort:vol-host-1";
const UUID = "7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12";
const spec = { nqn: NQN, sizeBytes: 8 * MIB, hosts: [HOST], uuid: UUID, traddr: "10.1.0.7", trsvcid: "4420" };

let target: TestTarget;
let file: string;
let dir: string;
let files: BlockFileServer;
let host: NvmeHost;

beforeAll(async () => {
  target = await startTestTarget();
  file = await target.exportFile(spec);
  dir = mkdtempSync(join(tmpdir(), "nvme-host-"));
  mkdirSync(join(dir, "fuse"));
  files = await mountBlockFiles({ mountpoint: join(dir, "fuse") });
  host = new NvmeHost({
    fabric: target.fabric,
    files,
    exec: hostExec,
    hostId: "5b7e3c1a-0000-4000-8000-000000000001",
    katoMs: 1000,
  });
});
afterAll(async () => {
  await host?.close();
  await files?.close();
  await target.close();
  rmSync(dir, { recursive: true, force: true });
});

const params = (o: Record<string, number | string> = {}) => ({
  transport: "tcp" as const,
  address: "10.1.0.7",
  port: 4420,
  nqn: NQN,
  hostNqn: HOST,
  ...o,
});

/** dd in a child process (this process serves the FUSE file, so it must not block). */
async function dd(args: string[]): Promise<{ code: number; stderr: string }> {
  const p = Bun.spawn(["dd", ...args, "status=none"], { stdout: "pipe", stderr: "pipe" });
  const code = await p.exited;
  return { code, stderr: await new Response(p.stderr).text() };
}

async function writeBlock(
  device: string,
  block: number,
  byte: number,
): Promise<{ code: number; stderr: string }> {
  const src = join(dir, `pattern-${byte}`);
  await Bun.write(src, Buffer.alloc(4096, byte));
  return dd([`if=${src}`, `of=${device}`, "bs=4096", "count=1", `seek=${block}`, "oflag=direct"]);
}

function targetBlock(block: number): Buffer {
  return readFileSync(file).subarray(block * 4096, (block + 1) * 4096);
}

async function until<T>(
  what: string,
  fn: () => Promise<T | undefined> | T | undefined,
  ms = 20_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}

const pathStates = async () => (await host.list()).find((s) => s.nqn === NQN)?.paths.map((p) => p.state);

test("a host the ACL does not allow is refused, and nothing is attached", async () => {
  const err = await host.connect(params({ hostNqn: OTHER })).catch((e) => e);
  expect(err.kind).toBe("unavailable");
  expect(err.message).toContain(`host ${OTHER} not allowed`);
  expect(await host.list()).toEqual([]);
  expect(files.names()).toEqual([]);
  expect((await host.connect(params({ port: 4999 })).catch((e) => e)).kind).toBe("unavailable");
});

test("writes on the device are commands to the target; a removed host is held, then failed, then reconnects", async () => {
  await host.connect(params({ reconnectDelay: 1, fastIoFailTmo: 2, ctrlLossTmo: 60 }));
  await host.connect(params({ reconnectDelay: 1, fastIoFailTmo: 2, ctrlLossTmo: 60 }));
  const dev = await host.findNamespaceDevice(NQN, UUID);
  expect(dev).toMatch(/^\/dev\/loop\d+$/);
  expect(await host.findNamespaceDevice(NQN)).toBe(dev);
  expect(await host.list()).toEqual([
    {
      nqn: NQN,
      hostNqn: HOST,
      name: "nvme-subsys0",
      paths: [{ name: "nvme0", transport: "tcp", traddr: "10.1.0.7", trsvcid: "4420", state: "live" }],
    },
  ]);
  const device = dev as string;
  expect((await writeBlock(device, 3, 0xa1)).code).toBe(0);
  expect(targetBlock(3).equals(Buffer.alloc(4096, 0xa1))).toBe(true);

  // Revoked: the target cuts the controller and refuses the reconnects.
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  await until("path connecting", async () => (await pathStates())?.[0] === "connecting");
  const failed = await writeBlock(device, 4, 0xb2);
  expect(failed.code).not.toBe(0);
  expect(failed.stderr).toContain("Input/output error");
  expect(targetBlock(4).equals(Buffer.alloc(4096))).toBe(true);

  // Allowed again: the path comes back and I/O flows.
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  await until("path live", async () => (await pathStates())?.[0] === "live");
  expect((await writeBlock(device, 5, 0xc3)).code).toBe(0);
  expect(targetBlock(5).equals(Buffer.alloc(4096, 0xc3))).toBe(true);
  await host.disconnect(NQN);
  expect(await host.list()).toEqual([]);
  expect(files.names()).toEqual([]);
});

test("without fast_io_fail_tmo, I/O is held while reconnecting and completes once the path is back", async () => {
  await host.connect(params({ reconnectDelay: 1, ctrlLossTmo: 60 }));
  const device = (await host.findNamespaceDevice(NQN)) as string;
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  await until("path connecting", async () => (await pathStates())?.[0] === "connecting");
  const held = writeBlock(device, 6, 0xd4);
  let done = false;
  void held.then(() => {
    done = true;
  });
  // Held, not failed: still pending across two refused reconnect attempts (a negative cannot be
  // awaited, so this spans two reconnect delays).
  await Bun.sleep(2200);
  expect(done).toBe(false);
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  expect((await held).code).toBe(0);
  expect(targetBlock(6).equals(Buffer.alloc(4096, 0xd4))).toBe(true);
  await host.disconnect(NQN);
});

test("a controller lost for ctrl_loss_tmo is removed with its device, and its I/O fails", async () => {
  await host.connect(params({ reconnectDelay: 1, ctrlLossTmo: 2 }));
  const device = (await host.findNamespaceDevice(NQN)) as string;
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  const r = await writeBlock(device, 7, 0xe5);
  expect(r.code).not.toBe(0);
  await until("subsystem removed", async () => (await host.list()).length === 0 || undefined);
  expect(await host.findNamespaceDevice(NQN)).toBeUndefined();
  // The lost namespace's file stays, answering EIO, until its name is used again.
  const stale = Bun.spawn(
    [
      "dd",
      `if=${files.mountpoint}/${files.names()[0]}`,
      "bs=4096",
      "count=1",
      "iflag=direct",
      "of=/dev/null",
      "status=none",
    ],
    { stderr: "pipe" },
  );
  expect(await stale.exited).not.toBe(0);
  expect(await new Response(stale.stderr).text()).toContain("Input/output error");
  expect(targetBlock(7).equals(Buffer.alloc(4096))).toBe(true);
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

test("two portals: one namespace device; losing a path keeps I/O on the other", async () => {
  await target.rpc.call("nvmf_subsystem_add_listener", {
    nqn: NQN,
    listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "10.1.0.8", trsvcid: "4420" },
  });
  await host.connect(params({ reconnectDelay: 1, ctrlLossTmo: 30 }));
  await host.connect(params({ address: "10.1.0.8", reconnectDelay: 1, ctrlLossTmo: 30 }));
  expect(await pathStates()).toEqual(["live", "live"]);
  expect(files.names()).toHaveLength(1);
  const device = (await host.findNamespaceDevice(NQN)) as string;
  await target.rpc.call("nvmf_subsystem_remove_listener", {
    nqn: NQN,
    listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "10.1.0.7", trsvcid: "4420" },
  });
  await until("first path connecting", async () => (await pathStates())?.[0] === "connecting");
  expect((await writeBlock(device, 8, 0xf6)).code).toBe(0);
  expect(targetBlock(8).equals(Buffer.alloc(4096, 0xf6))).toBe(true);
  expect(await pathStates()).toEqual(["connecting", "live"]);
  await host.disconnect(NQN);
});

test("a second target handing out a controller ID a path of the subsystem already has is refused, as the kernel does", async () => {
  // The first portal, withdrawn by the test before, listens again.
  await target.rpc
    .call("nvmf_subsystem_add_listener", {
      nqn: NQN,
      listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "10.1.0.7", trsvcid: "4420" },
    })
    .catch(() => {});
  await host.connect(params({ reconnectDelay: 1, ctrlLossTmo: 30 }));
  const [mine] = (
    (await target.rpc.call("nvmf_subsystem_get_controllers", { nqn: NQN })) as {
      cntlid: number;
      hostnqn: string;
    }[]
  ).filter((c) => c.hostnqn === HOST);
  if (!mine) throw new Error("no controller of the host on the first target");
  // The same subsystem on a second target (a replicated volume's other node), on the same fabric.
  const second = await startTestTarget({ fabric: target.fabric });
  try {
    await second.exportFile({ ...spec, traddr: "10.1.0.9", minCntlid: mine.cntlid });
    await expect(host.connect(params({ address: "10.1.0.9" }))).rejects.toThrow(
      `duplicate cntlid ${mine.cntlid}`,
    );
    expect(await pathStates()).toEqual(["live"]);
    // The refused controller was closed on the second target.
    await until(
      "the refused controller gone",
      async () =>
        ((await second.rpc.call("nvmf_subsystem_get_controllers", { nqn: NQN })) as unknown[]).length === 0,
    );
    // With a range of its own, the second target's controller joins as another path.
    const [sub] = (await second.rpc.call("nvmf_get_subsystems", { nqn: NQN })) as {
      namespaces: { bdev_name: string }[];
    }[];
    await second.rpc.call("nvmf_delete_subsystem", { nqn: NQN });
    await second.rpc.call("bdev_aio_delete", { name: sub?.namespaces[0]?.bdev_name });
    await second.exportFile({ ...spec, traddr: "10.1.0.9", minCntlid: 4000 });
    await host.connect(params({ address: "10.1.0.9" }));
    expect(await pathStates()).toEqual(["live", "live"]);
  } finally {
    await host.disconnect(NQN);
    await second.close();
  }
});
