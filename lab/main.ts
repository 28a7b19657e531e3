// `bun run lab`: builds what is missing (once, cached), starts the real-cluster lab in the
// background (state in .lab/): a control plane and five real kubelet nodes with DISTORT installed
// by `helm install`; then walks a PVC and two Pods through it (written on one node, read on
// another) and prints the Pods and the status table; the lab keeps running. `bun run lab -- down`
// stops it and removes everything it made, listing the machine before and after. `--once` brings
// the lab up, walks through, and takes it down again (what a smoke test wants).
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
import { diffFootprints, type HostFootprint, labProcessOf, snapshotHost } from "./cluster/host-footprint.ts";
import { type RealLab, startRealLab, teardownLeftovers } from "./cluster/real-lab.ts";
import { ensureSidecars, ensureTools } from "./cluster/tools.ts";
import { runDemo } from "./demo.ts";

const ROOT = join(import.meta.dir, "..");
const DIR = join(ROOT, ".lab");
const STATE = join(DIR, "lab.json");
const BASELINE = join(DIR, "baseline.json");
const say = (s: string) => process.stdout.write(`${s}\n`);
/** The footprint of this lab: an integration test's control plane beside it is not the lab's. */
const footprint = () => snapshotHost({ processFilter: labProcessOf(DIR) });

/** What the background lab process publishes about itself. */
interface LabFile {
  pid: number;
  state: "starting" | "ready" | "failed" | "stopped";
  error?: string;
  kubeconfig?: string;
  nodes?: { name: string; holderPid: number }[];
  workloadImage?: string;
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

/** The background process: runs the lab until SIGTERM, then stops it. */
async function serve(): Promise<void> {
  const t0 = performance.now();
  const write = (s: Omit<LabFile, "pid">) => writeFileSync(STATE, JSON.stringify({ pid: process.pid, ...s }));
  write({ state: "starting" });
  let lab: RealLab | undefined;
  let stopping = false;
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    say("stopping the lab");
    await lab?.stop().catch((err) => say(`stop: ${String(err)}`));
    write({ state: code === 0 ? "stopped" : "failed", ...(code === 0 ? {} : { error: "start failed" }) });
    process.exit(code);
  };
  process.on("SIGTERM", () => void stop(0));
  process.on("SIGINT", () => void stop(0));
  try {
    lab = await startRealLab({ dir: DIR, progress: say });
    const readyMs = Math.round(performance.now() - t0);
    write({
      state: "ready",
      kubeconfig: lab.kubeconfigPath,
      nodes: lab.nodes.map((n) => ({ name: n.name, holderPid: n.holderPid })),
      ...(lab.images.images.workload ? { workloadImage: lab.images.images.workload.ref } : {}),
      readyMs,
    });
    say(`lab ready in ${(readyMs / 1000).toFixed(1)} s`);
  } catch (err) {
    say(`lab failed: ${err instanceof Error ? err.message : String(err)}`);
    write({ state: "failed", error: err instanceof Error ? err.message : String(err) });
    await lab?.stop();
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

function kubectl(kubeconfig: string, args: string[]): string {
  const p = Bun.spawnSync([join(DIR, "bin", "kubectl"), `--kubeconfig=${kubeconfig}`, ...args]);
  return p.stdout.toString() + p.stderr.toString();
}

async function up(once: boolean): Promise<number> {
  const current = readState();
  if (current && alive(current.pid) && current.state !== "stopped") {
    say(`the lab is already running (pid ${current.pid}); \`bun run lab -- down\` stops it`);
    return 0;
  }
  if (existsSync(DIR)) {
    await teardownLeftovers(DIR);
    rmSync(DIR, { recursive: true, force: true });
  }
  mkdirSync(join(DIR, "logs"), { recursive: true });
  writeFileSync(BASELINE, JSON.stringify(footprint()));
  const t0 = performance.now();
  say(
    "== host packages (containerd, runc, CNI, buildah, mmdebstrap, mkfs...) and the tools (built once, then cached)",
  );
  const deps = Bun.spawnSync(["bash", join(ROOT, "scripts/host-deps.sh")], {
    stdout: "inherit",
    stderr: "inherit",
  });
  if (deps.exitCode !== 0) {
    say("host packages are missing; see above");
    return 1;
  }
  const tools = await ensureTools();
  await ensureSidecars();
  await ensureHelm();
  const toolsMs = Math.round(performance.now() - t0);
  say(`   tools ready in ${(toolsMs / 1000).toFixed(1)} s`);
  const bin = join(DIR, "bin");
  mkdirSync(bin, { recursive: true });
  symlinkSync(tools.kubectl, join(bin, "kubectl"));

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
  if (state?.state !== "ready" || !state.kubeconfig || !state.workloadImage) {
    say(`the lab did not start: ${state?.error ?? "no workload image"}; see .lab/logs/`);
    return 1;
  }
  const startMs = Math.round(performance.now() - t0);

  say("\n== a PVC and two Pods: write on one node, read on another");
  const conn = connect(state.kubeconfig);
  let code = 0;
  const nodes = state.nodes ?? [];
  const consumer = (name: string) => {
    const n = nodes.find((x) => x.name === name);
    if (!n) throw new Error(`the lab has no node ${name}`);
    return {
      name,
      kubeletRoot: "/var/lib/kubelet",
      mountinfo: () => readFileSync(`/proc/${n.holderPid}/mountinfo`, "utf8"),
    };
  };
  try {
    await runDemo({
      conn,
      nodes: [consumer("node-c"), consumer("node-b")],
      say: (l) => say(`  ${l}`),
      image: state.workloadImage,
      timeoutMs: 240_000,
    });
  } catch (err) {
    say(`  walk-through failed: ${err instanceof Error ? err.message : String(err)}`);
    code = 1;
  }

  say("\n== kubectl get pods -A -o wide");
  process.stdout.write(kubectl(state.kubeconfig, ["get", "pods", "-A", "-o", "wide"]));
  say("\n== status (bun run status)");
  const status = Bun.spawnSync(
    [process.execPath, join(ROOT, "cli/status.ts"), `--kubeconfig=${state.kubeconfig}`, "-A"],
    { cwd: ROOT },
  );
  process.stdout.write(status.stdout.toString());
  process.stderr.write(status.stderr.toString());

  say(
    `\nlab up in ${(startMs / 1000).toFixed(1)} s (tools ${(toolsMs / 1000).toFixed(1)} s, cluster and install ${((state.readyMs ?? 0) / 1000).toFixed(1)} s)`,
  );
  if (once) return (await down()) || code;
  const rel = relative(process.cwd(), DIR) || ".";
  say(`  export KUBECONFIG=$PWD/${join(rel, "cluster", "kubeconfig")} PATH=$PWD/${join(rel, "bin")}:$PATH`);
  say("  kubectl get pods -A -o wide; kubectl get pvc,pods -n demo; kubectl get distort -A; bun run status");
  say("  bun run lab -- down    # stops everything and removes what the lab made");
  return code;
}

function printFootprint(title: string, f: HostFootprint, baseline: HostFootprint | undefined): void {
  say(`${title}:`);
  const lines = baseline ? diffFootprints(baseline, f) : [];
  say(`  ${lines.length === 0 ? "nothing of the lab" : `${lines.length} differences from before the lab:`}`);
  for (const l of lines.slice(0, 200)) say(`    ${l}`);
  if (lines.length > 200) say(`    ... and ${lines.length - 200} more`);
}

async function down(): Promise<number> {
  if (!existsSync(DIR)) {
    say("no lab here (.lab does not exist)");
    return 0;
  }
  let baseline: HostFootprint | undefined;
  try {
    baseline = JSON.parse(readFileSync(BASELINE, "utf8")) as HostFootprint;
  } catch {}
  printFootprint("before down", footprint(), baseline);
  const s = readState();
  if (s && alive(s.pid)) {
    process.kill(s.pid, "SIGTERM");
    const until = Date.now() + 120_000;
    while (alive(s.pid) && Date.now() < until) await Bun.sleep(200);
    if (alive(s.pid)) process.kill(s.pid, "SIGKILL");
  }
  // Whatever a crashed lab left (its records are in .lab): nodes, network, mounts, loop devices.
  await teardownLeftovers(DIR);
  rmSync(DIR, { recursive: true, force: true });
  const after = footprint();
  printFootprint("after down", after, baseline);
  if (baseline && diffFootprints(baseline, after).length > 0) return 1;
  say("the machine is as the lab found it");
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
