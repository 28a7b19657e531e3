// nvme-cli adapter: exact argv for connect/disconnect/list-subsys, list-subsys JSON parsing from a
// realistic fixture, idempotent connect/disconnect, and the sysfs NQN -> namespace device lookup.

import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../../lib/errors.ts";
import { type HostFs, hostFs } from "../../lib/fs.ts";
import { dirKeyFiles } from "../../lib/key-files.ts";
import { silentLogger } from "../../lib/log.ts";
import { generateDhchapSecret } from "../../lib/nvme/dhchap.ts";
import { generateInterchangePsk } from "../../lib/nvme/tls-psk.ts";
import { parseControllerAddress, parseListSubsys } from "./list-subsys.ts";
import {
  connectArgv,
  connectConfig,
  disconnectArgv,
  keyedConnectArgv,
  LIST_SUBSYS_ARGV,
  NvmeCli,
} from "./nvme-cli.ts";
import type { ConnectParams } from "./nvme-initiator.ts";
import { namespaceIdDigits } from "./nvme-initiator.ts";
import { ScriptedExec } from "./scripted-exec.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:3e346d37-5cac-4331-8588-c5cb4db2526c";
const NQN = "nqn.2026-01.io.distort:vol-3f2a9c1e";
const FIXTURE = readFileSync(join(import.meta.dir, "testdata", "list-subsys.json"), "utf8");

const base: ConnectParams = {
  transport: "tcp",
  address: "192.168.100.7",
  port: 4420,
  nqn: NQN,
  hostNqn: HOST,
};
const head = ["nvme", "connect"];

describe("connect argv", () => {
  test.each<[string, ConnectParams, string[]]>([
    [
      "TCP, IPv4, no reconnect settings",
      base,
      [...head, "-t", "tcp", "-a", "192.168.100.7", "-s", "4420", "-n", NQN, "-q", HOST],
    ],
    [
      "RDMA, IPv4, all reconnect settings",
      { ...base, transport: "rdma", ctrlLossTmo: 600, reconnectDelay: 10, fastIoFailTmo: 5 },
      [
        ...head,
        "-t",
        "rdma",
        "-a",
        "192.168.100.7",
        "-s",
        "4420",
        "-n",
        NQN,
        "-q",
        HOST,
        "--ctrl-loss-tmo",
        "600",
        "--reconnect-delay",
        "10",
        "--fast_io_fail_tmo",
        "5",
      ],
    ],
    [
      "TCP, IPv6 literal as-is, reconnect forever",
      { ...base, address: "fd00:100::7", port: 4421, ctrlLossTmo: -1 },
      [
        ...head,
        "-t",
        "tcp",
        "-a",
        "fd00:100::7",
        "-s",
        "4421",
        "-n",
        NQN,
        "-q",
        HOST,
        "--ctrl-loss-tmo",
        "-1",
      ],
    ],
    [
      "RDMA, IPv6, reconnect delay only",
      { ...base, transport: "rdma", address: "fe80::1:2", reconnectDelay: 2 },
      [
        ...head,
        "-t",
        "rdma",
        "-a",
        "fe80::1:2",
        "-s",
        "4420",
        "-n",
        NQN,
        "-q",
        HOST,
        "--reconnect-delay",
        "2",
      ],
    ],
    [
      "fast I/O fail off",
      { ...base, fastIoFailTmo: -1 },
      [
        ...head,
        "-t",
        "tcp",
        "-a",
        "192.168.100.7",
        "-s",
        "4420",
        "-n",
        NQN,
        "-q",
        HOST,
        "--fast_io_fail_tmo",
        "-1",
      ],
    ],
  ])("%s", (_name, params, want) => {
    expect(connectArgv(params)).toEqual(want);
  });

  test("a keyed connect's config.json port carries every reconnect setting under libnvme's key, as a number", () => {
    const dhchap = { secret: "DHHC-1:00:placeholder:" };
    const p: ConnectParams = { ...base, ctrlLossTmo: -1, reconnectDelay: 10, fastIoFailTmo: 5, dhchap };
    const [host] = JSON.parse(connectConfig(p));
    expect(host.subsystems[0].ports).toEqual([
      {
        transport: "tcp",
        traddr: "192.168.100.7",
        trsvcid: "4420",
        ctrl_loss_tmo: -1,
        reconnect_delay: 10,
        fast_io_fail_tmo: 5,
        dhchap_key: dhchap.secret,
      },
    ]);
  });

  test("disconnect and list-subsys", () => {
    expect(disconnectArgv(NQN)).toEqual(["nvme", "disconnect", "-n", NQN]);
    expect([...LIST_SUBSYS_ARGV]).toEqual(["nvme", "list-subsys", "-o", "json"]);
  });
});

describe("list-subsys JSON", () => {
  test("fixture: every (host, subsystem) with its paths, addresses split", () => {
    const subs = parseListSubsys(FIXTURE);
    expect(subs.map((s) => [s.name, s.nqn, s.hostNqn, s.paths.length])).toEqual([
      [
        "nvme-subsys0",
        "nqn.2014.08.org.nvmexpress:144d144dS6EUNX0T123456      SAMSUNG MZQL23T8HCLS-00A07",
        HOST,
        1,
      ],
      ["nvme-subsys1", NQN, HOST, 1],
      ["nvme-subsys2", "nqn.2026-01.io.distort:vol-77b0d4aa", HOST, 2],
      ["nvme-subsys3", "nqn.2026-01.io.distort:vol-0c55e6f1", HOST, 1],
      ["nvme-subsys5", "nqn.2026-01.io.distort:vol-9a1b2c3d", "nqn.2026-01.io.distort:host:worker-b", 1],
    ]);
    expect(subs[0]?.paths[0]).toEqual({
      name: "nvme0",
      transport: "pcie",
      traddr: undefined,
      trsvcid: undefined,
      state: "live",
    });
    expect(subs[1]?.paths[0]).toEqual({
      name: "nvme1",
      transport: "tcp",
      traddr: "192.168.100.7",
      trsvcid: "4420",
      state: "live",
    });
    expect(subs[2]?.paths.map((p) => [p.name, p.traddr, p.state])).toEqual([
      ["nvme2", "192.168.100.8", "connecting"],
      ["nvme4", "192.168.101.8", "live"],
    ]);
    expect(subs[3]?.paths[0]?.traddr).toBe("fd00:100::7");
    expect(subs[3]?.paths[0]?.trsvcid).toBe("4421");
  });

  test.each<[string, string, number]>([
    ["empty output", "", 0],
    ["no hosts", "[]", 0],
    ["single host object", JSON.stringify({ HostNQN: HOST, Subsystems: [] }), 0],
    [
      "subsystem without paths is skipped",
      JSON.stringify([{ HostNQN: HOST, Subsystems: [{ Name: "s", NQN }] }]),
      0,
    ],
  ])("%s", (_name, text, n) => {
    expect(parseListSubsys(text)).toHaveLength(n);
  });

  test.each([
    ["not JSON", "Failed to scan topology: No such file or directory"],
    ["wrong shape", JSON.stringify({ Subsystems: "x" })],
    [
      "path without state",
      JSON.stringify([
        { HostNQN: HOST, Subsystems: [{ Name: "s", NQN, Paths: [{ Name: "nvme1", Transport: "tcp" }] }] },
      ]),
    ],
  ])("rejects %s", (_name, text) => {
    expect(() => parseListSubsys(text)).toThrow(StorageError);
  });

  test("space-separated addresses of older kernels", () => {
    expect(parseControllerAddress("traddr=10.0.0.1 trsvcid=4420 host_traddr=10.0.0.2")).toEqual({
      traddr: "10.0.0.1",
      trsvcid: "4420",
    });
  });
});

const listing = (paths: { addr: string; state?: string }[], nqn = NQN) =>
  JSON.stringify([
    {
      HostNQN: HOST,
      Subsystems: [
        {
          Name: "nvme-subsys1",
          NQN: nqn,
          Paths: paths.map((p, i) => ({
            Name: `nvme${i + 1}`,
            Transport: "tcp",
            Address: p.addr,
            State: p.state ?? "live",
          })),
        },
      ],
    },
  ]);

describe("NvmeCli", () => {
  let root: string;
  let fs: HostFs;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), "nvme-cli-test-"));
    fs = hostFs(root);
    // Multipath on: nvme-subsys1 holds head disk nvme1n1 and controllers nvme1 and nvme4.
    // Multipath off: nvme-subsys2's disks hang off controller nvme2 (nvme2n1, nvme2n2).
    const dirs = [
      "/sys/class/nvme/nvme1",
      "/sys/class/nvme/nvme4",
      "/sys/class/nvme/nvme2/nvme2n1",
      "/sys/class/nvme/nvme2/nvme2n2",
      "/sys/class/nvme/nvme2/nvme2c2n1",
      "/sys/class/nvme-subsystem/nvme-subsys1/nvme1n1",
      "/sys/class/nvme-subsystem/nvme-subsys2",
      "/sys/class/nvme-subsystem/nvme-subsys9",
      "/sys/block/nvme1n1",
      "/sys/block/nvme2n1",
      "/sys/block/nvme2n2",
    ];
    const { mkdir } = await import("node:fs/promises");
    for (const d of dirs) await mkdir(join(root, d), { recursive: true });
    await fs.writeFile("/sys/class/nvme-subsystem/nvme-subsys1/subsysnqn", `${NQN}\n`);
    await fs.writeFile(
      "/sys/class/nvme-subsystem/nvme-subsys2/subsysnqn",
      "nqn.2026-01.io.distort:vol-two\n",
    );
    await fs.writeFile("/sys/class/nvme-subsystem/nvme-subsys9/subsysnqn", "nqn.2026-01.io.distort:empty\n");
    await fs.symlink("/sys/class/nvme/nvme1", "/sys/class/nvme-subsystem/nvme-subsys1/nvme1");
    await fs.symlink("/sys/class/nvme/nvme4", "/sys/class/nvme-subsystem/nvme-subsys1/nvme4");
    await fs.symlink("/sys/class/nvme/nvme2", "/sys/class/nvme-subsystem/nvme-subsys2/nvme2");
    await fs.writeFile("/sys/block/nvme1n1/uuid", "7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12\n");
    await fs.writeFile("/sys/block/nvme2n1/uuid", "11111111-2222-3333-4444-555555555555\n");
    // A namespace without a UUID: the kernel prints its NGUID formatted like one.
    await fs.writeFile("/sys/block/nvme2n2/nguid", "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90\n");
  });
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  const cli = (exec: ScriptedExec) => new NvmeCli({ exec, fs, logger: silentLogger });

  test("connect runs nvme connect under the connect timeout", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: "[]" });
    await new NvmeCli({ exec, fs, logger: silentLogger, connectTimeoutMs: 1234 }).connect(base);
    const c = exec.calls.find((x) => x.argv[1] === "connect");
    expect(c?.argv).toEqual(connectArgv(base));
    expect(c?.opts?.timeoutMs).toBe(1234);
    expect(exec.calls.every((x) => typeof x.opts?.timeoutMs === "number")).toBe(true);
  });

  test("a keyed connect hands the secrets over in a 0600 config file, never in argv, and removes it", async () => {
    const keyDir = mkdtempSync(join(tmpdir(), "nvme-keys-"));
    try {
      const dhchap = {
        secret: generateDhchapSecret({ hash: 1 }),
        ctrlSecret: generateDhchapSecret({ hash: 2 }),
      };
      const p: ConnectParams = { ...base, ctrlLossTmo: 60, dhchap };
      let seen: { path: string; mode: number; text: string } | undefined;
      const exec = new ScriptedExec()
        .on(["nvme", "list-subsys"], { stdout: "[]" })
        .on(["nvme", "connect"], (argv) => {
          const path = argv[argv.indexOf("-J") + 1] as string;
          seen = { path, mode: statSync(path).mode & 0o777, text: readFileSync(path, "utf8") };
          return { code: 0 };
        });
      await new NvmeCli({ exec, fs, logger: silentLogger, secretFiles: dirKeyFiles(keyDir) }).connect(p);
      const c = exec.calls.find((x) => x.argv[1] === "connect");
      expect(c?.argv).toEqual(keyedConnectArgv(seen?.path as string, HOST));
      expect(JSON.stringify(exec.calls)).not.toContain(dhchap.secret);
      expect(JSON.stringify(exec.calls)).not.toContain(dhchap.ctrlSecret);
      expect(seen?.mode).toBe(0o600);
      expect(seen?.text).toBe(connectConfig(p));
      // libnvme's schema: host entry, subsystem, port with both secrets and the reconnect setting.
      expect(JSON.parse(seen?.text as string)).toEqual([
        {
          hostnqn: HOST,
          subsystems: [
            {
              nqn: NQN,
              ports: [
                {
                  transport: "tcp",
                  traddr: "192.168.100.7",
                  trsvcid: "4420",
                  ctrl_loss_tmo: 60,
                  dhchap_key: dhchap.secret,
                  dhchap_ctrl_key: dhchap.ctrlSecret,
                },
              ],
            },
          ],
        },
      ]);
      expect(readdirSync(keyDir)).toEqual([]);
    } finally {
      rmSync(keyDir, { recursive: true, force: true });
    }
  });

  test("a TLS connect: --tls on argv, the PSK only in the 0600 config's port (libnvme tls, tls_key)", async () => {
    const keyDir = mkdtempSync(join(tmpdir(), "nvme-keys-"));
    try {
      const psk = generateInterchangePsk();
      const p: ConnectParams = { ...base, tls: { psk } };
      let seen: { path: string; mode: number; text: string } | undefined;
      const exec = new ScriptedExec()
        .on(["nvme", "list-subsys"], { stdout: "[]" })
        .on(["nvme", "connect"], (argv) => {
          const path = argv[argv.indexOf("-J") + 1] as string;
          seen = { path, mode: statSync(path).mode & 0o777, text: readFileSync(path, "utf8") };
          return { code: 0 };
        });
      await new NvmeCli({ exec, fs, logger: silentLogger, secretFiles: dirKeyFiles(keyDir) }).connect(p);
      const c = exec.calls.find((x) => x.argv[1] === "connect");
      expect(c?.argv).toEqual(["nvme", "connect", "-J", seen?.path as string, "-q", HOST, "--tls"]);
      expect(JSON.stringify(exec.calls)).not.toContain(psk);
      expect(seen?.mode).toBe(0o600);
      expect(JSON.parse(seen?.text as string)[0].subsystems[0].ports).toEqual([
        { transport: "tcp", traddr: "192.168.100.7", trsvcid: "4420", tls: true, tls_key: psk },
      ]);
      expect(readdirSync(keyDir)).toEqual([]);
    } finally {
      rmSync(keyDir, { recursive: true, force: true });
    }
  });

  test("a keyed connect without a key directory is refused before nvme-cli runs", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: "[]" });
    const err = await cli(exec)
      .connect({ ...base, dhchap: { secret: generateDhchapSecret() } })
      .catch((e) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("precondition");
    expect(exec.argvOf("nvme").map((a) => a[1])).toEqual(["list-subsys"]);
  });

  test("connect is a no-op when a controller at that address exists", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], {
      stdout: listing([{ addr: "traddr=192.168.100.7,trsvcid=4420" }]),
    });
    await cli(exec).connect(base);
    expect(exec.argvOf("nvme").map((a) => a[1])).toEqual(["list-subsys"]);
  });

  test("connect to another portal of the same subsystem still connects", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], {
      stdout: listing([{ addr: "traddr=192.168.100.8,trsvcid=4420" }]),
    });
    await cli(exec).connect(base);
    expect(exec.argvOf("nvme").map((a) => a[1])).toEqual(["list-subsys", "connect"]);
  });

  test("'already connected' from a racing connect counts as success", async () => {
    let connected = false;
    const exec = new ScriptedExec()
      .on(["nvme", "list-subsys"], () => ({
        stdout: connected ? listing([{ addr: "traddr=192.168.100.7,trsvcid=4420" }]) : "[]",
      }))
      .on(["nvme", "connect"], () => {
        connected = true;
        return { code: 114, stderr: "already connected" };
      });
    await cli(exec).connect(base);
  });

  test("a refused connect is UNAVAILABLE with nvme-cli's message", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: "[]" }).on(["nvme", "connect"], {
      code: 1,
      stderr: "Failed to write to /dev/nvme-fabrics: Input/output error",
    });
    const err = await cli(exec)
      .connect(base)
      .catch((e) => e);
    expect(err).toBeInstanceOf(StorageError);
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("Input/output error");
  });

  test("disconnect does nothing when the subsystem is not connected", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: "[]" });
    await cli(exec).disconnect(NQN);
    expect(exec.argvOf("nvme").map((a) => a[1])).toEqual(["list-subsys"]);
  });

  test("disconnect runs nvme disconnect -n and verifies it is gone", async () => {
    let gone = false;
    const exec = new ScriptedExec()
      .on(["nvme", "list-subsys"], () => ({
        stdout: gone ? "[]" : listing([{ addr: "traddr=1.2.3.4,trsvcid=4420" }]),
      }))
      .on(["nvme", "disconnect"], () => {
        gone = true;
        return { stdout: `NQN:${NQN} disconnected 1 controller(s)\n` };
      });
    await cli(exec).disconnect(NQN);
    expect(exec.argvOf("nvme")).toContainEqual(["nvme", "disconnect", "-n", NQN]);
  });

  test("a failing disconnect fails, and so does a controller that survives it", async () => {
    const listed = listing([{ addr: "traddr=1.2.3.4,trsvcid=4420" }]);
    const failing = new ScriptedExec()
      .on(["nvme", "list-subsys"], { stdout: listed })
      .on(["nvme", "disconnect"], { code: 1, stderr: "Failed to disconnect by NQN" });
    expect(
      (
        await cli(failing)
          .disconnect(NQN)
          .catch((e) => e)
      ).kind,
    ).toBe("internal");
    const surviving = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: listed });
    expect(
      (
        await cli(surviving)
          .disconnect(NQN)
          .catch((e) => e)
      ).kind,
    ).toBe("unavailable");
  });

  test("list without nvme modules is empty; a failing list with them is an error", async () => {
    const failing = new ScriptedExec().on(["nvme", "list-subsys"], {
      code: 1,
      stderr: "Failed to scan topology",
    });
    const empty = hostFs(join(root, "nothing-here"));
    expect(await new NvmeCli({ exec: failing, fs: empty, logger: silentLogger }).list()).toEqual([]);
    expect(
      (
        await cli(failing)
          .list()
          .catch((e) => e)
      ).kind,
    ).toBe("internal");
  });

  test("list parses the fixture", async () => {
    const exec = new ScriptedExec().on(["nvme", "list-subsys"], { stdout: FIXTURE });
    expect((await cli(exec).list()).map((s) => s.nqn)).toContain(NQN);
  });

  describe("namespace device lookup in sysfs", () => {
    const exec = new ScriptedExec();
    test.each<[string, string, string | undefined, string | undefined]>([
      ["multipath head, by UUID", NQN, "7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12", "/dev/nvme1n1"],
      ["UUID in another case and without dashes", NQN, "7F0E2A441B6C4D2E9A510C3B8D9E6F12", "/dev/nvme1n1"],
      ["multipath head, only namespace, no id", NQN, undefined, "/dev/nvme1n1"],
      [
        "no multipath, by UUID",
        "nqn.2026-01.io.distort:vol-two",
        "11111111-2222-3333-4444-555555555555",
        "/dev/nvme2n1",
      ],
      [
        "no multipath, by NGUID",
        "nqn.2026-01.io.distort:vol-two",
        "A1B2C3D4E5F60718293A4B5C6D7E8F90",
        "/dev/nvme2n2",
      ],
      ["UUID of no namespace", NQN, "00000000-0000-0000-0000-000000000001", undefined],
      ["unknown subsystem", "nqn.2026-01.io.distort:nope", undefined, undefined],
      ["subsystem without namespaces yet", "nqn.2026-01.io.distort:empty", undefined, undefined],
    ])("%s", async (_name, nqn, id, want) => {
      expect(await cli(exec).findNamespaceDevice(nqn, id)).toBe(want);
    });

    test("several namespaces and no id: refuses to guess", async () => {
      const err = await cli(exec)
        .findNamespaceDevice("nqn.2026-01.io.distort:vol-two")
        .catch((e) => e);
      expect(err.kind).toBe("precondition");
    });

    test("an id that is not a UUID is invalid", async () => {
      expect(
        (
          await cli(exec)
            .findNamespaceDevice(NQN, "nvme1n1")
            .catch((e) => e)
        ).kind,
      ).toBe("invalid");
    });

    test("never runs a command", () => {
      expect(exec.calls).toEqual([]);
    });
  });

  test("rescan writes rescan_controller of every controller of the subsystem", async () => {
    await cli(new ScriptedExec()).rescan(NQN);
    expect(await fs.readFile("/sys/class/nvme/nvme1/rescan_controller")).toBe("1");
    expect(await fs.readFile("/sys/class/nvme/nvme4/rescan_controller")).toBe("1");
    expect(
      (
        await cli(new ScriptedExec())
          .rescan("nqn.2026-01.io.distort:nope")
          .catch((e) => e)
      ).kind,
    ).toBe("not-found");
  });
});

test.each<[string, string | undefined]>([
  ["7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12", "7f0e2a441b6c4d2e9a510c3b8d9e6f12"],
  ["A1B2C3D4E5F60718293A4B5C6D7E8F90", "a1b2c3d4e5f60718293a4b5c6d7e8f90"],
  ["nvme1n1", undefined],
  ["7f0e2a44-1b6c-4d2e-9a51", undefined],
])("namespaceIdDigits(%s)", (id, want) => {
  expect(namespaceIdDigits(id)).toBe(want);
});
