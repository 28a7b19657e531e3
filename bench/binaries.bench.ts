// Start-up time and idle memory of each compiled binary (agent, manager, csi, dpu): each is built
// with `bun build --compile`, started with a minimal valid configuration against a real control
// plane and emulated SPDK/SNAP sockets, timed to readiness, and its RSS read after 5 s idle.
// Yardstick (same run, interleaved): a compiled hello-world. Run: bun bench/binaries.bench.ts [rounds]
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { freePort, startControlPlane } from "../lab/cluster/control-plane.ts";
import { installCrds } from "../lab/cluster/crds.ts";
import { startSimStorageNode } from "../lab/harness/storage-node.ts";
import { startSpdkEmulator } from "../lab/sim/spdk/emulator.ts";
import { connect } from "../lib/kube/connection.ts";
import { type Figure, fmt, median, writeResult } from "./report.ts";

const ROUNDS = Number(process.argv[2] ?? 3);
const IDLE_MS = 5000;
const POLL_MS = 10;
const READY_TIMEOUT_MS = 60_000;
const MiB = 2 ** 20;
const ROOT = join(import.meta.dir, "..");
const say = (s: string) => process.stdout.write(`${s}\n`);

interface Binary {
  name: string;
  /** The entry point, relative to the repository. */
  entry: string;
  /** How readiness shows, for the notes. */
  readiness: string;
  /** A log message that must also have appeared (at info level) before the binary counts as ready. */
  readyLog?: string;
  /** argv after the program, and environment, for the n-th start (fresh sockets and leases). */
  config(n: number, healthPort: number): { args: string[]; env: Record<string, string> };
}

interface Sample {
  healthMs: number;
  readyMs: number;
  rssMiB: number;
}

/** VmRSS of `pid` in MiB, from /proc/<pid>/status; NaN when unreadable. */
function rssMiB(pid: number): number {
  try {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) / 1024 : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

async function answers(url: string): Promise<boolean> {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(1000) });
    await r.arrayBuffer();
    return r.status === 200;
  } catch {
    return false;
  }
}

/**
 * Starts `argv`, measures time to /healthz and /readyz answering 200 and, with `readyLog`, to
 * that message in its stderr log (without a health port: to the first stdout line), waits
 * IDLE_MS, reads RSS, and stops it (SIGTERM, then SIGKILL).
 */
async function startOnce(
  argv: string[],
  env: Record<string, string>,
  healthPort: number | undefined,
  readyLog?: string,
): Promise<Sample> {
  const t0 = performance.now();
  const p = Bun.spawn(argv, { cwd: ROOT, env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  let errText = "";
  void (async () => {
    const dec = new TextDecoder();
    for await (const chunk of p.stderr) errText += dec.decode(chunk, { stream: true });
  })();
  let healthMs: number;
  let readyMs: number;
  try {
    if (healthPort === undefined) {
      const reader = p.stdout.getReader();
      const { value } = await reader.read();
      if (!value) throw new Error(`${argv.join(" ")} printed nothing`);
      healthMs = readyMs = performance.now() - t0;
      reader.releaseLock();
    } else {
      void new Response(p.stdout).text();
      const base = `http://127.0.0.1:${healthPort}`;
      const deadline = t0 + READY_TIMEOUT_MS;
      const waitFor = async (path: string): Promise<number> => {
        for (;;) {
          if (p.exitCode !== null)
            throw new Error(`${argv.join(" ")} exited with ${p.exitCode}: ${errText.slice(-500)}`);
          if (await answers(`${base}${path}`)) return performance.now() - t0;
          if (performance.now() > deadline)
            throw new Error(`${argv.join(" ")}: ${path} not answering after ${READY_TIMEOUT_MS} ms`);
          await Bun.sleep(POLL_MS);
        }
      };
      healthMs = await waitFor("/healthz");
      readyMs = await waitFor("/readyz");
      while (readyLog !== undefined && !errText.includes(`"msg":"${readyLog}"`)) {
        if (p.exitCode !== null) throw new Error(`${argv.join(" ")} exited with ${p.exitCode}`);
        if (performance.now() > deadline) throw new Error(`${argv.join(" ")}: no "${readyLog}" log line`);
        await Bun.sleep(POLL_MS);
        readyMs = performance.now() - t0;
      }
    }
    await Bun.sleep(IDLE_MS);
    const rss = rssMiB(p.pid);
    if (p.exitCode !== null) throw new Error(`${argv.join(" ")} exited with ${p.exitCode} while idle`);
    return { healthMs, readyMs, rssMiB: rss };
  } finally {
    p.kill("SIGTERM");
    await Promise.race([p.exited, Bun.sleep(10_000)]);
    p.kill("SIGKILL");
    await p.exited;
  }
}

async function build(entry: string, out: string): Promise<number> {
  const t0 = performance.now();
  const p = Bun.spawn([process.execPath, "build", "--compile", resolve(ROOT, entry), "--outfile", out], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  const [o, e, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  if (code !== 0) throw new Error(`bun build --compile ${entry} failed: ${(e || o).slice(-800)}`);
  return (performance.now() - t0) / 1000;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "distort-binaries-bench-"));
  const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
  const node = await startSimStorageNode({
    nodeName: "bench-node",
    drives: [{ serial: "SIMD0001", pciAddress: "0000:5e:00.0", sizeBytes: 8 * 2 ** 30 }],
  });
  const snap = await startSpdkEmulator({ socketPath: join(dir, "snap.sock"), dataDir: join(dir, "snap") });
  const figures: Figure[] = [];
  const notes: string[] = [];
  try {
    const conn = connect(cp.kubeconfigPath);
    await installCrds(conn);
    const ns = `binaries-${Date.now().toString(36)}`;
    await conn.api(k8s.CoreV1Api).createNamespace({ body: { metadata: { name: ns } } });
    const base = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/root" };
    const hello = join(dir, "hello.ts");
    writeFileSync(hello, 'console.log("hello");\nsetInterval(() => {}, 1 << 30);\n');

    const binaries: Binary[] = [
      {
        name: "agent",
        entry: "agent/main.ts",
        readiness: "/readyz 200 once its partition, attachment and snapshot caches have synced",
        config: (_n, port) => ({
          args: [],
          env: {
            ...node.agentEnv(cp.kubeconfigPath, ns, {
              DISTORT_HEALTH_PORT: String(port),
              DISTORT_LOG_LEVEL: "warn",
              DISTORT_REPORT_PERIOD_MS: "30000",
              DISTORT_VERIFY_PERIOD_MS: "60000",
            }),
          },
        }),
      },
      {
        name: "manager",
        entry: "manager/main.ts",
        readiness:
          'its "controllers running" log line: it took a fresh Lease and its controllers\' caches synced (its /readyz answers 200 already as a standby)',
        readyLog: "controllers running",
        config: (n, port) => ({
          args: [],
          env: {
            ...base,
            DISTORT_KUBECONFIG: cp.kubeconfigPath,
            DISTORT_NAMESPACE: ns,
            DISTORT_IDENTITY: `bench-${n}`,
            DISTORT_LEASE_NAME: `bench-manager-${n}`,
            DISTORT_HEALTH_HOST: "127.0.0.1",
            DISTORT_HEALTH_PORT: String(port),
            DISTORT_LOG_LEVEL: "info",
          },
        }),
      },
      {
        name: "csi",
        entry: "csi/main.ts",
        readiness: "/readyz 200 once the controller's caches have synced (controller mode)",
        config: (n, port) => ({
          args: [
            "--mode=controller",
            `--endpoint=unix://${join(dir, `csi-${n}.sock`)}`,
            `--kubeconfig=${cp.kubeconfigPath}`,
            `--namespace=${ns}`,
            "--health-host=127.0.0.1",
            `--health-port=${port}`,
            "--log-level=warn",
          ],
          env: base,
        }),
      },
      {
        name: "dpu",
        entry: "dpu/main.ts",
        readiness:
          "/readyz 200 once SNAP (an emulated SPDK socket) has answered; no Kubernetes access configured",
        config: (n, port) => {
          const d = join(dir, `dpu-${n}`);
          mkdirSync(d, { recursive: true });
          return {
            args: [],
            env: {
              ...base,
              DISTORT_DPU_SOCKET: join(d, "dpu.sock"),
              DISTORT_DPU_SNAP_SOCKET: snap.socketPath,
              DISTORT_DPU_HOST_NQN: "nqn.2014-08.org.nvmexpress:uuid:0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9",
              DISTORT_DPU_STATE_DIR: join(d, "state"),
              DISTORT_DPU_KEY_DIR: join(d, "keys"),
              DISTORT_DPU_MOUNT_ROOT: join(d, "mnt"),
              DISTORT_HEALTH_HOST: "127.0.0.1",
              DISTORT_HEALTH_PORT: String(port),
              DISTORT_LOG_LEVEL: "warn",
            },
          };
        },
      },
    ];

    say("building with bun build --compile");
    const sizes = new Map<string, number>();
    const buildS = new Map<string, number>();
    for (const b of [
      ...binaries.map((x) => ({ name: x.name, entry: x.entry })),
      { name: "hello", entry: hello },
    ]) {
      const out = join(dir, "bin", b.name);
      buildS.set(b.name, await build(b.entry, out));
      sizes.set(b.name, statSync(out).size / MiB);
      say(`  ${b.name}: ${fmt(sizes.get(b.name) as number)} MiB in ${fmt(buildS.get(b.name) as number)} s`);
    }

    const samples = new Map<string, Sample[]>();
    const add = (k: string, s: Sample) => samples.set(k, [...(samples.get(k) ?? []), s]);
    let n = 0;
    for (let round = 1; round <= ROUNDS; round++) {
      say(`round ${round}/${ROUNDS}`);
      // The yardstick runs between the others in every round, so drift on a noisy machine hits all alike.
      for (const variant of ["compiled", "bun"] as const) {
        add(
          `hello/${variant}`,
          await startOnce(
            variant === "compiled" ? [join(dir, "bin", "hello")] : [process.execPath, hello],
            base,
            undefined,
          ),
        );
        for (const b of binaries) {
          const port = await freePort();
          const c = b.config(++n, port);
          const argv =
            variant === "compiled"
              ? [join(dir, "bin", b.name), ...c.args]
              : [process.execPath, join(ROOT, b.entry), ...c.args];
          const s = await startOnce(argv, c.env, port, b.readyLog);
          add(`${b.name}/${variant}`, s);
          say(
            `  ${`${b.name} (${variant})`.padEnd(20)} healthz ${fmt(s.healthMs)} ms, ready ${fmt(s.readyMs)} ms, RSS after ${IDLE_MS / 1000} s idle ${fmt(s.rssMiB)} MiB`,
          );
        }
      }
    }

    const med = (k: string, f: keyof Sample) => median((samples.get(k) ?? []).map((s) => s[f]));
    const helloReady = med("hello/compiled", "readyMs");
    const helloRss = med("hello/compiled", "rssMiB");
    const helloSize = sizes.get("hello") as number;
    for (const b of binaries) {
      const ready = med(`${b.name}/compiled`, "readyMs");
      const rss = med(`${b.name}/compiled`, "rssMiB");
      const size = sizes.get(b.name) as number;
      figures.push(
        {
          id: `${b.name}-ready`,
          label: `${b.name}: start to ready (compiled)`,
          value: ready,
          unit: "ms",
          better: "lower",
          yardstick: { label: "compiled hello-world, start to first line", value: helloReady, unit: "ms" },
          ratio: ready / helloReady,
          ratioLabel: `${b.name} / hello`,
        },
        {
          id: `${b.name}-rss`,
          label: `${b.name}: RSS after ${IDLE_MS / 1000} s idle (compiled)`,
          value: rss,
          unit: "MiB",
          better: "lower",
          yardstick: { label: "compiled hello-world", value: helloRss, unit: "MiB" },
          ratio: rss / helloRss,
          ratioLabel: `${b.name} / hello`,
        },
        {
          id: `${b.name}-size`,
          label: `${b.name}: binary size`,
          value: size,
          unit: "MiB",
          better: "lower",
          yardstick: { label: "compiled hello-world", value: helloSize, unit: "MiB" },
          ratio: size / helloSize,
          ratioLabel: `${b.name} / hello`,
        },
      );
    }
    notes.push(
      `Medians of ${ROUNDS} rounds; each round starts hello-world, then every binary, compiled first and then with \`bun <entry>.ts\`. Start to ready: spawn until /readyz answers 200 (polled every ${POLL_MS} ms), for the manager until it runs its controllers; RSS: VmRSS from /proc/<pid>/status ${IDLE_MS / 1000} s after ready.`,
      ...binaries.map(
        (b) =>
          `${b.name}: ready = ${b.readiness}; /healthz first answered after ${fmt(med(`${b.name}/compiled`, "healthMs"))} ms compiled. Uncompiled (\`bun ${b.entry}\`): ready ${fmt(med(`${b.name}/bun`, "readyMs"))} ms, RSS ${fmt(med(`${b.name}/bun`, "rssMiB"))} MiB. Build took ${fmt(buildS.get(b.name) as number)} s.`,
      ),
      `hello-world uncompiled (\`bun hello.ts\`): first line after ${fmt(med("hello/bun", "readyMs"))} ms, RSS ${fmt(med("hello/bun", "rssMiB"))} MiB.`,
      "The agent runs against the lab's simulated storage node (an in-process nvmf_tgt emulator and a simulated sysfs), the dpu plugin against an in-process emulated SNAP socket; manager and csi against the real control plane.",
    );
  } finally {
    await snap.close();
    await node.close();
    await cp.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  writeResult({ bench: "binaries", figures, notes });
}

if (import.meta.main) await main();
