// The nvmf_tgt stand-in as a process: nvmf_tgt's flags, readiness by RPC round trip, the core
// mask in framework_get_reactors, and exit on SIGTERM or spdk_kill_instance.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs, UsageError } from "./nvmf-tgt.ts";
import { call, RawRpcConnection } from "./raw-rpc-client.ts";

let root: string;

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "distort-tgt-"));
});

afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

test("parses nvmf_tgt's flags, accepts and ignores the memory and tracing ones", () => {
  expect(
    parseArgs([
      "-m",
      "[0,2]",
      "--rpc-socket=/s.sock",
      "--wait-for-rpc",
      "--sim-data-dir",
      "/d",
      "-s",
      "1024",
      "--no-huge",
    ]),
  ).toEqual({
    coreMask: "[0,2]",
    socketPath: "/s.sock",
    waitForRpc: true,
    dataDir: "/d",
    drivesFile: undefined,
    fabricDir: undefined,
    hostNqn: undefined,
    transports: ["TCP", "RDMA"],
    ignored: ["-s 1024", "--no-huge"],
  });
  expect(parseArgs(["--help"])).toBe("help");
  expect(() => parseArgs(["-r", "/s.sock"])).toThrow(UsageError);
  expect(() => parseArgs(["--sim-data-dir", "/d", "--json", "cfg.json"])).toThrow(
    "unsupported option --json",
  );
  expect(() => parseArgs(["--sim-data-dir", "/d", "-m"])).toThrow("needs a value");
  const node = parseArgs(["--sim-data-dir=/d", "--sim-host-addresses=127.0.0.2,fd00::2"]);
  expect(node !== "help" && node.hostAddresses).toEqual(["127.0.0.2", "fd00::2"]);
  expect(() => parseArgs(["--sim-data-dir=/d", "--sim-host-addresses=node-2"])).toThrow(UsageError);
  // auto: this namespace's own addresses (loopback at least), the same list os reports.
  const auto = parseArgs(["--sim-data-dir=/d", "--sim-host-addresses=auto"]);
  const own = Object.values(networkInterfaces()).flatMap((l) =>
    (l ?? []).map((i) => i.address.replace(/%.*$/, "")),
  );
  expect(auto !== "help" && auto.hostAddresses).toEqual(own);
  expect(own).toContain("127.0.0.1");
  const polled = parseArgs(["--sim-data-dir=/d", "--sim-rpc-poll-ms=0"]);
  expect(polled !== "help" && polled.rpcPollMs).toBe(0);
  expect(() => parseArgs(["--sim-data-dir=/d", "--sim-rpc-poll-ms=4ms"])).toThrow("whole milliseconds");
  const tcp = parseArgs(["--sim-data-dir=/d", "--sim-fabric=tcp"]);
  expect(tcp !== "help" && tcp.tcpFabric).toBe(true);
  expect(() => parseArgs(["--sim-data-dir=/d", "--sim-fabric=udp"])).toThrow("--sim-fabric takes tcp");
  expect(() => parseArgs(["--sim-data-dir=/d", "--sim-fabric=tcp", "--sim-fabric-dir=/f"])).toThrow(
    "two fabrics",
  );
});

/** Spawns the CLI and waits until an RPC round trip works (the readiness test supervisors use). */
async function spawnTarget(name: string, extra: string[] = []) {
  const sock = join(root, `${name}.sock`);
  const drives = join(root, `${name}-drives.json`);
  writeFileSync(
    drives,
    JSON.stringify([{ pciAddress: "0000:3b:00.0", serial: "S1", model: "Sim", sizeBytes: 64 << 20 }]),
  );
  const proc = Bun.spawn(
    [
      process.execPath,
      join(import.meta.dir, "nvmf-tgt.ts"),
      "-m",
      "0x3",
      "-r",
      sock,
      "--sim-data-dir",
      join(root, name),
      "--sim-drives",
      drives,
      ...extra,
    ],
    { stdout: "ignore", stderr: "pipe" },
  );
  for (let i = 0; i < 300; i++) {
    const ok = await call(sock, "spdk_get_version").then(
      () => true,
      () => false,
    );
    if (ok) return { proc, sock };
    await Bun.sleep(10);
  }
  proc.kill("SIGKILL");
  throw new Error(`emulator did not come up: ${await new Response(proc.stderr).text()}`);
}

test("runs until SIGTERM, answering like nvmf_tgt meanwhile", async () => {
  const { proc, sock } = await spawnTarget("term", ["--no-huge", "-s", "1024"]);
  const r = (await call(sock, "framework_get_reactors")) as { pid: number; reactors: { lcore: number }[] };
  expect(r.pid).toBe(proc.pid);
  expect(r.reactors.map((x) => x.lcore)).toEqual([0, 1]);
  expect(
    await call(sock, "bdev_nvme_attach_controller", {
      name: "Nvme0",
      trtype: "PCIe",
      traddr: "0000:3b:00.0",
    }),
  ).toEqual(["Nvme0n1"]);
  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
  expect(existsSync(sock)).toBe(false);
});

test("exits after answering spdk_kill_instance", async () => {
  const { proc, sock } = await spawnTarget("kill");
  const c = await RawRpcConnection.connect(sock);
  c.send('{"jsonrpc":"2.0","method":"spdk_kill_instance","params":{"sig_name":"SIGTERM"},"id":1}');
  expect(await c.replies(1)).toEqual([{ jsonrpc: "2.0", id: 1, result: true }]);
  expect(await proc.exited).toBe(0);
});

test("--sim-spdk-version picks the release posed as; anything else is a usage error", () => {
  const base = ["--sim-data-dir", "/tmp/x"];
  expect(parseArgs([...base, "--sim-spdk-version", "25.05.1"])).toMatchObject({ spdkVersion: "25.05.1" });
  expect(parseArgs([...base, "--sim-spdk-version=v26.01"])).toMatchObject({ spdkVersion: "26.01" });
  expect(() => parseArgs([...base, "--sim-spdk-version", "24.09"])).toThrow(UsageError);
});
