// Fencing on nvmet, proven by I/O: KernelTarget writes the simulated configfs, a simulated nvmet
// serves the fabric from it, and an initiator that was connected before its host was revoked must
// not be able to write afterwards (nvmet checks hosts only at connect, so revoking the ACL alone
// leaves its controllers live).
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdir, open, rm, truncate, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type SimConfigfs, simConfigfs } from "../../../lab/sim/configfs/sim-configfs.ts";
import { type SimNvmet, startSimNvmet } from "../../../lab/sim/nvmet/sim-nvmet.ts";
import {
  connectController,
  createFabric,
  type FabricController,
  type SimFabric,
} from "../../../lab/sim/spdk/fabric.ts";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec } from "../../../lib/exec.ts";
import type { ExportSpec } from "../types.ts";
import { KernelTarget } from "./kernel-target.ts";
import { scratchDir } from "./testdata/scratch.ts";

const NVMET = "/sys/kernel/config/nvmet";
const NQN = "nqn.2026-02.io.distort:volume-vol-3f2a9c";
const OLD = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const NEW = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";
const KEPT = "nqn.2014-08.org.nvmexpress:uuid:c1f0a3b4-9e8d-4c7b-a6f5-e4d3c2b1a098";
const DEVICE = "/dev/nvme0n1p2";
const DEBUGFS = "/sys/kernel/debug/nvmet";
const okExec: Exec = { run: async () => ({ code: 0, stdout: "", stderr: "" }) };

const spec: ExportSpec = {
  nqn: NQN,
  volume: { externalId: "vol-3f2a9c", backendPath: DEVICE, sizeBytes: 8 << 20 },
  transport: "tcp",
  address: "127.0.0.1",
  port: 4420,
  serialNumber: "3f2a9c0d11e24b7a",
};

let root: string;
let fabric: SimFabric;
let nvmet: SimNvmet;
let sim: SimConfigfs;
let target: KernelTarget;
const open_: FabricController[] = [];

/** The node: sim configfs notifying a sim nvmet; with or without nvmet's debugfs. */
async function start(withDebugfs: boolean): Promise<void> {
  let hook: SimNvmet | undefined;
  sim = simConfigfs(root, { onChange: async () => hook?.rescan() });
  await sim.loadNvmet();
  nvmet = await startSimNvmet({
    nvmetDir: join(root, NVMET),
    fabric,
    ...(withDebugfs ? { debugfsDir: join(root, DEBUGFS) } : {}),
    resolveDevice: (p) => join(root, p),
  });
  hook = nvmet;
  target = new KernelTarget({ fs: sim, exec: okExec, debugfsRoot: DEBUGFS, fenceTimeoutMs: 2000 });
}

beforeEach(async () => {
  root = await scratchDir("kfence-");
  await mkdir(join(root, "dev"));
  await open(join(root, DEVICE), "w").then((f) => f.close());
  await truncate(join(root, DEVICE), 8 << 20);
  fabric = createFabric(join(root, "fab"));
});

afterEach(async () => {
  for (const c of open_.splice(0)) c.close();
  await nvmet.close();
  await rm(root, { recursive: true, force: true });
});

function connect(hostnqn: string): Promise<FabricController> {
  return connectController(fabric, {
    trtype: "TCP",
    traddr: "127.0.0.1",
    trsvcid: "4420",
    subnqn: NQN,
    hostnqn,
    hostid: hostnqn.slice(-36),
  }).then((c) => {
    open_.push(c);
    return c;
  });
}

const block = (text: string) => Buffer.concat([Buffer.from(text), Buffer.alloc(4096 - text.length)]);

describe.each([
  ["with nvmet debugfs", true],
  ["without nvmet debugfs", false],
])("%s", (_name, withDebugfs) => {
  test("a host revoked while connected can no longer write, and its late write never reaches the device", async () => {
    await start(withDebugfs);
    await target.ensureExport(spec);
    await target.setHosts(NQN, [OLD]);
    const old = await connect(OLD);
    await old.write(1, 0, block("old writer, before revoke"));

    await target.setHosts(NQN, [NEW]);

    // The old host's next write must fail: its controller is gone, not merely its ACL entry.
    const late = await old.write(1, 4096, block("old writer, AFTER revoke")).then(
      () => "written",
      (err: Error) => `failed: ${err.message}`,
    );
    expect(late).toStartWith("failed");
    // And it cannot come back: nvmet checks the host at connect.
    await expect(connect(OLD)).rejects.toThrow(/not allowed/);

    const fresh = await connect(NEW);
    expect((await fresh.read(1, 0, 4096)).subarray(0, 25).toString()).toBe("old writer, before revoke");
    expect((await fresh.read(1, 4096, 4096)).equals(Buffer.alloc(4096))).toBe(true);
    await fresh.write(1, 8192, block("new writer"));
    expect(nvmet.controllers().map((c) => c.hostnqn)).toEqual([NEW]);
  });
});

describe("with nvmet debugfs", () => {
  beforeEach(() => start(true));

  test("inspectExport lists the hosts holding controllers", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [OLD, KEPT]);
    expect((await target.inspectExport(NQN))?.connectedHosts).toEqual([]);
    await connect(OLD);
    await connect(KEPT);
    expect((await target.inspectExport(NQN))?.connectedHosts).toEqual([KEPT, OLD].sort());
  });

  test("revoking a host that holds no controller leaves the other hosts' controllers alone", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [OLD, KEPT]);
    const kept = await connect(KEPT);
    expect(await target.reconcileHosts(NQN, [KEPT])).toEqual([`revoke:${OLD}`, `host:${OLD}.removed`]);
    await kept.write(1, 0, block("kept writer"));
    expect(kept.closed).toBe(false);
  });

  test("a crash between the ACL revoke and the port bounce is repaired by the next call", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [OLD]);
    const old = await connect(OLD);
    // What a crash right after the allowed_hosts unlink leaves: ACL without OLD, OLD connected.
    await sim.unlink(`${NVMET}/subsystems/${NQN}/allowed_hosts/${OLD}`);
    await old.write(1, 0, block("still connected"));
    expect(await target.reconcileHosts(NQN, [NEW])).toContain("fence:port-1");
    await expect(old.write(1, 0, block("after the repair"))).rejects.toThrow();
  });

  test("controllers that do not go in time leave the call unavailable, so AccessReady is not written", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [OLD]);
    // A controller the bounce cannot end (the sim's debugfs entry without a live connection).
    const stale = join(root, DEBUGFS, NQN, "ctrl77");
    await mkdir(stale, { recursive: true });
    await writeFile(join(stale, "hostnqn"), OLD);
    const impatient = new KernelTarget({ fs: sim, exec: okExec, debugfsRoot: DEBUGFS, fenceTimeoutMs: 200 });
    const err = await impatient.setHosts(NQN, [NEW]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("unavailable");
    expect((err as StorageError).message).toContain(OLD);
    expect((await target.inspectExport(NQN))?.connectedHosts).toEqual([OLD]);
  });
});
