// The SPDK control path: the same "lvol create + NVMe-oF export" sequences against one emulated
// nvmf_tgt process, issued by our persistent pipelined client, by a connect-per-call client (as
// NVIDIA's reference plugin does) and by SPDK's own rpc.py run as one process per call.
// Run: bun bench/spdk-client.bench.ts [sequences] [--socket PATH [--base-bdev NAME] [--pid PID]]
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createConnection } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { cacheRoot } from "../lab/cluster/tools.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { ALLOCATION_UNIT } from "../lib/units.ts";
import { pool } from "./proc-stats.ts";
import { type Figure, fmt, median, percentile, svgBarChart, writeResult } from "./report.ts";

/** The command line: `[sequences] [--socket PATH] [--base-bdev NAME] [--pid PID]`. */
export interface BenchArgs {
  sequences: number;
  /** An nvmf_tgt the operator started (real SPDK or not); absent: the bench starts the emulator. */
  socket?: string;
  /** With socket: an existing bdev to carve the lvstore from; absent: a Malloc bdev is created. */
  baseBdev?: string;
  /** With socket: the target's pid for its CPU share; absent: framework_get_reactors' pid. */
  pid?: number;
}

/** Parses the bench's arguments (without the program); throws Error on anything it cannot take. */
export function parseBenchArgs(argv: readonly string[]): BenchArgs {
  const out: BenchArgs = { sequences: 2000 };
  let positional = 0;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const value = () => {
      const v = argv[++i];
      if (v === undefined || v.startsWith("--")) throw new Error(`${a} needs a value`);
      return v;
    };
    if (a === "--socket") out.socket = value();
    else if (a === "--base-bdev") out.baseBdev = value();
    else if (a === "--pid") out.pid = Number(value());
    else if (!a.startsWith("--") && positional++ === 0) out.sequences = Number(a);
    else throw new Error(`unknown argument ${a}`);
  }
  if (!(Number.isInteger(out.sequences) && out.sequences > 0))
    throw new Error(`sequences must be a positive integer, got ${out.sequences}`);
  if (out.socket !== undefined && !out.socket.startsWith("/"))
    throw new Error("--socket takes an absolute path");
  if (out.pid !== undefined && !(Number.isInteger(out.pid) && out.pid > 0))
    throw new Error("--pid takes a process id");
  if (out.socket === undefined && (out.baseBdev !== undefined || out.pid !== undefined))
    throw new Error("--base-bdev and --pid only apply with --socket");
  return out;
}

const ARGS = import.meta.main ? parseBenchArgs(process.argv.slice(2)) : { sequences: 2000 };
const SEQUENCES = ARGS.sequences;
/** rpc.py costs a Python start per call, so it gets a smaller sample; rates stay comparable. */
const PY_SEQUENCES = Math.min(SEQUENCES, 100);
const IN_FLIGHT = 16;
/** Sequences per client before measuring (JIT, target code paths), not recorded. */
const WARM_UP = 200;
const ROUNDS = 3;
const RPCS_PER_SEQUENCE = 4;
/**
 * SPDK's Python client from PyPI. The newest there is 26.9, but its nvmf_create_subsystem always
 * sends `enable_nssr`, which v25.05.1 targets (and the emulator, which follows v25.05.1) reject
 * with -32602; 25.5.1 is the client released with the target version we run against.
 */
export const SPDK_PY_VERSION = "25.5.1";
const NEWEST_SPDK_PY = "26.9";
const CHART = join(import.meta.dir, "..", "docs", "spdk-client-comparison.svg");
/** Where a run against an external target draws its chart, so the emulator's stays. */
const CHART_EXTERNAL = join(import.meta.dir, "..", "docs", "spdk-client-comparison-external.svg");
const EMULATOR = join(import.meta.dir, "..", "lab", "sim", "spdk", "nvmf-tgt.ts");
const say = (s: string) => process.stdout.write(`${s}\n`);

/** An emulated nvmf_tgt running as its own process, like the real one. */
export interface TargetProcess {
  socketPath: string;
  pid: number;
  /** SIGKILL and wait; the RPC socket is left behind, as a crash leaves it. */
  kill(): Promise<void>;
  /** SIGTERM and wait for a clean exit. */
  stop(): Promise<void>;
}

/**
 * Spawns lab/sim/spdk/nvmf-tgt.ts on `socketPath` with one drive, and resolves once an RPC round
 * trip succeeds (readiness is an answer, never the socket file). Throws after 20 s. With
 * maxSubsystems it starts under --wait-for-rpc, raises the subsystem limit (SPDK's default holds
 * 1024, discovery included) and initialises the framework before resolving, as the agent does.
 */
export async function startTargetProcess(opts: {
  socketPath: string;
  dataDir: string;
  drive: { pciAddress: string; serial: string; sizeBytes: number };
  maxSubsystems?: number;
}): Promise<TargetProcess> {
  mkdirSync(opts.dataDir, { recursive: true });
  const drives = join(opts.dataDir, "drives.json");
  writeFileSync(drives, JSON.stringify([{ ...opts.drive, model: "DISTORT SIM NVMe" }]));
  const proc = Bun.spawn(
    [
      process.execPath,
      EMULATOR,
      "-r",
      opts.socketPath,
      "--sim-data-dir",
      opts.dataDir,
      "--sim-drives",
      drives,
      ...(opts.maxSubsystems !== undefined ? ["--wait-for-rpc"] : []),
    ],
    { stdin: "ignore", stdout: "ignore", stderr: "ignore" },
  );
  const probe = new SpdkClient({ socketPath: opts.socketPath, logger: silentLogger, callTimeoutMs: 1000 });
  const deadline = Date.now() + 20_000;
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`nvmf_tgt emulator exited with ${proc.exitCode}`);
      const ok = await probe.call("spdk_get_version").then(
        () => true,
        () => false,
      );
      if (ok) break;
      if (Date.now() > deadline) throw new Error("nvmf_tgt emulator did not answer within 20 s");
      await Bun.sleep(20);
    }
    if (opts.maxSubsystems !== undefined) {
      const m = new SpdkMethods(probe);
      await m.nvmfSetMaxSubsystems(opts.maxSubsystems);
      await m.frameworkStartInit();
      await m.frameworkWaitInit();
    }
  } finally {
    await probe.close();
  }
  return {
    socketPath: opts.socketPath,
    pid: proc.pid,
    async kill() {
      proc.kill("SIGKILL");
      await proc.exited;
    },
    async stop() {
      proc.kill("SIGTERM");
      await Promise.race([proc.exited, Bun.sleep(5000)]);
      proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}

/** The four mutations the agent issues to create and export one partition (agent/backends/spdk). */
interface SequenceOps {
  /** bdev_lvol_create; resolves with the lvol's UUID (its bdev name). */
  createLvol(lvs: string, name: string): Promise<string>;
  createSubsystem(nqn: string, serial: string): Promise<void>;
  addNamespace(nqn: string, bdev: string): Promise<void>;
  addListener(nqn: string): Promise<void>;
}

// The agent's exact params (agent/volumes/spdk-lvol/manager.ts, agent/backends/spdk/target.ts).
const lvolParams = (lvs: string, name: string) => ({
  lvol_name: name,
  size_in_mib: ALLOCATION_UNIT / 2 ** 20,
  lvs_name: lvs,
  thin_provision: false,
  clear_method: "unmap" as const,
});
const subsystemParams = (nqn: string, serial: string) => ({
  nqn,
  serial_number: serial,
  model_number: "DISTORT",
  allow_any_host: false as const,
  max_namespaces: 1,
});
const nsParams = (nqn: string, bdev: string) => ({ nqn, namespace: { bdev_name: bdev, nsid: 1 } });
const LISTEN = { trtype: "TCP", adrfam: "IPv4" as const, traddr: "127.0.0.1", trsvcid: "4420" };
const listenerParams = (nqn: string) => ({ nqn, listen_address: LISTEN });

/** (1) ours: lib/spdk typed wrappers over one persistent, pipelined connection. */
function oursOps(m: SpdkMethods): SequenceOps {
  return {
    createLvol: (lvs, name) => m.bdevLvolCreate(lvolParams(lvs, name)),
    createSubsystem: (nqn, serial) => m.nvmfCreateSubsystem(subsystemParams(nqn, serial)),
    addNamespace: async (nqn, bdev) => void (await m.nvmfSubsystemAddNs(nsParams(nqn, bdev))),
    addListener: (nqn) => m.nvmfSubsystemAddListener(listenerParams(nqn)),
  };
}

/**
 * (2) connect per call, as NVIDIA's DPF plugin talks to SNAP: dial, write one request and a
 * newline, read one newline-terminated reply, close. Same request bytes as ours.
 */
let cpcId = 0;
function callPerConnection(socketPath: string, method: string, params: object): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const id = ++cpcId;
    const sock = createConnection(socketPath);
    let buf = "";
    sock.setEncoding("utf8");
    sock.once("connect", () => sock.write(`${JSON.stringify({ jsonrpc: "2.0", method, id, params })}\n`));
    sock.on("data", (chunk: string) => {
      buf += chunk;
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      sock.destroy();
      const reply = JSON.parse(buf.slice(0, nl)) as {
        id: number;
        result?: unknown;
        error?: { message: string };
      };
      if (reply.id !== id) reject(new Error(`${method}: reply for id ${reply.id}, sent ${id}`));
      else if (reply.error) reject(new Error(`${method}: ${reply.error.message}`));
      else resolve(reply.result);
    });
    sock.once("error", reject);
    sock.once("close", () => reject(new Error(`${method}: connection closed without a reply`)));
  });
}

function connectPerCallOps(socketPath: string): SequenceOps {
  return {
    createLvol: async (lvs, name) =>
      (await callPerConnection(socketPath, "bdev_lvol_create", lvolParams(lvs, name))) as string,
    createSubsystem: async (nqn, serial) =>
      void (await callPerConnection(socketPath, "nvmf_create_subsystem", subsystemParams(nqn, serial))),
    addNamespace: async (nqn, bdev) =>
      void (await callPerConnection(socketPath, "nvmf_subsystem_add_ns", nsParams(nqn, bdev))),
    addListener: async (nqn) =>
      void (await callPerConnection(socketPath, "nvmf_subsystem_add_listener", listenerParams(nqn))),
  };
}

/**
 * (3) a process per call: `python <spdk-rpc> -s <socket> <method> <args>`, as scripts and some
 * plugins drive SPDK. The CLI spells the same values; it adds a few defaults of its own
 * (no_auto_visible, secure_channel: false) and leaves out allow_any_host (false by default).
 */
function processPerCallOps(python: string, rpcEntry: string, socketPath: string): SequenceOps {
  const run = async (args: string[]): Promise<string> => {
    const p = Bun.spawn([python, rpcEntry, "-s", socketPath, ...args], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
    });
    const [out, err, code] = await Promise.all([
      new Response(p.stdout).text(),
      new Response(p.stderr).text(),
      p.exited,
    ]);
    if (code !== 0) throw new Error(`rpc.py ${args[0]} exited ${code}: ${(err || out).trim().slice(0, 300)}`);
    return out.trim();
  };
  return {
    createLvol: (lvs, name) =>
      run(["bdev_lvol_create", "-l", lvs, "-c", "unmap", name, String(ALLOCATION_UNIT / 2 ** 20)]),
    createSubsystem: async (nqn, serial) =>
      void (await run(["nvmf_create_subsystem", nqn, "-s", serial, "-d", "DISTORT", "-m", "1"])),
    addNamespace: async (nqn, bdev) => void (await run(["nvmf_subsystem_add_ns", "-n", "1", nqn, bdev])),
    addListener: async (nqn) =>
      void (await run([
        "nvmf_subsystem_add_listener",
        "-t",
        LISTEN.trtype,
        "-a",
        LISTEN.traddr,
        "-s",
        LISTEN.trsvcid,
        "-f",
        LISTEN.adrfam,
        nqn,
      ])),
  };
}

/**
 * Installs SPDK's Python client into <cache>/python/spdk-<version>/ (a venv) unless already
 * there, and returns its interpreter and the rpc.py entry point (the `spdk-rpc` console script).
 * Throws with pip's own words when it cannot.
 */
async function ensureRpcPy(): Promise<{ python: string; entry: string }> {
  const dir = join(cacheRoot(), "python", `spdk-${SPDK_PY_VERSION}`);
  const python = join(dir, "bin", "python");
  const entry = join(dir, "bin", "spdk-rpc");
  const done = join(dir, ".installed");
  if (existsSync(done) && existsSync(entry)) return { python, entry };
  const sh = async (argv: string[]) => {
    const p = Bun.spawn(argv, { stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([
      new Response(p.stdout).text(),
      new Response(p.stderr).text(),
      p.exited,
    ]);
    if (code !== 0) throw new Error(`${argv.join(" ")} failed (${code}): ${(err || out).trim().slice(-400)}`);
  };
  const py3 = Bun.which("python3");
  if (!py3) throw new Error("python3 is not installed");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(cacheRoot(), "python"), { recursive: true });
  say(`installing spdk==${SPDK_PY_VERSION} from PyPI into ${dir}`);
  await sh([py3, "-m", "venv", dir]);
  await sh([
    join(dir, "bin", "pip"),
    "install",
    "--quiet",
    "--disable-pip-version-check",
    `spdk==${SPDK_PY_VERSION}`,
  ]);
  if (!existsSync(entry)) throw new Error(`spdk==${SPDK_PY_VERSION} installed no spdk-rpc entry point`);
  writeFileSync(done, `${SPDK_PY_VERSION}\n`);
  return { python, entry };
}

interface Run {
  mode: string;
  sequences: number;
  inFlight: number;
  seconds: number;
  rpcPerSec: number;
  seqLatencyMs: number[];
  /** CPU time of the target process, as a share of one core over the run. */
  serverCpu: number;
  /** CPU time of this process and its reaped children (rpc.py), as a share of one core. */
  clientCpu: number;
}

// Kernel clock ticks per second for /proc/<pid>/stat times; 100 on every Linux we run on.
const CLK_TCK = 100;

/** utime+stime and cutime+cstime of `pid` in seconds; zeros when /proc cannot be read. */
async function cpuSeconds(pid: number | "self"): Promise<{ own: number; children: number }> {
  try {
    const stat = await Bun.file(`/proc/${pid}/stat`).text();
    const f = stat
      .slice(stat.lastIndexOf(")") + 2)
      .split(" ")
      .map(Number);
    // Fields after the command: state is field 3, so utime (14) is index 11.
    return {
      own: ((f[11] ?? 0) + (f[12] ?? 0)) / CLK_TCK,
      children: ((f[13] ?? 0) + (f[14] ?? 0)) / CLK_TCK,
    };
  } catch {
    return { own: 0, children: 0 };
  }
}

let targetPid = 0;

let runNo = 0;

/** Runs `n` sequences with `inFlight` of them at a time, fresh names per run; then verifies. */
async function measure(
  mode: string,
  ops: SequenceOps,
  n: number,
  inFlight: number,
  lvs: string,
  admin: SpdkMethods,
): Promise<Run> {
  const r = ++runNo;
  const names = Array.from({ length: n }, (_, i) => ({
    lvol: `b${r}-${i}`,
    nqn: `nqn.2026-02.io.distort:bench-${r}-${i}`,
    serial: `DSTB${r}X${i}`.slice(0, 20),
  }));
  const lat: number[] = [];
  let next = 0;
  const [srv0, cli0] = await Promise.all([cpuSeconds(targetPid), cpuSeconds("self")]);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(inFlight, n) }, async () => {
      for (let i = next++; i < n; i = next++) {
        const x = names[i] as (typeof names)[number];
        const s = performance.now();
        const uuid = await ops.createLvol(lvs, x.lvol);
        await ops.createSubsystem(x.nqn, x.serial);
        await ops.addNamespace(x.nqn, uuid);
        await ops.addListener(x.nqn);
        lat.push(performance.now() - s);
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  const [srv1, cli1] = await Promise.all([cpuSeconds(targetPid), cpuSeconds("self")]);
  // Check the outcome before trusting the timing, then clean up for the next run.
  const subs = (await admin.nvmfGetSubsystems()).filter((s) => s.nqn.includes(`:bench-${r}-`));
  const complete = subs.filter((s) => (s.namespaces ?? []).length === 1 && s.listen_addresses.length === 1);
  if (complete.length !== n) throw new Error(`${mode}: ${complete.length}/${n} exports complete`);
  await pool(names, IN_FLIGHT, async (x) => {
    await admin.nvmfDeleteSubsystem(x.nqn);
    await admin.bdevLvolDelete(`${lvs}/${x.lvol}`);
  });
  const run: Run = {
    mode,
    sequences: n,
    inFlight,
    seconds,
    rpcPerSec: (n * RPCS_PER_SEQUENCE) / seconds,
    seqLatencyMs: lat,
    serverCpu: (srv1.own - srv0.own) / seconds,
    clientCpu: (cli1.own - cli0.own + cli1.children - cli0.children) / seconds,
  };
  say(
    `  ${mode.padEnd(40)} ${fmt(run.rpcPerSec).padStart(7)} RPC/s  (${n} sequences in ${fmt(seconds)} s, sequence p50 ${fmt(percentile(lat, 50))} ms, p99 ${fmt(percentile(lat, 99))} ms; CPU target ${pct(run.serverCpu)}, client ${pct(run.clientCpu)})`,
  );
  return run;
}

const pct = (share: number) => `${Math.round(share * 100)}%`;

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "distort-spdk-bench-"));
  const notes: string[] = [];
  const profile: string[] = [];
  const figures: Figure[] = [];
  let target: TargetProcess | undefined;
  let client: SpdkClient | undefined;
  // What this run created on an external target, removed again at the end.
  const cleanup: (() => Promise<unknown>)[] = [];
  const external = ARGS.socket !== undefined;
  const targetText = external
    ? `the nvmf_tgt on ${ARGS.socket} (started by the operator)`
    : "the lab's nvmf_tgt emulator (lab/sim/spdk, same JSON-RPC wire protocol as SPDK v25.05.1's nvmf_tgt, 1 ms asynchronous completion delay) as its own process";
  const lvs = external ? "lvs_distort_bench" : "lvs_bench";
  try {
    let socketPath: string;
    if (ARGS.socket !== undefined) {
      socketPath = ARGS.socket;
      client = new SpdkClient({ socketPath, logger: silentLogger });
      const admin = new SpdkMethods(client);
      const version = await client.call("spdk_get_version");
      say(`external target on ${socketPath}: ${JSON.stringify(version)}`);
      targetPid = ARGS.pid ?? (await admin.frameworkGetReactors()).pid ?? 0;
      let base = ARGS.baseBdev;
      if (base === undefined) {
        // Room for every lvol a run holds at once (a run deletes its lvols before the next).
        base = "distort_bench_malloc";
        const blockSize = 4096;
        const bytes = (Math.max(SEQUENCES, WARM_UP) + 64) * ALLOCATION_UNIT;
        await client.call("bdev_malloc_create", {
          name: base,
          num_blocks: bytes / blockSize,
          block_size: blockSize,
        });
        const created = base;
        cleanup.unshift(() => client?.call("bdev_malloc_delete", { name: created }) ?? Promise.resolve());
        say(`created Malloc bdev ${base} of ${fmt(bytes / 2 ** 30)} GiB`);
      }
      await admin.bdevLvolCreateLvstore({
        bdev_name: base,
        lvs_name: lvs,
        cluster_sz: ALLOCATION_UNIT,
        clear_method: "unmap",
      });
      cleanup.unshift(() => client?.call("bdev_lvol_delete_lvstore", { lvs_name: lvs }) ?? Promise.resolve());
      const transports = (await client.call("nvmf_get_transports")) as { trtype?: string }[];
      if (!transports.some((t) => t.trtype?.toUpperCase() === "TCP"))
        await admin.nvmfCreateTransport({ trtype: "TCP" });
    } else {
      target = await startTargetProcess({
        socketPath: join(dir, "spdk.sock"),
        dataDir: join(dir, "data"),
        drive: { pciAddress: "0000:5e:00.0", serial: "SIMB0001", sizeBytes: 64 * 2 ** 30 },
      });
      socketPath = target.socketPath;
      targetPid = target.pid;
      client = new SpdkClient({ socketPath, logger: silentLogger });
      const admin = new SpdkMethods(client);
      await admin.bdevNvmeAttachController({ name: "Nvme0", trtype: "PCIe", traddr: "0000:5e:00.0" });
      await admin.bdevLvolCreateLvstore({
        bdev_name: "Nvme0n1",
        lvs_name: lvs,
        cluster_sz: ALLOCATION_UNIT,
        clear_method: "unmap",
      });
      await admin.nvmfCreateTransport({ trtype: "TCP" });
    }
    const admin = new SpdkMethods(client);
    const ours = oursOps(admin);
    const cpc = connectPerCallOps(socketPath);
    // Warm-up (JIT, emulator code paths), not recorded.
    await measure("warm-up", ours, WARM_UP, IN_FLIGHT, lvs, admin);
    await measure("warm-up", cpc, WARM_UP, IN_FLIGHT, lvs, admin);

    say(
      `${SEQUENCES} sequences (${RPCS_PER_SEQUENCE} RPCs each) per run, ${ROUNDS} interleaved rounds; target: ${external ? ARGS.socket : "emulated nvmf_tgt in its own process"}`,
    );
    const runs: Record<string, Run[]> = { oursC: [], cpcC: [], oursS: [], cpcS: [] };
    for (let round = 1; round <= ROUNDS; round++) {
      say(`round ${round}:`);
      runs.oursC?.push(await measure(`ours, ${IN_FLIGHT} in flight`, ours, SEQUENCES, IN_FLIGHT, lvs, admin));
      runs.cpcC?.push(
        await measure(`connect-per-call, ${IN_FLIGHT} in flight`, cpc, SEQUENCES, IN_FLIGHT, lvs, admin),
      );
      runs.oursS?.push(await measure("ours, sequential", ours, SEQUENCES, 1, lvs, admin));
      runs.cpcS?.push(await measure("connect-per-call, sequential", cpc, SEQUENCES, 1, lvs, admin));
    }
    const rate = (k: string) => median((runs[k] ?? []).map((r) => r.rpcPerSec));
    const oursC = rate("oursC");
    const cpcC = rate("cpcC");
    const oursS = rate("oursS");
    const cpcS = rate("cpcS");

    let pyC: number | undefined;
    let pyS: number | undefined;
    const pyRuns: Run[] = [];
    let pyFailed: string | undefined;
    try {
      const py = await ensureRpcPy();
      const pyOps = processPerCallOps(py.python, py.entry, socketPath);
      await measure("warm-up", pyOps, 4, 1, lvs, admin);
      pyRuns.push(
        await measure(
          `rpc.py process per call, ${IN_FLIGHT} in flight`,
          pyOps,
          PY_SEQUENCES,
          IN_FLIGHT,
          lvs,
          admin,
        ),
        await measure("rpc.py process per call, sequential", pyOps, PY_SEQUENCES, 1, lvs, admin),
      );
      pyC = pyRuns[0]?.rpcPerSec;
      pyS = pyRuns[1]?.rpcPerSec;
    } catch (err) {
      pyFailed = `SPDK's Python client (spdk==${SPDK_PY_VERSION} from PyPI): ${err instanceof Error ? err.message : String(err)}`;
      say(`process-per-call not measured: ${pyFailed}`);
    }

    const rpcUnit = "RPC/s";
    figures.push(
      {
        id: "ours-vs-connect-per-call",
        label: `ours, ${IN_FLIGHT} sequences in flight`,
        value: oursC,
        unit: rpcUnit,
        better: "higher",
        yardstick: { label: `connect-per-call, ${IN_FLIGHT} in flight`, value: cpcC, unit: rpcUnit },
        ratio: oursC / cpcC,
        ratioLabel: "ours / connect-per-call",
        // SPDK's RPC clock (4 ms polls, one accept per poll, a reply the poll after its request):
        // 16 in flight on one connection is 16 per 8 ms (2000/s), connect-per-call at most one
        // accept per poll (250/s), so 8x; 5x leaves room for the client's own costs.
        target: { text: ">= 5x connect-per-call (the RPC clock allows 8x)", met: oursC / cpcC >= 5 },
      },
      {
        id: "ours-vs-process-per-call",
        label: `ours, ${IN_FLIGHT} sequences in flight`,
        value: pyFailed ? Number.NaN : oursC,
        unit: rpcUnit,
        better: "higher",
        ...(pyC !== undefined
          ? {
              yardstick: {
                label: `rpc.py process per call, ${IN_FLIGHT} in flight`,
                value: pyC,
                unit: rpcUnit,
              },
              ratio: oursC / pyC,
              ratioLabel: "ours / process-per-call",
            }
          : {}),
        target: { text: ">= 300x process-per-call", met: pyC !== undefined && oursC / pyC >= 300 },
        ...(pyFailed ? { failed: pyFailed } : {}),
      },
      {
        id: "ours-sequential-vs-connect-per-call",
        label: "ours, sequential",
        value: oursS,
        unit: rpcUnit,
        better: "higher",
        yardstick: { label: "connect-per-call, sequential", value: cpcS, unit: rpcUnit },
        ratio: oursS / cpcS,
        ratioLabel: "ours / connect-per-call",
      },
      {
        id: "ours-sequential-vs-process-per-call",
        label: "ours, sequential",
        value: pyFailed ? Number.NaN : oursS,
        unit: rpcUnit,
        better: "higher",
        ...(pyS !== undefined
          ? {
              yardstick: { label: "rpc.py process per call, sequential", value: pyS, unit: rpcUnit },
              ratio: oursS / pyS,
              ratioLabel: "ours / process-per-call",
            }
          : {}),
        ...(pyFailed ? { failed: pyFailed } : {}),
      },
    );
    const lat = (k: string) => (runs[k] ?? []).flatMap((r) => r.seqLatencyMs);
    notes.push(
      `A sequence is what the agent sends to create and export one partition: bdev_lvol_create (4 MiB thick, clear_method unmap), nvmf_create_subsystem, nvmf_subsystem_add_ns (nsid 1), nvmf_subsystem_add_listener (TCP 127.0.0.1:4420); each sequence runs its 4 RPCs in order, sequences run ${IN_FLIGHT} at a time or one at a time.`,
      `Rates are RPCs per second (${RPCS_PER_SEQUENCE} per sequence), the median of ${ROUNDS} interleaved rounds of ${SEQUENCES} sequences for ours and connect-per-call; rpc.py ran ${PY_SEQUENCES} sequences once per mode, so its ratios compare per-operation rates of different sample sizes.`,
      external
        ? `Target: ${targetText}; lvstore ${lvs} on ${ARGS.baseBdev ?? "a Malloc bdev the bench created"}, both removed at the end.`
        : `Target: ${targetText}, on SPDK's RPC clock: a 4 ms poller that accepts one connection per poll and answers a request at the poll after it arrives, so one call at a time costs 8 ms (125 calls/s), connect-per-call tops out at 250 calls/s and a persistent connection at calls in flight per 8 ms (as measured against a real v25.05.1 nvmf_tgt; run with --socket to measure one).`,
      `Sequence latency p50/p99 (ms): ours ${IN_FLIGHT} in flight ${fmt(percentile(lat("oursC"), 50))}/${fmt(percentile(lat("oursC"), 99))}, connect-per-call ${IN_FLIGHT} in flight ${fmt(percentile(lat("cpcC"), 50))}/${fmt(percentile(lat("cpcC"), 99))}, ours sequential ${fmt(percentile(lat("oursS"), 50))}/${fmt(percentile(lat("oursS"), 99))}, connect-per-call sequential ${fmt(percentile(lat("cpcS"), 50))}/${fmt(percentile(lat("cpcS"), 99))}.`,
      `rpc.py is spdk==${SPDK_PY_VERSION} from PyPI (the newest there, ${NEWEST_SPDK_PY}, sends enable_nssr in nvmf_create_subsystem, which a v25.05.1 target refuses), run as \`python spdk-rpc -s <socket> <method> <args>\`, one process per RPC.`,
    );
    const bars = [
      { label: `ours, ${IN_FLIGHT} in flight`, value: oursC },
      { label: "ours, sequential", value: oursS, highlight: true },
      { label: `connect-per-call, ${IN_FLIGHT} in flight`, value: cpcC },
      { label: "connect-per-call, sequential", value: cpcS },
      ...(pyC !== undefined ? [{ label: `rpc.py per call, ${IN_FLIGHT} in flight`, value: pyC }] : []),
      ...(pyS !== undefined ? [{ label: "rpc.py per call, sequential", value: pyS }] : []),
    ];
    writeFileSync(
      external ? CHART_EXTERNAL : CHART,
      svgBarChart({
        title: "SPDK control path: lvol create + NVMe-oF export, RPCs per second",
        unit: "RPC/s",
        bars,
        log: true,
        width: 760,
      }),
    );
    notes.push(
      `Chart: ${external ? "docs/spdk-client-comparison-external.svg" : "docs/spdk-client-comparison.svg"} (log scale).`,
    );
    // Where the time goes: which side was busy. A target near 100% of a core is the ceiling
    // every client shares, which caps what any client-side saving can show.
    const cpu = (k: string) => {
      const rs = runs[k] ?? [];
      return `target ${pct(median(rs.map((r) => r.serverCpu)))}, client ${pct(median(rs.map((r) => r.clientCpu)))}`;
    };
    profile.push(
      `CPU use as a share of one core (median over rounds): ours ${IN_FLIGHT} in flight: ${cpu("oursC")}; connect-per-call ${IN_FLIGHT} in flight: ${cpu("cpcC")}; ours sequential: ${cpu("oursS")}; connect-per-call sequential: ${cpu("cpcS")}.`,
      ...pyRuns.map(
        (r) => `${r.mode}: target ${pct(r.serverCpu)}, client incl. Python processes ${pct(r.clientCpu)}.`,
      ),
    );
  } finally {
    for (const undo of cleanup)
      await undo().catch((err) => say(`cleanup on the external target failed: ${err}`));
    await client?.close();
    await target?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  writeResult({ bench: "spdk-client", figures, notes, profile });
}

if (import.meta.main) await main();
