// Agent memory and watches at 2000 volumes: one agent process (emulated nvmf_tgt) on a real control
// plane serves N placed partitions, each with an attachment; its RSS, live JS heap and the watches it
// holds open are measured once all are Exported and AccessReady. Yardstick: the objects' JSON size.
// Run: bun bench/agent-memory.bench.ts [partitions] [--agent path/to/agent/main.ts]
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { claimDevice, createPlaced, placedPartition } from "../lab/harness/storage-node.ts";
import { connect } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { attachmentNameFor } from "../lib/volume-identity.ts";
import { apiServerSamples, type Sample, sumBy, total } from "./apiserver-metrics.ts";
import type { HeapSample } from "./heap-probe.ts";
import { pool } from "./proc-stats.ts";
import { type Figure, fmt, writeResult } from "./report.ts";
import { simAgentEnv } from "./sim-agent-env.ts";

const args = process.argv.slice(2);
const agentFlag = args.indexOf("--agent");
const ROOT = join(import.meta.dir, "..");
/** Another checkout's agent can be measured with the same bench (before/after a change). */
const AGENT = agentFlag >= 0 ? (args[agentFlag + 1] as string) : join(ROOT, "agent", "main.ts");
const PARTITIONS = Number(args.find((a, i) => /^\d+$/.test(a) && args[i - 1] !== "--agent") ?? 2000);
const RSS_TARGET_MIB = 120;
const MiB = 2 ** 20;
const GROUP = "storage.distort.io";
const DRIVE = { pciAddress: "0000:5e:00.0", serial: "SIMM0001", sizeBytes: 64 * 2 ** 30 };
const PROBE = join(import.meta.dir, "heap-probe.ts");
const HOST = "nqn.2014-08.org.nvmexpress:uuid:6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const say = (s: string) => process.stdout.write(`${s}\n`);

async function until<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await Bun.sleep(500);
  }
}

/** The agent's live heap and RSS, from the preloaded probe (SIGUSR2, full GCs, then a file). */
async function heapOf(agent: Subprocess, file: string): Promise<HeapSample> {
  rmSync(file, { force: true });
  const asked = Date.now();
  agent.kill("SIGUSR2");
  return until("the heap probe", 30_000, async () => {
    try {
      const s = JSON.parse(readFileSync(file, "utf8")) as HeapSample;
      return s.at >= asked ? s : undefined;
    } catch {
      return undefined;
    }
  });
}

/** VmRSS and VmHWM (peak) of `pid`, bytes. */
function rssOf(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (k: string) =>
    Number(new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? Number.NaN) * 1024;
  return { rss: kb("VmRSS"), peak: kb("VmHWM") };
}

/** Watches open now on DISTORT's kinds, by resource. Only the agent watches in this run. */
function openWatches(samples: readonly Sample[]): Map<string, number> {
  return sumBy(samples, "apiserver_longrunning_requests", { group: GROUP, verb: "WATCH" }, "resource");
}

function counter(samples: readonly Sample[], name: string, where: Record<string, string>): number {
  return total(sumBy(samples, name, where));
}

function isExported(p: NVMePartition): boolean {
  return (
    p.status?.state === "Exported" &&
    (p.status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True")
  );
}

function isAccessReady(a: NVMeVolumeAttachment): boolean {
  return (a.status?.conditions ?? []).some((c) => c.type === "AccessReady" && c.status === "True");
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "distort-agent-memory-"));
  const figures: Figure[] = [];
  const notes: string[] = [];
  const profile: string[] = [];
  const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
  let agent: Subprocess<"ignore", "ignore", "inherit"> | undefined;
  try {
    const conn = connect(cp.kubeconfigPath);
    await installCrds(conn);
    const ns = `agent-mem-${Date.now().toString(36)}`;
    await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name: ns } } });
    const heapFile = join(dir, "heap.json");
    const { env } = await simAgentEnv({
      dir,
      kubeconfigPath: cp.kubeconfigPath,
      namespace: ns,
      drive: DRIVE,
      logLevel: "warn",
    });
    agent = Bun.spawn([process.execPath, "--preload", PROBE, AGENT], {
      env: { ...env, HEAP_PROBE_FILE: heapFile },
      stdin: "ignore",
      stdout: "ignore",
      stderr: "inherit",
    });
    const running = agent;
    const alive = () => {
      if (running.exitCode !== null) throw new Error(`agent exited with ${running.exitCode}`);
    };
    const devices = new ResourceClient(conn, kinds.NVMeDevice);
    const parts = new ResourceClient(conn, kinds.NVMePartition);
    const atts = new ResourceClient(conn, kinds.NVMeVolumeAttachment);
    const device = await until("the agent to report its drive", 60_000, async () => {
      alive();
      return (await devices.list()).items.find((d: NVMeDevice) => d.spec.serial === DRIVE.serial);
    });
    const claim = await claimDevice(conn, device, ns);
    await Bun.sleep(3000);
    const idleHeap = await heapOf(running, heapFile);
    const idleRss = rssOf(running.pid).rss;
    say(
      `agent up with its drive claimed: RSS ${fmt(idleRss / MiB)} MiB, heap ${fmt(idleHeap.heapUsedBytes / MiB)} MiB`,
    );

    say(`creating ${PARTITIONS} placed partitions of 4 MiB, each with an attachment`);
    const t0 = performance.now();
    await pool([...Array(PARTITIONS).keys()], 32, async (i) => {
      const p = await createPlaced(conn, placedPartition(`p${i}`, ns, device, claim, 4 * MiB), device);
      await atts.create({
        apiVersion: `${GROUP}/v1alpha1`,
        kind: "NVMeVolumeAttachment",
        // The name ControllerPublish derives: the agent admits hosts only from that record.
        metadata: { name: attachmentNameFor(p.metadata.name, p.metadata.uid as string), namespace: ns },
        spec: {
          partitionName: p.metadata.name,
          partitionUID: p.metadata.uid as string,
          nodeId: "worker-1",
          hostNQN: HOST,
          attachmentId: `att-${i}`,
        },
      } as NVMeVolumeAttachment);
    });
    let lastPrint = 0;
    await until(`${PARTITIONS} exported and attached`, 30 * 60_000, async () => {
      alive();
      const ready = (await parts.list({ namespace: ns })).items.filter(isExported).length;
      const granted = (await atts.list({ namespace: ns })).items.filter(isAccessReady).length;
      if (performance.now() - lastPrint > 10_000) {
        lastPrint = performance.now();
        say(`  ${fmt((performance.now() - t0) / 1000)} s: ${ready} exported, ${granted} attached`);
      }
      return ready === PARTITIONS && granted === PARTITIONS ? true : undefined;
    });
    const settleS = (performance.now() - t0) / 1000;
    say(`all ${PARTITIONS} exported and attached after ${fmt(settleS)} s`);

    // Quiet for a few seconds (nothing left to reconcile), then measure.
    await Bun.sleep(5000);
    const samples = await apiServerSamples(cp.server, cp.token, cp.caPem);
    const watches = openWatches(samples);
    const heap = await heapOf(running, heapFile);
    const { rss, peak } = rssOf(running.pid);
    const lists = sumBy(samples, "apiserver_request_total", { group: GROUP, verb: "LIST" }, "resource");
    const events = sumBy(samples, "apiserver_watch_events_total", { group: GROUP }, "resource");
    const eventBytes = counter(samples, "apiserver_watch_events_sizes_sum", { group: GROUP });
    // Yardstick: what the agent is asked to hold, as the API server serves it.
    const partJson = JSON.stringify((await parts.list({ namespace: ns })).items).length;
    const attJson = JSON.stringify((await atts.list({ namespace: ns })).items).length;
    const objectsJson = partJson + attJson;
    const heapGrowth = heap.heapUsedBytes - idleHeap.heapUsedBytes;
    const watchCount = total(watches);
    const kindsWatched = watches.size;

    figures.push(
      {
        id: "agent-rss",
        label: `agent RSS with ${PARTITIONS} exported partitions + attachments`,
        value: rss / MiB,
        unit: "MiB",
        better: "lower",
        yardstick: {
          label: "agent RSS idle, drive claimed, no partitions",
          value: idleRss / MiB,
          unit: "MiB",
        },
        ratio: rss / idleRss,
        ratioLabel: "loaded / idle",
        target: { text: `< ${RSS_TARGET_MIB} MiB`, met: rss / MiB < RSS_TARGET_MIB },
      },
      {
        id: "agent-heap",
        label: `agent live JS heap growth for ${PARTITIONS} partitions + attachments`,
        value: heapGrowth / MiB,
        unit: "MiB",
        better: "lower",
        yardstick: { label: "their JSON as the API server lists it", value: objectsJson / MiB, unit: "MiB" },
        ratio: heapGrowth / objectsJson,
        ratioLabel: "heap growth / JSON",
      },
      {
        id: "agent-watches",
        label: "watches the agent holds open on DISTORT kinds",
        value: watchCount,
        unit: "watches",
        better: "lower",
        yardstick: { label: "kinds it watches", value: kindsWatched, unit: "kinds" },
        ratio: watchCount / Math.max(1, kindsWatched),
        ratioLabel: "watches / kind",
        target: { text: "1 per kind", met: watchCount === kindsWatched },
      },
      {
        id: "agent-watch-events",
        label: `watch events the API server sent for the run (${PARTITIONS} partitions + attachments)`,
        value: total(events),
        unit: "events",
        better: "lower",
      },
    );
    notes.push(
      `One agent process (production defaults) supervising the lab's nvmf_tgt emulator; ${PARTITIONS} NVMePartitions of 4 MiB written already placed on its one claimed drive, each with one NVMeVolumeAttachment (${fmt(settleS)} s until all Exported and AccessReady). Agent: ${AGENT === join(ROOT, "agent", "main.ts") ? "this tree" : AGENT}.`,
      `Memory: RSS from /proc (VmRSS), live JS heap from a probe preloaded into the agent (bench/heap-probe.ts: full GCs, then process.memoryUsage().heapUsed), 5 s after the last object settled; idle = after the drive was reported and claimed, before any partition.`,
      `Watches: the kube-apiserver's apiserver_longrunning_requests{verb="WATCH",group="${GROUP}"} (only the agent watches in this run).`,
    );
    profile.push(
      `open watches by resource: ${[...watches].map(([k, v]) => `${k} ${v}`).join(", ")}`,
      `LIST requests by resource (whole run, bench included): ${[...lists].map(([k, v]) => `${k} ${v}`).join(", ")}`,
      `watch events sent by resource: ${[...events].map(([k, v]) => `${k} ${v}`).join(", ")}; ${fmt(eventBytes / MiB)} MiB of event bytes`,
      `heap: idle ${fmt(idleHeap.heapUsedBytes / MiB)} MiB, loaded ${fmt(heap.heapUsedBytes / MiB)} MiB (${heap.objectCount} objects, engine heap ${fmt(heap.heapSizeBytes / MiB)} MiB); ${fmt(heapGrowth / (2 * PARTITIONS))} B per cached object; JSON ${fmt(partJson / PARTITIONS)} B per partition, ${fmt(attJson / PARTITIONS)} B per attachment`,
      `RSS: idle ${fmt(idleRss / MiB)} MiB, loaded ${fmt(rss / MiB)} MiB, peak ${fmt(peak / MiB)} MiB`,
    );
  } finally {
    if (agent) {
      agent.kill("SIGTERM");
      await Promise.race([agent.exited, Bun.sleep(15_000)]);
      agent.kill("SIGKILL");
      await agent.exited;
    }
    await cp.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  writeResult({ bench: "agent-memory", figures, notes, profile });
}

if (import.meta.main) await main();
