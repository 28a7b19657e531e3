// KernelTarget against the simulated configfs, which enforces the kernel's rules: the order of
// every write, repair of each component after damage, removal, shared ports, crash recovery at
// every step, serialisation, and drive ownership checks through sysfs.
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type SimConfigfs, simConfigfs } from "../../../lab/sim/configfs/sim-configfs.ts";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec } from "../../../lib/exec.ts";
import type { HostFs } from "../../../lib/fs.ts";
import { generateDhchapSecret } from "../../../lib/nvme/dhchap.ts";
import type { DeviceRef, ExportSpec } from "../types.ts";
import { KernelTarget } from "./kernel-target.ts";
import { scratchDir } from "./testdata/scratch.ts";
import { listTree } from "./testdata/tree.ts";

const NVMET = "/sys/kernel/config/nvmet";
const NQN = "nqn.2026-02.io.distort:volume-vol-3f2a9c";
const NQN_B = "nqn.2026-02.io.distort:volume-vol-77b1e0";
const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";
const H3 = "nqn.2014-08.org.nvmexpress:uuid:c1f0a3b4-9e8d-4c7b-a6f5-e4d3c2b1a098";
const SUB = `${NVMET}/subsystems/${NQN}`;
const NS = `${SUB}/namespaces/1`;
const PORT1 = `${NVMET}/ports/1`;

const spec: ExportSpec = {
  nqn: NQN,
  volume: { externalId: "vol-3f2a9c", backendPath: "/dev/nvme0n1p2", sizeBytes: 8 << 20 },
  transport: "rdma",
  address: "192.168.100.7",
  port: 4420,
  serialNumber: "3f2a9c0d11e24b7a",
};
const specB: ExportSpec = {
  ...spec,
  nqn: NQN_B,
  volume: { externalId: "vol-77b1e0", backendPath: "/dev/nvme0n1p3", sizeBytes: 8 << 20 },
  serialNumber: "77b1e0aa",
};

const okExec: Exec = { run: async () => ({ code: 0, stdout: "", stderr: "" }) };

let root: string;
let sim: SimConfigfs;
let target: KernelTarget;

async function freshRoot(): Promise<{ root: string; sim: SimConfigfs }> {
  const r = await scratchDir("kernel-sim-");
  await mkdir(join(r, "dev"));
  for (const p of ["nvme0n1p2", "nvme0n1p3"]) await writeFile(join(r, "dev", p), "");
  const s = simConfigfs(r);
  // Tests read the directory behind the sim's back, so let it finish loading nvmet first.
  await s.loadNvmet();
  return { root: r, sim: s };
}

/** The configfs tree, with the one attribute the kernel fills with random bytes masked. */
const snapshot = (r = root) => listTree(r, NVMET, ["device_uuid"]);

beforeEach(async () => {
  ({ root, sim } = await freshRoot());
  target = new KernelTarget({ fs: sim, exec: okExec });
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("order of writes", () => {
  test("an export is built in the kernel's order and never opened to any host", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [H1, H2]);
    expect(sim.journal).toEqual([
      `mkdir subsystems/${NQN}`,
      `write subsystems/${NQN}/attr_serial "3f2a9c0d11e24b7a"`,
      `mkdir subsystems/${NQN}/namespaces/1`,
      `write subsystems/${NQN}/namespaces/1/device_path "/dev/nvme0n1p2"`,
      `write subsystems/${NQN}/namespaces/1/enable "1"`,
      "mkdir ports/1",
      'write ports/1/addr_trtype "rdma"',
      'write ports/1/addr_adrfam "ipv4"',
      'write ports/1/addr_traddr "192.168.100.7"',
      'write ports/1/addr_trsvcid "4420"',
      `symlink ports/1/subsystems/${NQN} -> subsystems/${NQN}`,
      `mkdir hosts/${H2}`,
      `symlink subsystems/${NQN}/allowed_hosts/${H2} -> hosts/${H2}`,
      `mkdir hosts/${H1}`,
      `symlink subsystems/${NQN}/allowed_hosts/${H1} -> hosts/${H1}`,
    ]);
    expect(await sim.readFile(`${SUB}/attr_allow_any_host`)).toBe("0\n");
  });

  test("setHosts revokes before it adds, then drops host directories nobody links", async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [H1, H2]);
    const mark = sim.journal.length;
    // No nvmet debugfs here, so controllers cannot be seen: every revoke unlinks the subsystem
    // from its port first (ending its controllers) and links it back after.
    expect(await target.reconcileHosts(NQN, [H2, H3])).toEqual([
      "fence:port-1",
      `revoke:${H1}`,
      `host:${H3}`,
      `allow:${H3}`,
      `host:${H1}.removed`,
    ]);
    expect(sim.journal.slice(mark)).toEqual([
      `unlink ports/1/subsystems/${NQN}`,
      `unlink subsystems/${NQN}/allowed_hosts/${H1}`,
      `symlink ports/1/subsystems/${NQN} -> subsystems/${NQN}`,
      `mkdir hosts/${H3}`,
      `symlink subsystems/${NQN}/allowed_hosts/${H3} -> hosts/${H3}`,
      `rmdir hosts/${H1}`,
    ]);
    expect(await target.reconcileHosts(NQN, [])).toEqual([
      "fence:port-1",
      `revoke:${H2}`,
      `revoke:${H3}`,
      `host:${H2}.removed`,
      `host:${H3}.removed`,
    ]);
    expect(await sim.readdir(`${NVMET}/hosts`)).toEqual([]);
  });

  test("bidirectional keys: dhchap_key and dhchap_ctrl_key on the host entry before it is linked", async () => {
    await target.ensureExport(spec);
    const [key, ctrl] = [generateDhchapSecret({ hash: 1 }), generateDhchapSecret({ hash: 1 })];
    const keys = new Map([
      [H1, { secret: key, ctrlSecret: ctrl, hash: "sha384", dhgroup: "ffdhe2048" } as const],
    ]);
    expect(await target.reconcileHosts(NQN, [H1], keys)).toEqual([
      `host:${H1}`,
      `key:${H1}`,
      `dhchap_hash:${H1}`,
      `dhchap_dhgroup:${H1}`,
      `ctrl-key:${H1}`,
      `allow:${H1}`,
    ]);
    expect(await sim.readFile(`${NVMET}/hosts/${H1}/dhchap_hash`)).toBe("hmac(sha384)\n");
    expect(await sim.readFile(`${NVMET}/hosts/${H1}/dhchap_dhgroup`)).toBe("ffdhe2048\n");
    expect(await sim.readFile(`${NVMET}/hosts/${H1}/dhchap_key`)).toBe(`${key}\n`);
    expect(await sim.readFile(`${NVMET}/hosts/${H1}/dhchap_ctrl_key`)).toBe(`${ctrl}\n`);
    // Already exact: nothing written; a rotated controller key alone is rewritten.
    expect(await target.reconcileHosts(NQN, [H1], keys)).toEqual([]);
    const ctrl2 = generateDhchapSecret({ hash: 1 });
    expect(
      await target.reconcileHosts(NQN, [H1], new Map([[H1, { secret: key, ctrlSecret: ctrl2 }]])),
    ).toEqual([`ctrl-key:${H1}`]);
    expect(await sim.readFile(`${NVMET}/hosts/${H1}/dhchap_ctrl_key`)).toBe(`${ctrl2}\n`);
  });

  test("a host shared by two subsystems keeps its directory until the last one revokes it", async () => {
    await target.ensureExport(spec);
    await target.ensureExport(specB);
    await target.setHosts(NQN, [H1]);
    await target.setHosts(NQN_B, [H1]);
    expect(await target.reconcileHosts(NQN, [])).toEqual(["fence:port-1", `revoke:${H1}`]);
    expect(await sim.isDirectory(`${NVMET}/hosts/${H1}`)).toBe(true);
    expect(await target.reconcileHosts(NQN_B, [])).toEqual([
      "fence:port-1",
      `revoke:${H1}`,
      `host:${H1}.removed`,
    ]);
  });
});

describe("repair", () => {
  let clean: string[];

  beforeEach(async () => {
    await target.ensureExport(spec);
    await target.setHosts(NQN, [H1, H2]);
    clean = await snapshot();
  });

  // Each case damages one component through configfs (so only states the kernel allows), then
  // expects ensureExport and setHosts to report exactly that repair and restore the whole tree.
  const cases: [string, () => Promise<void>, string[], string[]][] = [
    ["namespace disabled", () => sim.writeFile(`${NS}/enable`, "0"), ["namespace.enable"], []],
    [
      "namespace pointed at another device",
      async () => {
        await sim.writeFile(`${NS}/enable`, "0");
        await sim.writeFile(`${NS}/device_path`, "/dev/nvme0n1p3");
        await sim.writeFile(`${NS}/enable`, "1");
      },
      ["namespace.device_path"],
      [],
    ],
    ["namespace removed", () => sim.rmdir(NS), ["namespace"], []],
    [
      "namespace made but never enabled",
      async () => {
        await sim.rmdir(NS);
        await sim.mkdir(NS);
        await sim.writeFile(`${NS}/device_path`, "/dev/nvme0n1p2");
      },
      ["namespace.enable"],
      [],
    ],
    [
      "port link removed, hosts already exact",
      () => sim.unlink(`${PORT1}/subsystems/${NQN}`),
      ["port-link"],
      [],
    ],
    [
      "port removed",
      async () => {
        await sim.unlink(`${PORT1}/subsystems/${NQN}`);
        await sim.rmdir(PORT1);
      },
      ["port", "port-link"],
      [],
    ],
    [
      "port left half-written by a crash",
      async () => {
        await sim.unlink(`${PORT1}/subsystems/${NQN}`);
        await sim.rmdir(PORT1);
        await sim.mkdir(PORT1);
        await sim.writeFile(`${PORT1}/addr_trtype`, "rdma");
      },
      ["port", "port-link"],
      [],
    ],
    [
      "subsystem opened to any host",
      async () => {
        await sim.unlink(`${SUB}/allowed_hosts/${H1}`);
        await sim.unlink(`${SUB}/allowed_hosts/${H2}`);
        await sim.writeFile(`${SUB}/attr_allow_any_host`, "1");
      },
      ["subsystem.allow_any_host"],
      [`allow:${H2}`, `allow:${H1}`],
    ],
    ["serial changed", () => sim.writeFile(`${SUB}/attr_serial`, "something-else"), ["subsystem.serial"], []],
    [
      "an extra namespace",
      async () => {
        await sim.mkdir(`${SUB}/namespaces/2`);
        await sim.writeFile(`${SUB}/namespaces/2/device_path`, "/dev/nvme0n1p3");
        await sim.writeFile(`${SUB}/namespaces/2/enable`, "1");
      },
      ["namespace:2.removed"],
      [],
    ],
    [
      "a second, stale listener",
      async () => {
        await sim.mkdir(`${NVMET}/ports/2`);
        await sim.writeFile(`${NVMET}/ports/2/addr_trtype`, "rdma");
        await sim.writeFile(`${NVMET}/ports/2/addr_adrfam`, "ipv4");
        await sim.writeFile(`${NVMET}/ports/2/addr_traddr`, "192.168.100.8");
        await sim.writeFile(`${NVMET}/ports/2/addr_trsvcid`, "4420");
        await sim.symlink(SUB, `${NVMET}/ports/2/subsystems/${NQN}`);
      },
      ["port-link:2.removed", "port:2.removed"],
      [],
    ],
    ["a host link removed", () => sim.unlink(`${SUB}/allowed_hosts/${H1}`), [], [`allow:${H1}`]],
    [
      "an extra host allowed",
      async () => {
        await sim.mkdir(`${NVMET}/hosts/${H3}`);
        await sim.symlink(`${NVMET}/hosts/${H3}`, `${SUB}/allowed_hosts/${H3}`);
      },
      [],
      ["fence:port-1", `revoke:${H3}`, `host:${H3}.removed`],
    ],
    [
      "a host allowed under a misleading link name",
      async () => {
        await sim.unlink(`${SUB}/allowed_hosts/${H1}`);
        await sim.symlink(`${NVMET}/hosts/${H1}`, `${SUB}/allowed_hosts/alias`);
      },
      [],
      ["fence:port-1", "revoke:alias", `allow:${H1}`],
    ],
    ["a host directory nobody links", () => sim.mkdir(`${NVMET}/hosts/${H3}`), [], [`host:${H3}.removed`]],
    [
      "everything removed",
      () => target.removeExport(NQN),
      ["subsystem", "namespace", "port", "port-link"],
      [`host:${H2}`, `allow:${H2}`, `host:${H1}`, `allow:${H1}`],
    ],
  ];

  test.each(cases)("%s", async (_name, damage, ensureReport, hostsReport) => {
    await damage();
    expect(await snapshot()).not.toEqual(clean);
    expect(await target.ensureExport(spec)).toEqual(ensureReport);
    expect(await target.reconcileHosts(NQN, [H1, H2])).toEqual(hostsReport);
    expect(await snapshot()).toEqual(clean);
    expect(await target.ensureExport(spec)).toEqual([]);
    expect(await target.reconcileHosts(NQN, [H1, H2])).toEqual([]);
  });

  test("a wrong device_path is changed as disable, write, enable", async () => {
    await sim.writeFile(`${NS}/enable`, "0");
    await sim.writeFile(`${NS}/device_path`, "/dev/nvme0n1p3");
    await sim.writeFile(`${NS}/enable`, "1");
    const mark = sim.journal.length;
    await target.ensureExport(spec);
    expect(sim.journal.slice(mark)).toEqual([
      `write subsystems/${NQN}/namespaces/1/enable "0"`,
      `write subsystems/${NQN}/namespaces/1/device_path "/dev/nvme0n1p2"`,
      `write subsystems/${NQN}/namespaces/1/enable "1"`,
    ]);
  });

  test("inspectExport shows each missing component", async () => {
    await sim.writeFile(`${NS}/enable`, "0");
    await sim.unlink(`${PORT1}/subsystems/${NQN}`);
    await sim.unlink(`${SUB}/allowed_hosts/${H2}`);
    expect(await target.inspectExport(NQN)).toEqual({ nqn: NQN, listeners: [], hosts: [H1] });
  });

  test("a device that is not there yet is unavailable, and the listener waits for it", async () => {
    await rm(join(root, "dev/nvme0n1p2"));
    await sim.writeFile(`${NS}/enable`, "0");
    await sim.unlink(`${PORT1}/subsystems/${NQN}`);
    const err = await target.ensureExport(spec).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("unavailable");
    expect((err as StorageError).message).toContain("/dev/nvme0n1p2");
    expect(await sim.readdir(`${PORT1}/subsystems`)).toEqual([]);
    await writeFile(join(root, "dev/nvme0n1p2"), "");
    expect(await target.ensureExport(spec)).toEqual(["namespace.enable", "port-link"]);
  });
});

describe("removal", () => {
  test("removeExport leaves no subsystem, port, host or link behind, and repeats harmlessly", async () => {
    const pristine = await snapshot();
    await target.ensureExport(spec);
    await target.setHosts(NQN, [H1, H2]);
    const mark = sim.journal.length;
    await target.removeExport(NQN);
    expect(sim.journal.slice(mark)).toEqual([
      `unlink subsystems/${NQN}/allowed_hosts/${H2}`,
      `unlink subsystems/${NQN}/allowed_hosts/${H1}`,
      `unlink ports/1/subsystems/${NQN}`,
      "rmdir ports/1",
      `write subsystems/${NQN}/namespaces/1/enable "0"`,
      `rmdir subsystems/${NQN}/namespaces/1`,
      `rmdir subsystems/${NQN}`,
      `rmdir hosts/${H2}`,
      `rmdir hosts/${H1}`,
    ]);
    expect(await snapshot()).toEqual(pristine);
    await target.removeExport(NQN);
    expect(await target.inspectExport(NQN)).toBeUndefined();
    expect(await snapshot()).toEqual(pristine);
  });

  test("a half-built export is removed too", async () => {
    await sim.mkdir(SUB);
    await sim.mkdir(NS);
    await sim.writeFile(`${NS}/device_path`, "/dev/nvme0n1p2");
    await sim.mkdir(PORT1);
    await target.removeExport(NQN);
    expect(await sim.readdir(`${NVMET}/subsystems`)).toEqual([]);
    // An empty port (a crash between mkdir and the first link) listens to nothing: collected too.
    expect(await sim.readdir(`${NVMET}/ports`)).toEqual([]);
  });

  test("removing an export that never existed is done", async () => {
    await target.removeExport(NQN);
    expect(sim.journal).toEqual([]);
  });
});

describe("shared ports", () => {
  test("two exports on one listener share port 1; another service port gets port 2", async () => {
    expect(await target.ensureExport(spec)).toEqual(["subsystem", "namespace", "port", "port-link"]);
    expect(await target.ensureExport(specB)).toEqual(["subsystem", "namespace", "port-link"]);
    expect((await sim.readdir(`${PORT1}/subsystems`)).sort()).toEqual([NQN, NQN_B].sort());
    const third = { ...specB, nqn: `${NQN_B}-2`, port: 4421 };
    expect(await target.ensureExport(third)).toEqual(["subsystem", "namespace", "port", "port-link"]);
    expect(await sim.readdir(`${NVMET}/ports/2/subsystems`)).toEqual([third.nqn]);
    expect((await target.inspectExport(NQN_B))?.listeners).toEqual([
      { transport: "rdma", address: "192.168.100.7", port: 4420 },
    ]);
    await target.removeExport(NQN);
    expect(await sim.readdir(`${PORT1}/subsystems`)).toEqual([NQN_B]);
    await target.removeExport(NQN_B);
    expect(await sim.exists(PORT1)).toBe(false);
    expect(await sim.readdir(`${NVMET}/ports`)).toEqual(["2"]);
  });

  test("moving an export to another portal links the new port first, then drops the old one", async () => {
    await target.ensureExport(spec);
    await target.ensureExport(specB);
    const mark = sim.journal.length;
    expect(await target.ensureExport({ ...spec, address: "192.168.100.9" })).toEqual([
      "port",
      "port-link",
      "port-link:1.removed",
    ]);
    expect(sim.journal.slice(mark).filter((l) => !l.startsWith("write"))).toEqual([
      "mkdir ports/2",
      `symlink ports/2/subsystems/${NQN} -> subsystems/${NQN}`,
      `unlink ports/1/subsystems/${NQN}`,
    ]);
    // Port 1 still serves the other export.
    expect(await sim.readdir(`${PORT1}/subsystems`)).toEqual([NQN_B]);
  });
});

describe("crash at any point", () => {
  type Mode = "before" | "after";

  /** A HostFs that fails the n-th mutation, either before it happens or after it took effect. */
  function crashing(inner: HostFs, n: number, mode: Mode): HostFs {
    let count = 0;
    const wrap =
      <A extends unknown[]>(fn: (...a: A) => Promise<void>) =>
      async (...a: A) => {
        count++;
        if (count === n && mode === "before")
          throw Object.assign(new Error("EIO: injected"), { code: "EIO" });
        await fn(...a);
        if (count === n) throw Object.assign(new Error("EIO: injected after"), { code: "EIO" });
      };
    return {
      ...inner,
      root: inner.root,
      readFile: (p) => inner.readFile(p),
      readdir: (p) => inner.readdir(p),
      readlink: (p) => inner.readlink(p),
      exists: (p) => inner.exists(p),
      isDirectory: (p) => inner.isDirectory(p),
      writeFile: wrap((p: string, d: string) => inner.writeFile(p, d)),
      mkdir: wrap((p: string) => inner.mkdir(p)),
      rmdir: wrap((p: string) => inner.rmdir(p)),
      unlink: wrap((p: string) => inner.unlink(p)),
      symlink: wrap((t: string, p: string) => inner.symlink(t, p)),
    };
  }

  /** Runs `check` for every mutation index in both modes; independent trees, so all at once. */
  const forEachStep = (steps: number, check: (mode: Mode, n: number) => Promise<void>) =>
    Promise.all(
      (["before", "after"] as Mode[]).flatMap((mode) =>
        Array.from({ length: steps }, (_, i) => check(mode, i + 1)),
      ),
    );

  const provision = async (t: KernelTarget) => {
    await t.ensureExport(spec);
    await t.ensureExport(specB);
    await t.setHosts(NQN, [H1, H2]);
    await t.setHosts(NQN_B, [H2]);
  };

  test("after a failure at any write, a restarted target converges to the same export", async () => {
    await provision(target);
    const want = await snapshot();
    const steps = sim.journal.length;
    expect(steps).toBeGreaterThan(20);
    await forEachStep(steps, async (mode, n) => {
      const run = await freshRoot();
      try {
        const broken = new KernelTarget({ fs: crashing(run.sim, n, mode), exec: okExec });
        const err = await provision(broken).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(StorageError);
        await provision(new KernelTarget({ fs: run.sim, exec: okExec }));
        expect({ mode, n, tree: await snapshot(run.root) }).toEqual({ mode, n, tree: want });
      } finally {
        await rm(run.root, { recursive: true, force: true });
      }
    });
  });

  test("after a failure at any step of removal, removing again leaves nothing", async () => {
    const pristine = await snapshot();
    await provision(target);
    const mark = sim.journal.length;
    await target.removeExport(NQN);
    await target.removeExport(NQN_B);
    const steps = sim.journal.length - mark;
    await forEachStep(steps, async (mode, n) => {
      const run = await freshRoot();
      try {
        await provision(new KernelTarget({ fs: run.sim, exec: okExec }));
        const broken = new KernelTarget({ fs: crashing(run.sim, n, mode), exec: okExec });
        const err = await (async () => {
          await broken.removeExport(NQN);
          await broken.removeExport(NQN_B);
        })().catch((e: unknown) => e);
        expect(err).toBeInstanceOf(StorageError);
        const again = new KernelTarget({ fs: run.sim, exec: okExec });
        await again.removeExport(NQN);
        await again.removeExport(NQN_B);
        expect({ mode, n, tree: await snapshot(run.root) }).toEqual({ mode, n, tree: pristine });
      } finally {
        await rm(run.root, { recursive: true, force: true });
      }
    });
  });
});

test("concurrent calls are serialised: the writes match running them one after another", async () => {
  await Promise.all([
    target.ensureExport(spec),
    target.ensureExport(specB),
    target.setHosts(NQN, [H1]),
    target.setHosts(NQN_B, [H1, H2]),
  ]);
  const concurrent = [...sim.journal];
  const seq = await freshRoot();
  try {
    const t = new KernelTarget({ fs: seq.sim, exec: okExec });
    await t.ensureExport(spec);
    await t.ensureExport(specB);
    await t.setHosts(NQN, [H1]);
    await t.setHosts(NQN_B, [H1, H2]);
    expect(concurrent).toEqual([...seq.sim.journal]);
  } finally {
    await rm(seq.root, { recursive: true, force: true });
  }
});

describe("prepareDevice", () => {
  const drive: DeviceRef = { name: "node-a-s1234", serial: "S1234", pciAddress: "0000:3b:00.0" };

  async function controller(name: string, files: Record<string, string>, namespaces: string[]) {
    const dir = join(root, "sys/class/nvme", name);
    await mkdir(dir, { recursive: true });
    for (const [f, v] of Object.entries(files)) await writeFile(join(dir, f), `${v}\n`);
    for (const ns of namespaces) await mkdir(join(dir, ns));
  }

  test("finds namespace 1 of the PCIe controller with the serial and loads the modules", async () => {
    const calls: string[] = [];
    const t = new KernelTarget({
      fs: sim,
      exec: {
        run: async (argv) => {
          calls.push(argv.join(" "));
          return { code: 0, stdout: "", stderr: "" };
        },
      },
      transports: ["rdma", "tcp"],
    });
    // A fabrics controller with the same serial must not be taken for the local drive.
    await controller("nvme0", { transport: "tcp", serial: "S1234" }, ["nvme0n1"]);
    await controller("nvme1", { transport: "pcie", serial: "S1234   ", address: "0000:3b:00.0" }, [
      "nvme1c1n1",
    ]);
    await writeFile(join(root, "dev/nvme1n1"), "");
    expect(await t.prepareDevice(drive)).toEqual({ ...drive, blockDevice: "/dev/nvme1n1" });
    expect(calls).toEqual(["modprobe nvmet", "modprobe nvmet-rdma", "modprobe nvmet-tcp"]);
  });

  test("a drive the kernel does not own is a precondition failure", async () => {
    await controller("nvme0", { transport: "pcie", serial: "OTHER" }, ["nvme0n1"]);
    const err = await target.prepareDevice(drive).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("precondition");
    expect((err as StorageError).message).toContain("not owned by the kernel");
  });

  test("a controller without namespace 1 is a precondition failure; a missing node is unavailable", async () => {
    await controller("nvme0", { transport: "pcie", serial: "S1234" }, ["nvme0n2"]);
    expect(((await target.prepareDevice(drive).catch((e: unknown) => e)) as StorageError).kind).toBe(
      "precondition",
    );
    await mkdir(join(root, "sys/class/nvme/nvme0/nvme0n1"));
    expect(((await target.prepareDevice(drive).catch((e: unknown) => e)) as StorageError).kind).toBe(
      "unavailable",
    );
  });

  test("a failing modprobe is unavailable", async () => {
    await controller("nvme0", { transport: "pcie", serial: "S1234" }, ["nvme0n1"]);
    await writeFile(join(root, "dev/nvme0n1"), "");
    const t = new KernelTarget({
      fs: sim,
      exec: {
        run: async () => ({ code: 1, stdout: "", stderr: "modprobe: FATAL: Module nvmet not found." }),
      },
    });
    const err = await t.prepareDevice(drive).catch((e: unknown) => e);
    expect((err as StorageError).kind).toBe("unavailable");
    expect((err as StorageError).message).toContain("Module nvmet not found");
  });
});
