// nvmf_tgt restart under 1000 exports: an agent process supervising an emulated nvmf_tgt serves
// 1000 placed partitions on a real control plane; the target is SIGKILLed and the time until every
// export is back and verified is measured. Yardstick (same run): the bare RPCs that re-create them.
// Run: bun bench/agent-recovery.bench.ts [partitions]
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { claimDevice, placedPartition } from "../lab/harness/storage-node.ts";
import { connect } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { cpuSeconds, pool } from "./proc-stats.ts";
import { type Figure, fmt, writeResult } from "./report.ts";
import { EMULATOR_PATH as EMULATOR, simAgentEnv } from "./sim-agent-env.ts";
import { startTargetProcess } from "./spdk-client.bench.ts";

const PARTITIONS = Number(process.argv[2] ?? 1000);
const TARGET_S = 10;
const IN_FLIGHT = 16;
const POLL_MS = 250;
const MiB = 2 ** 20;
const DRIVE = { pciAddress: "0000:5e:00.0", serial: "SIMR0001", sizeBytes: 64 * 2 ** 30 };
const ROOT = join(import.meta.dir, "..");
const AGENT = join(ROOT, "agent", "main.ts");
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

/** The pid of the emulated nvmf_tgt serving `socketPath` (spawned by the agent's supervisor). */
function targetPid(socketPath: string): number | undefined {
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmd = readFileSync(`/proc/${name}/cmdline`, "utf8");
      if (cmd.includes(EMULATOR) && cmd.includes(socketPath)) return Number(name);
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

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "distort-recovery-bench-"));
  const figures: Figure[] = [];
  const notes: string[] = [];
  const profile: string[] = [];
  const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
  let agent: Subprocess<"ignore", "pipe", "pipe"> | undefined;
  let probe: SpdkClient | undefined;
  try {
    const conn = connect(cp.kubeconfigPath);
    await installCrds(conn);
    const ns = `recovery-${Date.now().toString(36)}`;
    await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name: ns } } });
    const { env, socketPath, dataDir } = await simAgentEnv({
      dir,
      kubeconfigPath: cp.kubeconfigPath,
      namespace: ns,
      drive: DRIVE,
      logLevel: "info",
    });
    const logs: LogLine[] = [];
    // Production defaults for workers and periods; the agent supervises nvmf_tgt itself.
    agent = Bun.spawn([process.execPath, AGENT], { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    pump(agent.stdout, logs);
    pump(agent.stderr, logs);
    const devices = new ResourceClient(conn, kinds.NVMeDevice);
    const parts = new ResourceClient(conn, kinds.NVMePartition);
    const device = await until("the agent to report its drive", 60_000, 200, async () => {
      if (agent?.exitCode !== null) throw new Error(`agent exited with ${agent?.exitCode}`);
      return (await devices.list()).items.find((d: NVMeDevice) => d.spec.serial === DRIVE.serial);
    });
    const claim = await claimDevice(conn, device, ns);
    say(`agent up, drive reported and claimed; creating ${PARTITIONS} placed partitions of 4 MiB`);

    const t0 = performance.now();
    await pool([...Array(PARTITIONS).keys()], 32, async (i) => {
      await parts.create(placedPartition(`p${i}`, ns, device, claim, 4 * MiB));
    });
    let lastPrint = 0;
    const exported = await until(`${PARTITIONS} partitions Exported`, 30 * 60_000, 1000, async () => {
      if (agent?.exitCode !== null) throw new Error(`agent exited with ${agent?.exitCode}`);
      const items = (await parts.list({ namespace: ns })).items;
      const ready = items.filter(isReady);
      if (performance.now() - lastPrint > 10_000) {
        lastPrint = performance.now();
        say(`  ${fmt((performance.now() - t0) / 1000)} s: ${ready.length}/${PARTITIONS} exported`);
      }
      return ready.length === PARTITIONS ? items : undefined;
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
    if (before !== PARTITIONS)
      throw new Error(`only ${before}/${PARTITIONS} exports on the target before the kill`);
    say(`all ${PARTITIONS} exported after ${fmt(initialS)} s; target verified`);
    const versions = new Map(exported.map((p) => [p.metadata.name, p.metadata.resourceVersion]));

    // --- the kill ---
    const pid = targetPid(socketPath);
    if (pid === undefined) throw new Error("cannot find the nvmf_tgt process the agent spawned");
    const agentCpu0 = cpuSeconds(agent.pid, Number.NaN);
    const killAt = Date.now();
    const k0 = performance.now();
    process.kill(pid, "SIGKILL");
    say(`killed nvmf_tgt (pid ${pid}) with SIGKILL; waiting for every export to come back`);
    const marks: Record<string, number> = {};
    const mark = (k: string) => {
      marks[k] ??= (performance.now() - k0) / 1000;
    };
    let notReadySeen = 0;
    await until("every export back on the new target", 10 * 60_000, POLL_MS, async () => {
      const n = await completeExports(pm, nqns);
      mark("target answers again");
      const lvs = await pm.bdevLvolGetLvstores({}, { timeoutMs: 5000 }).catch(() => []);
      if (lvs.length > 0) mark("lvstore loaded again");
      if (n > 0) mark("first export back");
      if (n >= PARTITIONS / 2) mark("half the exports back");
      return n === PARTITIONS ? n : undefined;
    });
    mark("all exports back on the target");
    const after = await until("every partition status Ready", 10 * 60_000, POLL_MS, async () => {
      const items = (await parts.list({ namespace: ns })).items;
      const ready = items.filter(isReady).length;
      notReadySeen = Math.max(notReadySeen, PARTITIONS - ready);
      return ready === PARTITIONS ? items : undefined;
    });
    mark("all statuses Ready");
    const agentCpu = cpuSeconds(agent.pid, Number.NaN) - agentCpu0;
    const newTargetCpu = cpuSeconds(targetPid(socketPath), Number.NaN);
    const recoveryS = marks["all statuses Ready"] as number;
    const statusWrites = after.filter(
      (p) => versions.get(p.metadata.name) !== p.metadata.resourceVersion,
    ).length;
    say(`recovered in ${fmt(recoveryS)} s`);

    // Where the time went, from the agent's own log lines after the kill.
    const since = logs.filter((l) => Date.parse(l.ts) >= killAt);
    const at = (l: LogLine | undefined) => (l ? (Date.parse(l.ts) - killAt) / 1000 : Number.NaN);
    const first = (msg: string) => since.find((l) => l.msg === msg);
    // Per-export repair lines (info before the replay was summarized, debug since) and the one
    // summary line the partition controller writes once every export of the restart is verified.
    const repaired = since.filter((l) => l.msg === "export repaired");
    const repairedNqns = new Set(repaired.map((l) => l.nqn));
    const summary = since.find((l) => /^exports (not all )?restored after a target restart$/.test(l.msg));
    const errors = since.filter((l) => l.level === "error" || l.level === "warn");
    const timeline = [
      ["supervisor logs the exit (detection)", at(first("nvmf_tgt exited"))],
      ["supervisor spawns a new nvmf_tgt", at(first("spawned nvmf_tgt"))],
      ["new nvmf_tgt initialised", at(first("nvmf_tgt ready"))],
      ["first export repaired (agent log)", at(repaired[0])],
      ["last export repaired (agent log)", at(repaired[repaired.length - 1])],
      ["agent summarizes the replay, every export verified (agent log)", at(summary)],
      ...Object.entries(marks).map(([k, v]) => [`${k} (bench poll)`, v] as const),
    ] as const;

    // --- yardstick: the bare RPCs recovery must issue, through the same client, same data ---
    const stopAgent = agent;
    agent = undefined;
    stopAgent.kill("SIGTERM");
    await Promise.race([stopAgent.exited, Bun.sleep(15_000)]);
    stopAgent.kill("SIGKILL");
    await stopAgent.exited;
    await probe.close();
    probe = undefined;
    const y0 = performance.now();
    const tgt = await startTargetProcess({ socketPath: join(dir, "ys.sock"), dataDir, drive: DRIVE });
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
      if (check !== PARTITIONS) throw new Error(`yardstick left ${check}/${PARTITIONS} exports`);
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

    const met = recoveryS < TARGET_S;
    figures.push(
      {
        id: "recovery",
        label: `nvmf_tgt SIGKILL to all ${PARTITIONS} exports verified`,
        value: recoveryS,
        unit: "s",
        better: "lower",
        yardstick: {
          label: `bare RPCs re-creating ${PARTITIONS} exports, ${IN_FLIGHT} in flight`,
          value: yardstickS,
          unit: "s",
        },
        ratio: recoveryS / yardstickS,
        ratioLabel: "recovery / bare RPCs",
        target: { text: `< ${TARGET_S} s`, met },
      },
      {
        id: "initial-export",
        label: `initial export of ${PARTITIONS} placed partitions`,
        value: initialS,
        unit: "s",
        better: "lower",
      },
    );
    notes.push(
      `One agent process (production defaults: 4 partition workers, 60 s verify period) supervises the lab's nvmf_tgt emulator (DISTORT_NVMF_TGT); ${PARTITIONS} NVMePartitions of 4 MiB, written already placed on one claimed 64 GiB drive, exported over TCP.`,
      `Recovery ends when the bench's own poll (every ${POLL_MS} ms, nvmf_get_subsystems over a separate connection) sees all ${PARTITIONS} subsystems with namespace 1 and their listener on the new target, and every partition is Exported with Ready=True.`,
      `Partition statuses never left Ready during the outage (at most ${notReadySeen} seen not Ready while polling after the target was back); ${statusWrites} of ${PARTITIONS} partition objects were written during recovery; the agent logged "export repaired" for ${repairedNqns.size} distinct exports, ${summary ? `one restart summary (${summary.repaired} of ${summary.exports} exports repaired)` : "no restart summary"} and ${errors.length} warnings/errors.`,
      `Yardstick: after stopping the agent, a fresh emulator on the same drive data (its start, spawn to first answer, took ${fmt(startS)} s, not counted), then with lib/spdk's client: attach the drive, bdev_wait_for_examine (lvstore reload), create the TCP transport, and nvmf_create_subsystem + nvmf_subsystem_add_ns + nvmf_subsystem_add_listener per export, ${IN_FLIGHT} exports in flight.`,
    );
    profile.push(
      ...timeline.map(([k, v]) => `t+${fmt(v)} s: ${k}`),
      `per-export replay: ${repaired.length} "export repaired" log lines between t+${fmt(at(repaired[0]))} s and t+${fmt(at(repaired[repaired.length - 1]))} s (${fmt(repaired.length / Math.max(0.001, at(repaired[repaired.length - 1]) - at(repaired[0])))} exports/s); the bare RPCs ran at ${fmt(PARTITIONS / yardstickS)} exports/s.`,
      `status writes during recovery: ${statusWrites} partition objects changed.`,
      `CPU during recovery (kill to all Ready, ${fmt(recoveryS)} s): agent ${fmt(agentCpu)} s, new nvmf_tgt ${fmt(newTargetCpu)} s.`,
      `read costs with ${PARTITIONS} subsystems (median, sequential): nvmf_get_subsystems for one NQN ${fmt(readCosts.oneTyped)} ms; for all ${fmt(readCosts.allTyped)} ms through SpdkMethods (${fmt(readCosts.allRaw)} ms raw, without result validation). The agent lists all subsystems only to collect DH-CHAP keys (SpdkTarget.collectKeys): once per target incarnation, after a keyed host was revoked, and at most every 30 s otherwise; were it once per export, a replay of N exports would read O(N^2) subsystem records.`,
      ...(errors.length > 0
        ? [
            `agent warnings/errors after the kill (first 5 distinct): ${[...new Set(errors.map((l) => `${l.level}: ${l.msg}`))].slice(0, 5).join("; ")}`,
          ]
        : []),
    );
    if (!met) say("target missed; profile recorded");
  } finally {
    await probe?.close();
    if (agent) {
      agent.kill("SIGKILL");
      await agent.exited;
    }
    await cp.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  writeResult({ bench: "agent-recovery", figures, notes, profile });
}

if (import.meta.main) await main();
