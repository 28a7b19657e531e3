// One storage node at 500, 1000 and 2000 exports: an agent process supervising an emulated nvmf_tgt
// (with an RPC meter) serves placed partitions on a real control plane. Measured per size: nvmf_tgt
// SIGKILL to every export back and verified, the periodic re-verify's RPCs per second, and an
// agent restart to every export verified; yardstick (same run): the bare RPCs that re-create them.
// Run: bun bench/agent-recovery.bench.ts [exports...]
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { type ControlPlane, startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { claimDevice, createPlacedMany, placedPartition } from "../lab/harness/storage-node.ts";
import { connect, type KubeConnection } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { type RpcCounts, readCounts } from "./counting-nvmf-tgt.ts";
import { cpuSeconds, pool } from "./proc-stats.ts";
import {
  type Figure,
  fmt,
  type GrowthPoint,
  growthExponent,
  growthLine,
  svgBarChart,
  svgStack,
  writeResult,
} from "./report.ts";
import { simAgentEnv } from "./sim-agent-env.ts";
import { startTargetProcess } from "./spdk-client.bench.ts";

const SIZES = process.argv.length > 2 ? process.argv.slice(2).map(Number) : [500, 1000, 2000];
const KILL_TARGET_S = 20;
const RESTART_TARGET_S = 10;
const IN_FLIGHT = 16;
/** What the agent raises the limit to (DISTORT_SPDK_MAX_SUBSYSTEMS' default); the yardstick too. */
const MAX_SUBSYSTEMS = 4096;
const POLL_MS = 250;
// The bench's verify period (production default 60 s), so a window of whole periods stays short;
// the measured cost per export per pass is restated at the production period.
const VERIFY_PERIOD_MS = 10_000;
const PRODUCTION_VERIFY_PERIOD_S = 60;
// Starts one second after recovery: the passes the replay scheduled land at ~10 s and ~20 s.
const WINDOW_MS = 2.5 * VERIFY_PERIOD_MS;
const MiB = 2 ** 20;
const DRIVE = { pciAddress: "0000:5e:00.0", serial: "SIMR0001", sizeBytes: 64 * 2 ** 30 };
const ROOT = join(import.meta.dir, "..");
const AGENT = join(ROOT, "agent", "main.ts");
const COUNTING_TGT = join(import.meta.dir, "counting-nvmf-tgt.ts");
const SVG = join(ROOT, "docs", "agent-recovery-growth.svg");
const say = (s: string) => process.stdout.write(`${s}\n`);
interface LogLine {
  ts: string;
  msg: string;
  [k: string]: unknown;
}

/** Polls `fn` every `ms` until it returns a value, or throws after `timeoutMs`. */
async function until<T>(
  what: string,
  timeoutMs: number,
  ms: number,
  fn: () => Promise<T | undefined>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await Bun.sleep(ms);
  }
}

/** The pid of the metered nvmf_tgt serving `socketPath` (spawned by the agent's supervisor). */
function targetPid(socketPath: string): number | undefined {
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, "utf8");
      if (cmd.includes(COUNTING_TGT) && cmd.includes(socketPath)) return Number(name);
    } catch {
      // exited while we looked
    }
  }
  return undefined;
}

/** Median milliseconds of `n` sequential runs of `fn`. */
async function timeCalls(n: number, fn: () => Promise<unknown>): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn();
    ms.push(performance.now() - t);
  }
  return ms.sort((a, b) => a - b)[Math.floor(n / 2)] as number;
}

/** How many of `nqns` the target serves completely (namespace 1 and one listener). */
async function completeExports(m: SpdkMethods, nqns: ReadonlySet<string>): Promise<number> {
  const subs = await m.nvmfGetSubsystems(undefined, { timeoutMs: 5000 });
  return subs.filter(
    (s) =>
      nqns.has(s.nqn) && (s.namespaces ?? []).some((n) => n.nsid === 1) && s.listen_addresses.length === 1,
  ).length;
}

function isReady(p: NVMePartition): boolean {
  return (
    p.status?.state === "Exported" &&
    (p.status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True")
  );
}

/** Collects an agent's JSON log lines from its stdout and stderr. */
function pump(stream: ReadableStream<Uint8Array>, into: LogLine[]): void {
  void (async () => {
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of stream) {
      buf += dec.decode(chunk, { stream: true });
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const text = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        try {
          into.push(JSON.parse(text) as LogLine);
        } catch {
          // not a log line
        }
      }
    }
  })();
}
/** The agent's RSS in MiB, from /proc; NaN when it cannot be read. */
function rssMiB(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) / 1024 : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

/** Requests in `b` beyond those in `a`, by method, largest first. */
function methodDelta(a: RpcCounts, b: RpcCounts): [string, number][] {
  return Object.entries(b.byMethod)
    .map(([m, n]) => [m, n - (a.pid === b.pid ? (a.byMethod[m] ?? 0) : 0)] as [string, number])
    .filter(([, n]) => n > 0)
    .sort((x, y) => y[1] - x[1]);
}

/** What one size of the scenario measured. */
interface SizeRun {
  exports: number;
  initialS: number;
  killS: number;
  restartS: number;
  yardstickS: number;
  verifyRpcPerS: number;
  /** RPCs at the target per export per verify period (everything the agent sent, over n and periods). */
  rpcsPerExportPass: number;
  agentRssMiB: number;
  notes: string[];
  profile: string[];
}

/** One agent process of the scenario, with its collected log lines. */
interface RunningAgent {
  proc: Subprocess<"ignore", "pipe", "pipe">;
  logs: LogLine[];
  spawnedAt: number;
}

function spawnAgent(env: Record<string, string>): RunningAgent {
  const logs: LogLine[] = [];
  const proc = Bun.spawn([process.execPath, AGENT], { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  pump(proc.stdout, logs);
  pump(proc.stderr, logs);
  return { proc, logs, spawnedAt: Date.now() };
}

async function stopAgent(a: RunningAgent): Promise<void> {
  a.proc.kill("SIGTERM");
  await Promise.race([a.proc.exited, Bun.sleep(15_000)]);
  a.proc.kill("SIGKILL");
  await a.proc.exited;
}

/** Runs the whole scenario for `n` exports in its own namespace and directory. */
async function runSize(cp: ControlPlane, conn: KubeConnection, n: number): Promise<SizeRun> {
  const dir = mkdtempSync(join(tmpdir(), "distort-recovery-bench-"));
  const notes: string[] = [];
  const profile: string[] = [];
  let agent: RunningAgent | undefined;
  let probe: SpdkClient | undefined;
  try {
    const ns = `recovery-${n}-${Date.now().toString(36)}`;
    await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name: ns } } });
    const sim = await simAgentEnv({
      dir,
      kubeconfigPath: cp.kubeconfigPath,
      namespace: ns,
      drive: DRIVE,
      logLevel: "info",
    });
    const { socketPath, dataDir } = sim;
    const countFile = join(dir, "rpc-counts.json");
    // The emulator behind an RPC meter; production defaults otherwise except the verify period.
    const env = {
      ...sim.env,
      DISTORT_NVMF_TGT: `${process.execPath} ${COUNTING_TGT} --count-file ${countFile} --sim-data-dir ${dataDir} --sim-drives ${join(dataDir, "drives.json")}`,
      DISTORT_VERIFY_PERIOD_MS: String(VERIFY_PERIOD_MS),
    };
    const alive = () => {
      if (agent?.proc.exitCode !== null) throw new Error(`agent exited with ${agent?.proc.exitCode}`);
    };
    agent = spawnAgent(env);
    const devices = new ResourceClient(conn, kinds.NVMeDevice);
    const parts = new ResourceClient(conn, kinds.NVMePartition);
    const device = await until("the agent to report its drive", 60_000, 200, async () => {
      alive();
      return (await devices.list({ namespace: ns })).items.find(
        (d: NVMeDevice) => d.spec.serial === DRIVE.serial,
      );
    });
    const claim = await claimDevice(conn, device, ns);
    say(`[${n}] agent up, drive reported and claimed; creating ${n} placed partitions of 4 MiB`);

    const t0 = performance.now();
    await createPlacedMany(
      conn,
      [...Array(n).keys()].map((i) => placedPartition(`p${i}`, ns, device, claim, 4 * MiB)),
      device,
      32,
    );
    let lastPrint = 0;
    const exported = await until(`${n} partitions Exported`, 30 * 60_000, 1000, async () => {
      alive();
      const items = (await parts.list({ namespace: ns })).items;
      const ready = items.filter(isReady);
      if (performance.now() - lastPrint > 10_000) {
        lastPrint = performance.now();
        say(`  ${fmt((performance.now() - t0) / 1000)} s: ${ready.length}/${n} exported`);
      }
      return ready.length === n ? items : undefined;
    });
    const initialS = (performance.now() - t0) / 1000;
    const nqns = new Set(exported.map((p) => p.status?.nqn as string));
    probe = new SpdkClient({
      socketPath,
      logger: silentLogger,
      callTimeoutMs: 5000,
      reconnect: { initialMs: 50, maxMs: 200 },
    });
    const pm = new SpdkMethods(probe);
    const before = await completeExports(pm, nqns);
    if (before !== n) throw new Error(`only ${before}/${n} exports on the target before the kill`);
    say(`[${n}] all exported after ${fmt(initialS)} s; target verified`);
    const versions = new Map(exported.map((p) => [p.metadata.name, p.metadata.resourceVersion]));

    // --- (b) nvmf_tgt kill -9 ---
    const pid = targetPid(socketPath);
    if (pid === undefined) throw new Error("cannot find the nvmf_tgt process the agent spawned");
    const agentCpu0 = cpuSeconds(agent.proc.pid, Number.NaN);
    const killAt = Date.now();
    const k0 = performance.now();
    process.kill(pid, "SIGKILL");
    say(`[${n}] killed nvmf_tgt (pid ${pid}) with SIGKILL; waiting for every export to come back`);
    const marks: Record<string, number> = {};
    const mark = (k: string) => {
      marks[k] ??= (performance.now() - k0) / 1000;
    };
    let notReadySeen = 0;
    await until("every export back on the new target", 10 * 60_000, POLL_MS, async () => {
      const c = await completeExports(pm, nqns);
      mark("target answers again");
      if (c > 0) mark("first export back");
      if (c >= n / 2) mark("half the exports back");
      return c === n ? c : undefined;
    });
    mark("all exports back on the target");
    const after = await until("every partition status Ready", 10 * 60_000, POLL_MS, async () => {
      const items = (await parts.list({ namespace: ns })).items;
      const ready = items.filter(isReady).length;
      notReadySeen = Math.max(notReadySeen, n - ready);
      return ready === n ? items : undefined;
    });
    mark("all statuses Ready");
    const agentCpu = cpuSeconds(agent.proc.pid, Number.NaN) - agentCpu0;
    const newTargetCpu = cpuSeconds(targetPid(socketPath), Number.NaN);
    const killS = marks["all statuses Ready"] as number;
    const statusWrites = after.filter(
      (p) => versions.get(p.metadata.name) !== p.metadata.resourceVersion,
    ).length;
    say(`[${n}] recovered from the kill in ${fmt(killS)} s`);
    await probe.close();
    probe = undefined;

    // Where the time went, from the agent's own log lines after the kill.
    const since = agent.logs.filter((l) => Date.parse(l.ts) >= killAt);
    const at = (l: LogLine | undefined, from = killAt) => (l ? (Date.parse(l.ts) - from) / 1000 : Number.NaN);
    const first = (msg: string) => since.find((l) => l.msg === msg);
    const isSummary = (l: LogLine) => /^exports (not all )?restored after a target restart$/.test(l.msg);
    const summary = since.find(isSummary);
    const errors = since.filter((l) => l.level === "error" || l.level === "warn");
    const timeline = [
      ["supervisor logs the exit (detection)", at(first("nvmf_tgt exited"))],
      ["supervisor spawns a new nvmf_tgt", at(first("spawned nvmf_tgt"))],
      ["new nvmf_tgt initialised", at(first("nvmf_tgt ready"))],
      ["agent summarizes the replay, every export verified (agent log)", at(summary)],
      ...Object.entries(marks).map(([k, v]) => [`${k} (bench poll)`, v] as const),
    ] as const;

    // --- (c) the periodic re-verify, counted at the target's RPC server ---
    await Bun.sleep(1000);
    const rss = rssMiB(agent.proc.pid);
    const c1 = await until("the RPC meter's file", 10_000, 100, () => readCounts(countFile));
    const w0 = performance.now();
    await Bun.sleep(WINDOW_MS);
    const c2 = await until("the RPC meter's file", 10_000, 100, () => readCounts(countFile));
    const windowS = (performance.now() - w0) / 1000;
    if (c1.pid !== c2.pid) throw new Error("nvmf_tgt restarted during the re-verify window");
    const verifyRpcs = c2.total - c1.total;
    const verifyRpcPerS = verifyRpcs / windowS;
    let namingNqn = 0;
    let touched = 0;
    for (const q of nqns) {
      const d = (c2.byNqn[q] ?? 0) - (c1.byNqn[q] ?? 0);
      namingNqn += d;
      if (d > 0) touched++;
    }
    const passes = windowS / (VERIFY_PERIOD_MS / 1000);
    const rpcsPerExportPass = verifyRpcs / n / passes;
    say(`[${n}] re-verify: ${verifyRpcs} RPCs in ${fmt(windowS)} s (${fmt(verifyRpcPerS)}/s)`);

    // --- (a) agent restart: SIGTERM as on a rolling update, then a new agent process ---
    const old = agent;
    agent = undefined;
    const r0 = Date.now();
    await stopAgent(old);
    const stoppedS = (Date.now() - r0) / 1000;
    agent = spawnAgent(env);
    const a0 = performance.now();
    probe = new SpdkClient({
      socketPath,
      logger: silentLogger,
      callTimeoutMs: 5000,
      reconnect: { initialMs: 50, maxMs: 200 },
    });
    const pm2 = new SpdkMethods(probe);
    const restartMarks: Record<string, number> = {};
    const rmark = (k: string) => {
      restartMarks[k] ??= (performance.now() - a0) / 1000;
    };
    await until("every export back after the agent restart", 10 * 60_000, POLL_MS, async () => {
      alive();
      const c = await completeExports(pm2, nqns);
      rmark("target answers");
      if (c > 0) rmark("first export back");
      if (c >= n / 2) rmark("half the exports back");
      return c === n ? c : undefined;
    });
    rmark("all exports on the target");
    const restarted = agent;
    await until("the restarted agent to verify every export", 10 * 60_000, POLL_MS, async () => {
      alive();
      const items = (await parts.list({ namespace: ns })).items;
      if (items.filter(isReady).length !== n) return undefined;
      rmark("all statuses Ready");
      const s = restarted.logs.find(isSummary);
      return s ? s : undefined;
    });
    rmark("agent logs every export verified");
    // The new target's counts: every request since it started, i.e. the whole restart's.
    const c3 = await until("the RPC meter's file", 10_000, 100, () => readCounts(countFile));
    const empty: RpcCounts = { pid: c3.pid, total: 0, byMethod: {}, byNqn: {} };
    const restartS = Math.max(
      restartMarks["all statuses Ready"] as number,
      restartMarks["agent logs every export verified"] as number,
    );
    const rlog = (msg: string) =>
      at(
        restarted.logs.find((l) => l.msg === msg),
        restarted.spawnedAt,
      );
    const rsummary = restarted.logs.find(isSummary);
    const rerrors = restarted.logs.filter((l) => l.level === "error" || l.level === "warn");
    const byMsg = new Map<string, number>();
    for (const l of rerrors) byMsg.set(`${l.level}: ${l.msg}`, (byMsg.get(`${l.level}: ${l.msg}`) ?? 0) + 1);
    say(`[${n}] agent restart to every export verified: ${fmt(restartS)} s`);
    await probe.close();
    probe = undefined;

    // --- yardstick: the bare RPCs recovery must issue, through the same client, same data ---
    const last = agent;
    agent = undefined;
    await stopAgent(last);
    const y0 = performance.now();
    const tgt = await startTargetProcess({
      socketPath: join(dir, "ys.sock"),
      dataDir,
      drive: DRIVE,
      maxSubsystems: MAX_SUBSYSTEMS,
    });
    const startS = (performance.now() - y0) / 1000;
    const ys = new SpdkClient({ socketPath: tgt.socketPath, logger: silentLogger });
    let yardstickS: number;
    let readCosts = { oneTyped: Number.NaN, allTyped: Number.NaN, allRaw: Number.NaN };
    try {
      const m = new SpdkMethods(ys);
      const y1 = performance.now();
      await m.bdevNvmeAttachController({ name: "nvme_bench", trtype: "PCIe", traddr: DRIVE.pciAddress });
      await ys.call("bdev_wait_for_examine");
      await m.nvmfCreateTransport({ trtype: "TCP" });
      await pool(exported, IN_FLIGHT, async (p) => {
        const s = p.status as NonNullable<NVMePartition["status"]>;
        const nqn = s.nqn as string;
        await m.nvmfCreateSubsystem({
          nqn,
          serial_number: `Y${nqn.slice(-19)}`.toUpperCase().slice(0, 20),
          model_number: "DISTORT",
          allow_any_host: false,
          max_namespaces: 1,
        });
        await m.nvmfSubsystemAddNs({ nqn, namespace: { bdev_name: s.backendPath as string, nsid: 1 } });
        await m.nvmfSubsystemAddListener({
          nqn,
          listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.1", trsvcid: "4420" },
        });
      });
      yardstickS = (performance.now() - y1) / 1000;
      const check = await completeExports(m, nqns);
      if (check !== n) throw new Error(`yardstick left ${check}/${n} exports`);
      // The reads the agent's per-export pass makes, at this scale: one subsystem, and all of them
      // (SpdkTarget.collectKeys lists every subsystem when it collects DH-CHAP keys), typed and raw.
      const one = exported[0]?.status?.nqn as string;
      readCosts = {
        oneTyped: await timeCalls(20, () => m.nvmfGetSubsystems(one)),
        allTyped: await timeCalls(10, () => m.nvmfGetSubsystems()),
        allRaw: await timeCalls(10, () => ys.call("nvmf_get_subsystems")),
      };
    } finally {
      await ys.close();
      await tgt.stop();
    }

    const top = (d: [string, number][]) =>
      d
        .slice(0, 6)
        .map(([m, k]) => `${m} ${k}`)
        .join(", ");
    notes.push(
      `[${n}] Partition statuses never left Ready during the kill outage (at most ${notReadySeen} seen not Ready while polling after the target was back); ${statusWrites} of ${n} partition objects were written during recovery; the agent logged ${summary ? `one restart summary (${summary.repaired} of ${summary.exports} exports repaired)` : "no restart summary"} and ${errors.length} warnings/errors; the yardstick's emulator took ${fmt(startS)} s from spawn to first answer (not counted).`,
    );
    profile.push(
      ...timeline.map(([k, v]) => `[${n}] kill: t+${fmt(v)} s: ${k}`),
      `[${n}] kill: CPU from kill to all Ready (${fmt(killS)} s): agent ${fmt(agentCpu)} s, new nvmf_tgt ${fmt(newTargetCpu)} s; bare RPCs ran at ${fmt(n / yardstickS)} exports/s.`,
      `[${n}] re-verify window ${fmt(windowS)} s (${fmt(passes)} periods of ${VERIFY_PERIOD_MS / 1000} s): ${verifyRpcs} RPCs (${top(methodDelta(c1, c2))}); ${namingNqn} name an export's NQN, ${touched}/${n} exports touched; ${fmt(rpcsPerExportPass)} RPCs per export per period, so ${fmt((rpcsPerExportPass * n) / PRODUCTION_VERIFY_PERIOD_S)} RPC/s at the production period of ${PRODUCTION_VERIFY_PERIOD_S} s (plus the liveness ping and the reporter).`,
      `[${n}] agent restart: old agent stopped in ${fmt(stoppedS)} s (its nvmf_tgt with it: the agent runs nvmf_tgt as its child, as the chart deploys it); new agent: t+${fmt(rlog("agent running"))} s agent running, t+${fmt(rlog("nvmf_tgt ready"))} s new nvmf_tgt ready, ${Object.entries(
        restartMarks,
      )
        .map(([k, v]) => `t+${fmt(v)} s ${k}`)
        .join(
          ", ",
        )}; ${c3.total} RPCs at the new target (${top(methodDelta(empty, c3))}); ${rsummary ? `summary: ${rsummary.verified} verified, ${rsummary.repaired} repaired, ${rsummary.unverified} unverified` : "no summary"}.`,
      `[${n}] restarted agent: ${rerrors.length} warnings/errors${
        rerrors.length > 0
          ? ` (${[...byMsg]
              .slice(0, 5)
              .map(([m, k]) => `${m} x${k}`)
              .join(
                "; ",
              )}; first at t+${fmt(at(rerrors[0], restarted.spawnedAt))} s, last at t+${fmt(at(rerrors[rerrors.length - 1], restarted.spawnedAt))} s)`
          : ""
      }.`,
      ...(rerrors.some((l) => l.level === "error")
        ? [
            `[${n}] restarted agent's first error: ${JSON.stringify(rerrors.find((l) => l.level === "error")).slice(0, 600)}`,
          ]
        : []),
      `[${n}] read costs (median, sequential): nvmf_get_subsystems for one NQN ${fmt(readCosts.oneTyped)} ms; for all ${n} ${fmt(readCosts.allTyped)} ms through SpdkMethods (${fmt(readCosts.allRaw)} ms raw, without result validation).`,
      ...(errors.length > 0
        ? [
            `[${n}] agent warnings/errors after the kill (first 5 distinct): ${[...new Set(errors.map((l) => `${l.level}: ${l.msg}`))].slice(0, 5).join("; ")}`,
          ]
        : []),
    );
    return {
      exports: n,
      initialS,
      killS,
      restartS,
      yardstickS,
      verifyRpcPerS,
      rpcsPerExportPass,
      agentRssMiB: rss,
      notes,
      profile,
    };
  } finally {
    await probe?.close();
    if (agent) {
      agent.proc.kill("SIGKILL");
      await agent.proc.exited;
    }
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const figures: Figure[] = [];
  const notes: string[] = [];
  const profile: string[] = [];
  const runs: SizeRun[] = [];
  const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
  try {
    const conn = connect(cp.kubeconfigPath);
    await installCrds(conn);
    for (const n of SIZES) runs.push(await runSize(cp, conn, n));
  } finally {
    await cp.stop();
  }
  for (const r of runs) {
    const n = r.exports;
    figures.push(
      {
        id: `kill-${n}`,
        label: `nvmf_tgt SIGKILL to all ${n} exports verified`,
        value: r.killS,
        unit: "s",
        better: "lower",
        yardstick: {
          label: `bare RPCs re-creating ${n} exports, ${IN_FLIGHT} in flight`,
          value: r.yardstickS,
          unit: "s",
        },
        ratio: r.killS / r.yardstickS,
        ratioLabel: "recovery / bare RPCs",
        target: { text: `< ${KILL_TARGET_S} s`, met: r.killS < KILL_TARGET_S },
      },
      {
        id: `restart-${n}`,
        label: `agent restart (SIGTERM, new process) to all ${n} exports verified`,
        value: r.restartS,
        unit: "s",
        better: "lower",
        yardstick: {
          label: `bare RPCs re-creating ${n} exports, ${IN_FLIGHT} in flight`,
          value: r.yardstickS,
          unit: "s",
        },
        ratio: r.restartS / r.yardstickS,
        ratioLabel: "restart / bare RPCs",
        target: { text: `< ${RESTART_TARGET_S} s`, met: r.restartS < RESTART_TARGET_S },
      },
      {
        id: `verify-rps-${n}`,
        label: `periodic re-verify of ${n} exports, RPCs/s at the target (verify period ${VERIFY_PERIOD_MS / 1000} s)`,
        value: r.verifyRpcPerS,
        unit: "RPC/s",
        better: "lower",
        yardstick: {
          label: `RPCs per export per period`,
          value: r.rpcsPerExportPass,
          unit: "RPC",
        },
      },
      {
        id: `initial-export-${n}`,
        label: `initial export of ${n} placed partitions`,
        value: r.initialS,
        unit: "s",
        better: "lower",
      },
      {
        id: `agent-rss-${n}`,
        label: `agent RSS serving ${n} exports`,
        value: r.agentRssMiB,
        unit: "MiB",
        better: "lower",
      },
    );
    notes.push(...r.notes);
    profile.push(...r.profile);
  }
  notes.unshift(
    `Each size runs in its own namespace on one control plane: one agent process (production defaults: 32 partition workers; the emulator on SPDK's RPC clock, 8 ms per call; verify period ${VERIFY_PERIOD_MS / 1000} s instead of 60 s so the re-verify window holds whole periods) supervises the lab's nvmf_tgt emulator behind an RPC meter (bench/counting-nvmf-tgt.ts counts every request its RPC server dispatches); the partitions of 4 MiB are written already placed on one claimed 64 GiB drive and exported over TCP.`,
    `Kill: the target is SIGKILLed; recovery ends when the bench's own poll (every ${POLL_MS} ms, nvmf_get_subsystems over a separate connection) sees every subsystem with namespace 1 and its listener, and every partition is Exported with Ready=True. Restart: the agent is sent SIGTERM (it stops the nvmf_tgt it runs, as in the chart) and a new agent process started; the time runs from the new process's spawn until every export is back on the target, every partition Ready and the agent has logged its restart summary. Re-verify: requests counted at the target in a window of ${WINDOW_MS / 1000} s starting 1 s after the kill's recovery, no other client connected.`,
    `Yardstick: after stopping the agent, a fresh emulator on the same drive data, then with lib/spdk's client: attach the drive, bdev_wait_for_examine (lvstore reload), create the TCP transport, and nvmf_create_subsystem + nvmf_subsystem_add_ns + nvmf_subsystem_add_listener per export, ${IN_FLIGHT} exports in flight.`,
  );
  if (runs.length >= 2) {
    const series: [string, string, (r: SizeRun) => number][] = [
      ["kill -9 to all verified", "s", (r) => r.killS],
      ["agent restart to all verified", "s", (r) => r.restartS],
      ["initial export", "s", (r) => r.initialS],
      ["re-verify RPCs/s", "RPC/s", (r) => r.verifyRpcPerS],
      ["agent RSS", "MiB", (r) => r.agentRssMiB],
    ];
    for (const [what, unit, get] of series) {
      const pts: GrowthPoint[] = runs.map((r) => ({ size: r.exports, value: get(r) }));
      if (pts.some((p) => !(p.value > 0))) continue;
      notes.push(`growth, ${growthLine(what, unit, pts)}`);
      figures.push({
        id: `growth-${what.replaceAll(/[^a-z]+/g, "-")}`,
        label: `growth of ${what} with exports (${runs.map((r) => r.exports).join(", ")}): log-log exponent`,
        value: growthExponent(pts),
        unit: "",
        better: "lower",
      });
    }
    await Bun.write(
      SVG,
      svgStack(
        "One storage node: recovery and cost by number of exports",
        series.map(([what, unit, get]) =>
          svgBarChart({
            title: `${what} (${unit})`,
            unit,
            bars: runs.map((r) => ({ label: `${r.exports} exports`, value: get(r) })),
          }),
        ),
      ),
    );
    notes.push("Chart of the growth: docs/agent-recovery-growth.svg.");
  }
  writeResult({ bench: "agent-recovery", figures, notes, profile });
}

if (import.meta.main) await main();
