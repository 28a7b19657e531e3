// `bun run lab`: builds what is missing (once, cached), starts the whole lab in the background
// (state in .lab/), walks a PVC and two Pods through it and prints the status table; the lab keeps
// running. `bun run lab -- down` stops it and removes every process, mount, loop device and socket
// it made, showing the machine before and after. `--once` brings the lab up, walks through, and
// takes it down again (what a smoke test wants).
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join, relative } from "node:path";
import { connect } from "../lib/kube/connection.ts";
import { ensureHelm } from "./cluster/helm-tool.ts";
import { ensureSidecars, ensureTools } from "./cluster/tools.ts";
import { runDemo } from "./demo.ts";
import { DEFAULT_CONSUMER_NODES, type Lab, startLab } from "./lab.ts";
import { type MachineState, machineState, stateDiff, sweepLab } from "./sweep.ts";

const ROOT = join(import.meta.dir, "..");
const DIR = join(ROOT, ".lab");
const STATE = join(DIR, "lab.json");
const BASELINE = join(DIR, "baseline.json");
const say = (s: string) => process.stdout.write(`${s}\n`);

/** What the background lab process publishes about itself. */
interface LabFile {
  pid: number;
  state: "starting" | "ready" | "failed" | "stopped";
  error?: string;
  kubeconfig?: string;
  nodes?: { name: string; kubeletRoot: string }[];
  readyMs?: number;
}

function readState(): LabFile | undefined {
  try {
    return JSON.parse(readFileSync(STATE, "utf8")) as LabFile;
  } catch {
    return undefined;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The background process: runs the lab until SIGTERM, then stops it and sweeps its mounts and loops. */
async function serve(): Promise<void> {
  const t0 = performance.now();
  const write = (s: Omit<LabFile, "pid">) => writeFileSync(STATE, JSON.stringify({ pid: process.pid, ...s }));
  write({ state: "starting" });
  let lab: Lab | undefined;
  let stopping = false;
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    say("stopping the lab");
    await lab?.stop().catch((err) => say(`stop: ${String(err)}`));
    const swept = await sweepLab(DIR);
    say(`swept: ${swept.killed} processes, ${swept.unmounted} mounts, ${swept.detached} loop devices`);
    write({ state: code === 0 ? "stopped" : "failed", ...(code === 0 ? {} : { error: "start failed" }) });
    process.exit(code);
  };
  process.on("SIGTERM", () => void stop(0));
  process.on("SIGINT", () => void stop(0));
  try {
    lab = await startLab({ dir: DIR, progress: say });
    const readyMs = Math.round(performance.now() - t0);
    write({
      state: "ready",
      kubeconfig: lab.kubeconfigPath,
      nodes: lab.consumers.map((c) => ({ name: c.name, kubeletRoot: c.kubeletRoot })),
      readyMs,
    });
    say(`lab ready in ${(readyMs / 1000).toFixed(1)} s`);
  } catch (err) {
    say(`lab failed: ${err instanceof Error ? err.message : String(err)}`);
    write({ state: "failed", error: err instanceof Error ? err.message : String(err) });
    await lab?.stop();
    await sweepLab(DIR);
    process.exit(1);
  }
}

/** Prints new lines of the background process's log until `until` says stop. */
async function followLog(path: string, until: () => boolean): Promise<void> {
  let offset = 0;
  for (;;) {
    const done = until();
    if (existsSync(path)) {
      const buf = readFileSync(path);
      if (buf.length > offset) {
        process.stdout.write(
          buf
            .subarray(offset)
            .toString()
            .replace(/^(?=.)/gm, "  "),
        );
        offset = buf.length;
      }
    }
    if (done) return;
    await Bun.sleep(200);
  }
}

function printState(title: string, s: MachineState): void {
  say(`${title}:`);
  say(`  loop devices (${s.loops.length}): ${s.loops.length ? "" : "none"}`);
  for (const l of s.loops) say(`    ${l}`);
  say(
    `  mounts: ${s.mounts.length} in total, ${s.mounts.filter((m) => m.startsWith(DIR)).length} under .lab`,
  );
  for (const m of s.mounts.filter((m) => m.startsWith(DIR))) say(`    ${m}`);
  say(`  lab processes (${s.labProcesses.length}): ${s.labProcesses.length ? "" : "none"}`);
  for (const p of s.labProcesses) say(`    ${p}`);
}

async function up(once: boolean): Promise<number> {
  const current = readState();
  if (current && alive(current.pid) && current.state !== "stopped") {
    say(`the lab is already running (pid ${current.pid}); \`bun run lab -- down\` stops it`);
    return 0;
  }
  if (existsSync(DIR)) {
    await sweepLab(DIR);
    rmSync(DIR, { recursive: true, force: true });
  }
  mkdirSync(join(DIR, "logs"), { recursive: true });
  const baseline = machineState(DIR);
  writeFileSync(BASELINE, JSON.stringify(baseline));
  const t0 = performance.now();
  say("== host packages (mkfs, losetup, parted...) and the tools (built once, then cached)");
  const deps = Bun.spawnSync(["bash", join(ROOT, "scripts/host-deps.sh")], {
    stdout: "inherit",
    stderr: "inherit",
  });
  if (deps.exitCode !== 0) {
    say("host packages are missing; see above");
    return 1;
  }
  await ensureTools();
  await ensureSidecars();
  await ensureHelm();
  const toolsMs = Math.round(performance.now() - t0);
  say(`   tools ready in ${(toolsMs / 1000).toFixed(1)} s`);

  say("== starting the lab in the background (logs in .lab/logs/)");
  const log = join(DIR, "logs", "lab.log");
  appendFileSync(log, "");
  const bg = Bun.spawn(["setsid", process.execPath, import.meta.path, "serve"], {
    cwd: ROOT,
    stdin: "ignore",
    stdout: Bun.file(log),
    stderr: Bun.file(log),
  });
  bg.unref();
  await followLog(log, () => {
    const s = readState();
    return (s?.state === "ready" || s?.state === "failed") && s.pid !== undefined;
  });
  const state = readState();
  if (state?.state !== "ready" || !state.kubeconfig) {
    say(`the lab did not start: ${state?.error ?? "unknown error"}; see .lab/logs/`);
    return 1;
  }
  const startMs = Math.round(performance.now() - t0);
  const bin = join(DIR, "bin");
  mkdirSync(bin, { recursive: true });
  symlinkSync((await ensureTools()).kubectl, join(bin, "kubectl"));

  say("\n== a PVC and two Pods: write on one node, read on the other");
  const conn = connect(state.kubeconfig);
  let code = 0;
  try {
    await runDemo({
      conn,
      nodes: state.nodes ?? DEFAULT_CONSUMER_NODES.map((name) => ({ name, kubeletRoot: "" })),
      say: (l) => say(`  ${l}`),
    });
  } catch (err) {
    say(`  walk-through failed: ${err instanceof Error ? err.message : String(err)}`);
    code = 1;
  }

  say("\n== status (bun run status)");
  const status = Bun.spawnSync(
    [process.execPath, join(ROOT, "cli/status.ts"), `--kubeconfig=${state.kubeconfig}`, "-A"],
    {
      cwd: ROOT,
    },
  );
  process.stdout.write(status.stdout.toString());
  process.stderr.write(status.stderr.toString());

  say(
    `\nlab up in ${(startMs / 1000).toFixed(1)} s (tools ${(toolsMs / 1000).toFixed(1)} s, components ${((state.readyMs ?? 0) / 1000).toFixed(1)} s)`,
  );
  if (once) {
    await down();
    return code;
  }
  const rel = relative(process.cwd(), DIR) || ".";
  say(`  export KUBECONFIG=$PWD/${join(rel, "cluster", "kubeconfig")} PATH=$PWD/${join(rel, "bin")}:$PATH`);
  say("  kubectl get pvc,pods -n demo; kubectl get distort -A; bun run status");
  say("  bun run lab -- down    # stops everything and removes what the lab made");
  return code;
}

async function down(): Promise<number> {
  if (!existsSync(DIR)) {
    say("no lab here (.lab does not exist)");
    return 0;
  }
  let baseline: MachineState | undefined;
  try {
    baseline = JSON.parse(readFileSync(BASELINE, "utf8")) as MachineState;
  } catch {}
  const before = machineState(DIR);
  printState("before down", before);
  const s = readState();
  if (s && alive(s.pid)) {
    process.kill(s.pid, "SIGTERM");
    const until = Date.now() + 60_000;
    while (alive(s.pid) && Date.now() < until) await Bun.sleep(100);
    if (alive(s.pid)) process.kill(s.pid, "SIGKILL");
  }
  await sweepLab(DIR);
  rmSync(DIR, { recursive: true, force: true });
  const after = machineState(DIR);
  printState("after down", after);
  if (baseline) {
    const diff = stateDiff(baseline, after).filter((l) => !l.includes("mounts:") || l.includes(DIR));
    if (diff.length === 0)
      say("the machine is as the lab found it: same loop devices, no mounts or processes of the lab");
    else {
      say("differences from before the lab started:");
      for (const d of diff) say(`  ${d}`);
      return 1;
    }
  }
  return 0;
}

const cmd = process.argv[2];
if (cmd === "serve") await serve();
else if (cmd === "down") process.exit(await down());
else if (cmd === undefined || cmd === "up" || cmd === "--once")
  process.exit(await up(process.argv.includes("--once")));
else {
  process.stderr.write("usage: bun run lab [-- --once | down]\n");
  process.exit(2);
}
