// The simulated nvmet against the simulated configfs, one kernel rule per test: hosts checked at
// connect only, port unlink ends controllers, a disabled namespace fails I/O, debugfs lists live
// controllers, DH-HMAC-CHAP with the host entry's keys, and the backstop rescan for writers that cannot notify.
import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdir, mkdtemp, open, readdir, readFile, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generateDhchapSecret } from "../../../lib/nvme/dhchap.ts";
import { type SimConfigfs, simConfigfs } from "../configfs/sim-configfs.ts";
import { connectController, createFabric, type FabricController, type SimFabric } from "../spdk/fabric.ts";
import type { HostDhchapOptions } from "../spdk/fabric-auth.ts";
import { Errno } from "../spdk/rpc-error.ts";
import { type SimNvmet, type SimNvmetOptions, startSimNvmet } from "./sim-nvmet.ts";

const NVMET = "/sys/kernel/config/nvmet";
const A = "nqn.2026-02.io.distort:volume-vol-aaaa01";
const B = "nqn.2026-02.io.distort:volume-vol-bbbb02";
const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";

let root: string;
let fabric: SimFabric;
let sim: SimConfigfs;
let nvmet: SimNvmet;
const ctrls: FabricController[] = [];

async function start(opts: Partial<SimNvmetOptions> = {}, notify = true): Promise<void> {
  let hook: SimNvmet | undefined;
  sim = simConfigfs(root, notify ? { onChange: async () => hook?.rescan() } : {});
  await sim.loadNvmet();
  nvmet = await startSimNvmet({
    nvmetDir: join(root, NVMET),
    fabric,
    debugfsDir: join(root, "debugfs/nvmet"),
    resolveDevice: (p) => join(root, p),
    ...opts,
  });
  hook = nvmet;
}

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "nvmet-"));
  await mkdir(join(root, "dev"));
  for (const d of ["sda1", "sda2"]) {
    await open(join(root, "dev", d), "w").then((f) => f.close());
    await truncate(join(root, "dev", d), 1 << 20);
  }
  fabric = createFabric(join(root, "f"));
});

afterEach(async () => {
  for (const c of ctrls.splice(0)) c.close();
  await nvmet?.close();
  await rm(root, { recursive: true, force: true });
});

/** A subsystem with namespace 1 on /dev/<dev>, the given hosts, linked to port 1 (tcp 127.0.0.9:4420). */
async function exportSub(nqn: string, dev: string, hosts: string[]): Promise<void> {
  const s = `${NVMET}/subsystems/${nqn}`;
  await sim.mkdir(s);
  await sim.mkdir(`${s}/namespaces/1`);
  await sim.writeFile(`${s}/namespaces/1/device_path`, `/dev/${dev}`);
  await sim.writeFile(`${s}/namespaces/1/enable`, "1");
  for (const h of hosts) {
    if (!(await sim.exists(`${NVMET}/hosts/${h}`))) await sim.mkdir(`${NVMET}/hosts/${h}`);
    await sim.symlink(`${NVMET}/hosts/${h}`, `${s}/allowed_hosts/${h}`);
  }
  const port = `${NVMET}/ports/1`;
  if (!(await sim.exists(port))) {
    await sim.mkdir(port);
    await sim.writeFile(`${port}/addr_trtype`, "tcp");
    await sim.writeFile(`${port}/addr_adrfam`, "ipv4");
    await sim.writeFile(`${port}/addr_traddr`, "127.0.0.9");
    await sim.writeFile(`${port}/addr_trsvcid`, "4420");
  }
  await sim.symlink(s, `${port}/subsystems/${nqn}`);
}

async function connect(subnqn: string, hostnqn: string): Promise<FabricController> {
  const c = await connectController(fabric, {
    trtype: "TCP",
    traddr: "127.0.0.9",
    trsvcid: "4420",
    subnqn,
    hostnqn,
    hostid: hostnqn.slice(-36),
  });
  ctrls.push(c);
  return c;
}

const bytes = (s: string) => Buffer.concat([Buffer.from(s), Buffer.alloc(512 - s.length)]);

test("a host is checked at connect: unlisted hosts and unlinked subsystems are refused", async () => {
  await start();
  await exportSub(A, "sda1", [H1]);
  await expect(connect(A, H2)).rejects.toThrow(`connect by host ${H2} for subsystem ${A} not allowed`);
  await expect(connect(B, H1)).rejects.toThrow(`connect request for invalid subsystem ${B}`);
  const c = await connect(A, H1);
  await c.write(1, 0, bytes("through nvmet"));
  expect((await readFile(join(root, "dev/sda1"))).subarray(0, 13).toString()).toBe("through nvmet");
  expect(c.ctrlr.subnqn).toBe(A);
  expect(c.namespaces.map((n) => [n.nsid, n.numBlocks])).toEqual([[1, 2048]]);
});

test("Write Zeroes zeroes exactly its range, however long (written a MiB at a time)", async () => {
  const size = 3 * (1 << 20) + 4096;
  await writeFile(join(root, "dev", "sda2"), Buffer.alloc(size, 0xff));
  await start();
  await exportSub(A, "sda2", [H1]);
  const c = await connect(A, H1);
  await c.writeZeroes(1, 512, size - 1024);
  const after = await readFile(join(root, "dev/sda2"));
  expect(after.subarray(0, 512).every((b) => b === 0xff)).toBe(true);
  expect(after.subarray(512, size - 512).every((b) => b === 0)).toBe(true);
  expect(after.subarray(size - 512).every((b) => b === 0xff)).toBe(true);
});

test("removing an allowed_hosts link leaves the host's live controller working (nvmet_allowed_hosts_drop_link)", async () => {
  await start();
  await exportSub(A, "sda1", [H1]);
  const c = await connect(A, H1);
  await sim.unlink(`${NVMET}/subsystems/${A}/allowed_hosts/${H1}`);
  await c.write(1, 512, bytes("still writing"));
  expect((await c.read(1, 512, 512)).subarray(0, 13).toString()).toBe("still writing");
  await expect(connect(A, H1)).rejects.toThrow("not allowed");
});

test("unlinking a subsystem from a port ends its controllers there, and only its own (nvmet_port_del_ctrls)", async () => {
  await start();
  await exportSub(A, "sda1", [H1]);
  await exportSub(B, "sda2", [H1]);
  const a = await connect(A, H1);
  const b = await connect(B, H1);
  await sim.unlink(`${NVMET}/ports/1/subsystems/${A}`);
  await expect(a.write(1, 0, bytes("late"))).rejects.toThrow();
  await b.write(1, 0, bytes("other subsystem"));
  expect(b.closed).toBe(false);
  // The last link gone, the port stops listening.
  await sim.unlink(`${NVMET}/ports/1/subsystems/${B}`);
  await expect(connect(B, H1)).rejects.toMatchObject({ errno: Errno.ENODEV });
});

test("a disabled namespace fails I/O while the controller stays; enabled again, I/O works", async () => {
  await start();
  await exportSub(A, "sda1", [H1]);
  const c = await connect(A, H1);
  const notices: number[][] = [];
  c.onNamespaces((ns) => notices.push(ns.map((n) => n.nsid)));
  await sim.writeFile(`${NVMET}/subsystems/${A}/namespaces/1/enable`, "0");
  await expect(c.write(1, 0, bytes("x"))).rejects.toMatchObject({ errno: Errno.EIO });
  expect(c.closed).toBe(false);
  await sim.writeFile(`${NVMET}/subsystems/${A}/namespaces/1/enable`, "1");
  await c.write(1, 0, bytes("back"));
  expect(notices).toEqual([[], [1]]);
});

test("debugfs lists each live controller with its host and port, and drops it when it goes", async () => {
  await start();
  await exportSub(A, "sda1", [H1, H2]);
  const c1 = await connect(A, H1);
  await connect(A, H2);
  const dir = join(root, "debugfs/nvmet", A);
  expect((await readdir(dir)).sort()).toEqual(["ctrl1", "ctrl2"]);
  expect(await readFile(join(dir, "ctrl1/hostnqn"), "utf8")).toBe(H1);
  expect(await readFile(join(dir, "ctrl1/port"), "utf8")).toBe("1\n");
  expect(await readFile(join(dir, "ctrl1/state"), "utf8")).toBe("ready\n");
  expect(nvmet.controllers().map((c) => [c.cntlid, c.hostnqn])).toEqual([
    [1, H1],
    [2, H2],
  ]);
  c1.close();
  const deadline = Date.now() + 5000;
  while ((await readdir(dir)).includes("ctrl1") && Date.now() < deadline) await Bun.sleep(10);
  expect(await readdir(dir)).toEqual(["ctrl2"]);
});

test("a host whose entry has a dhchap_key must pass DH-HMAC-CHAP with that key; none or a wrong one is refused", async () => {
  await start();
  await exportSub(A, "sda1", [H1]);
  const key = generateDhchapSecret();
  await sim.writeFile(`${NVMET}/hosts/${H1}/dhchap_key`, key);
  const dial = (dhchap?: HostDhchapOptions) =>
    connectController(fabric, {
      trtype: "TCP",
      traddr: "127.0.0.9",
      trsvcid: "4420",
      subnqn: A,
      hostnqn: H1,
      hostid: H1.slice(-36),
      ...(dhchap ? { dhchap } : {}),
    }).then((c) => {
      ctrls.push(c);
      return c;
    });
  await expect(dial()).rejects.toMatchObject({ errno: Errno.ENOKEY });
  await expect(dial({ secret: generateDhchapSecret() })).rejects.toMatchObject({ errno: Errno.ECONNREFUSED });
  const c = await dial({ secret: key });
  await c.write(1, 0, bytes("authenticated"));
  // nvmet_auth_negotiate falls back to the host's first usable hash when the entry's is not
  // offered: a host offering only hmac(sha512) still authenticates with the right key, and not
  // with a wrong one.
  const fallback = await dial({ secret: key, hashes: [3] });
  await fallback.write(1, 4096, bytes("fallback hash"));
  await expect(dial({ secret: generateDhchapSecret(), hashes: [3] })).rejects.toMatchObject({
    errno: Errno.ECONNREFUSED,
  });
  // With a controller key the host checks the controller too (bidirectional).
  const ctrlKey = generateDhchapSecret();
  await sim.writeFile(`${NVMET}/hosts/${H1}/dhchap_ctrl_key`, ctrlKey);
  await sim.writeFile(`${NVMET}/hosts/${H1}/dhchap_hash`, "hmac(sha512)");
  await sim.writeFile(`${NVMET}/hosts/${H1}/dhchap_dhgroup`, "ffdhe2048");
  await dial({ secret: key, ctrlSecret: ctrlKey });
  await expect(dial({ secret: key, ctrlSecret: generateDhchapSecret() })).rejects.toMatchObject({
    errno: Errno.ECONNREFUSED,
  });
});

test("without notices, the backstop rescan picks up changes a plain writer made", async () => {
  await start({ watchIntervalMs: 20 }, false);
  await exportSub(A, "sda1", [H1]);
  const deadline = Date.now() + 5000;
  let c: FabricController | undefined;
  while (!c && Date.now() < deadline) {
    c = await connect(A, H1).catch(() => undefined);
    if (!c) await Bun.sleep(20);
  }
  expect(c?.ctrlr.subnqn).toBe(A);
});
