// The nvmet process and the configfs writer in different processes, as in the lab: the writer's
// simulated configfs notifies the nvmet process over its socket and each call returns only after
// nvmet acted, so KernelTarget's fencing holds across processes too.
import { afterEach, beforeEach, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { mkdtemp, open, rm, truncate } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KernelTarget } from "../../../agent/backends/kernel/kernel-target.ts";
import type { Exec } from "../../../lib/exec.ts";
import { simConfigfs } from "../configfs/sim-configfs.ts";
import { connectController, createFabric, type FabricController } from "../spdk/fabric.ts";
import { changeNotifier } from "./change-notice.ts";

const NQN = "nqn.2026-02.io.distort:volume-vol-c0ffee";
const OLD = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const NEW = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";
const okExec: Exec = { run: async () => ({ code: 0, stdout: "", stderr: "" }) };

let root: string;
let proc: ReturnType<typeof Bun.spawn> | undefined;
const ctrls: FabricController[] = [];

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "nvmet-proc-"));
});

afterEach(async () => {
  for (const c of ctrls.splice(0)) c.close();
  proc?.kill("SIGTERM");
  await proc?.exited;
  proc = undefined;
  await rm(root, { recursive: true, force: true });
});

test("a revoked host is cut off when nvmet runs in its own process", async () => {
  const disk = join(root, "disk.img");
  await open(disk, "w").then((f) => f.close());
  await truncate(disk, 4 << 20);
  const sock = join(root, "nvmet.sock");
  const sim = simConfigfs(join(root, "host"), {
    onChange: changeNotifier(sock),
    deviceExists: async (p) => existsSync(p),
  });
  await sim.loadNvmet();
  proc = Bun.spawn(
    [
      process.execPath,
      join(import.meta.dir, "main.ts"),
      "--root",
      join(root, "host"),
      "--fabric-dir",
      join(root, "f"),
      "--notice-socket",
      sock,
      "--watch-ms",
      "0",
    ],
    { stdout: "ignore", stderr: "pipe" },
  );
  const deadline = Date.now() + 15_000;
  while (!existsSync(sock) && Date.now() < deadline) await Bun.sleep(20);
  expect(existsSync(sock)).toBe(true);

  const target = new KernelTarget({ fs: sim, exec: okExec });
  await target.ensureExport({
    nqn: NQN,
    volume: { externalId: "vol-c0ffee", backendPath: disk, sizeBytes: 4 << 20 },
    transport: "tcp",
    address: "127.0.0.1",
    port: 4420,
    serialNumber: "c0ffee",
  });
  await target.setHosts(NQN, [OLD]);
  const fabric = createFabric(join(root, "f"));
  const connect = async (hostnqn: string) => {
    const c = await connectController(fabric, {
      trtype: "TCP",
      traddr: "127.0.0.1",
      trsvcid: "4420",
      subnqn: NQN,
      hostnqn,
      hostid: hostnqn.slice(-36),
    });
    ctrls.push(c);
    return c;
  };
  const old = await connect(OLD);
  await old.write(1, 0, Buffer.alloc(512, 1));
  expect((await target.inspectExport(NQN))?.connectedHosts).toEqual([OLD]);

  await target.setHosts(NQN, [NEW]);
  await expect(old.write(1, 512, Buffer.alloc(512, 2))).rejects.toThrow();
  await expect(connect(OLD)).rejects.toThrow(/not allowed/);
  const fresh = await connect(NEW);
  expect((await fresh.read(1, 512, 512)).equals(Buffer.alloc(512))).toBe(true);
  expect((await target.inspectExport(NQN))?.connectedHosts).toEqual([NEW]);
});
