// NvmfTgtSupervisor with real processes: the lab's nvmf_tgt emulator CLI as the target binary,
// real unix sockets, Bun.spawn under setpriv, /proc checked for strays and zombies.

import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { realClock } from "../clock.ts";
import type { StorageError } from "../errors.ts";
import { hostFs } from "../fs.ts";
import { silentLogger } from "../log.ts";
import { SpdkClient } from "./client.ts";
import { SpdkMethods } from "./methods.ts";
import { bunProcessRunner, findSetpriv, hostSocketFiles, procInspector } from "./process-runner.ts";
import { NvmfTgtSupervisor, type NvmfTgtSupervisorOptions } from "./supervisor.ts";

const BUN = process.execPath;
const EMULATOR = new URL("../../lab/sim/spdk/nvmf-tgt.ts", import.meta.url).pathname;
const SUPERVISOR = new URL("./supervisor.ts", import.meta.url).pathname;
const SETPRIV = findSetpriv();

let root: string;
let seq = 0;
const supervisors: NvmfTgtSupervisor[] = [];
const strays: Array<ReturnType<typeof Bun.spawn>> = [];
/** Pids that are not our children (a failed pdeathsig test would leave one). */
const strayPids: number[] = [];
const figures: Record<string, number> = {};

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "distort-supervisor-"));
});

afterEach(async () => {
  for (const s of supervisors.splice(0)) await s.stop();
  for (const p of strays.splice(0)) {
    p.kill("SIGKILL");
    await p.exited;
  }
  for (const pid of strayPids.splice(0)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // Gone, as it should be.
    }
  }
});

afterAll(() => {
  rmSync(root, { recursive: true, force: true });
  process.stderr.write(`nvmf_tgt supervisor figures (ms): ${JSON.stringify(figures)}\n`);
});

/** A fresh socket path and data directory. */
function place(): { sock: string; data: string } {
  const n = ++seq;
  return { sock: join(root, `tgt-${n}.sock`), data: join(root, `data-${n}`) };
}

function supervisor(
  at: { sock: string; data: string },
  over: Partial<NvmfTgtSupervisorOptions> = {},
): NvmfTgtSupervisor {
  const s = new NvmfTgtSupervisor({
    command: [BUN, EMULATOR],
    socketPath: at.sock,
    coreMask: "0x3",
    extraArgs: ["--sim-data-dir", at.data],
    openClient: () => new SpdkClient({ socketPath: at.sock, logger: silentLogger, callTimeoutMs: 5000 }),
    runner: bunProcessRunner({ setprivPath: SETPRIV }),
    inspector: procInspector(hostFs("/")),
    sockets: hostSocketFiles(),
    clock: realClock,
    logger: silentLogger,
    readyTimeoutMs: 10_000,
    readinessPollMs: 20,
    pingTimeoutMs: 1000,
    stopGraceMs: 2000,
    ...over,
  });
  supervisors.push(s);
  return s;
}

/** Processes whose command line mentions `needle`, with their /proc state letter (Z = zombie). */
function processesMentioning(needle: string): { pid: number; state: string }[] {
  const out: { pid: number; state: string }[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const cmdline = readFileSync(`/proc/${name}/cmdline`, "utf8");
      if (!cmdline.includes(needle)) continue;
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      out.push({
        pid: Number(name),
        state: stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3),
      });
    } catch {
      // Exited while we looked.
    }
  }
  return out;
}

/** Waits up to `ms` for no process (not even a zombie) to mention `needle`. */
async function expectNoProcess(needle: string, ms = 3000): Promise<void> {
  const until = Date.now() + ms;
  while (processesMentioning(needle).length > 0 && Date.now() < until) await Bun.sleep(20);
  expect(processesMentioning(needle)).toEqual([]);
}

async function waitFor(cond: () => boolean, ms: number, what: string): Promise<void> {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await Bun.sleep(5);
  }
}

/** Starts an emulator outside any supervisor and waits for an RPC round trip. */
async function foreignTarget(at: { sock: string; data: string }, mask: string, waitForRpc = false) {
  const argv = [BUN, EMULATOR, "-m", mask, "-r", at.sock, "--sim-data-dir", at.data];
  if (waitForRpc) argv.push("--wait-for-rpc");
  const proc = Bun.spawn(argv, { stdin: "ignore", stdout: "ignore", stderr: "ignore" });
  strays.push(proc);
  const until = Date.now() + 10_000;
  for (;;) {
    const c = new SpdkClient({ socketPath: at.sock, logger: silentLogger, callTimeoutMs: 500 });
    try {
      await c.call("spdk_get_version");
      return { proc, client: c };
    } catch {
      await c.close();
      if (Date.now() > until) throw new Error("foreign emulator did not answer");
      await Bun.sleep(20);
    }
  }
}

async function reactorLcores(sock: string): Promise<number[]> {
  const c = new SpdkClient({ socketPath: sock, logger: silentLogger });
  try {
    const r = await new SpdkMethods(c).frameworkGetReactors();
    return r.reactors.map((x) => x.lcore);
  } finally {
    await c.close();
  }
}

describe("with the nvmf_tgt emulator", () => {
  test("cold start: spawned under setpriv, initialised, answering with the configured reactors", async () => {
    const at = place();
    let hooks = 0;
    const s = supervisor(at, {
      startupOptions: { iobuf: { small_pool_count: 8192, large_pool_count: 1024 } },
      onRestart: () => void hooks++,
    });
    const t0 = performance.now();
    await s.ensureRunning();
    figures.coldStartToReady = Math.round(performance.now() - t0);
    expect(s.state).toBe("started");
    const pid = s.pid as number;
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    expect(cmdline).toContain(EMULATOR);
    expect(cmdline).toContain("--wait-for-rpc");
    if (SETPRIV) {
      // setpriv execs the target, so the pid is the emulator's and its parent is this process.
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      expect(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]).toBe(String(process.pid));
    }
    expect(await reactorLcores(at.sock)).toEqual([0, 1]);
    await waitFor(() => hooks === 1, 1000, "onRestart");
    const again = performance.now();
    await s.ensureRunning();
    figures.ensureRunningWhenUp = Math.round((performance.now() - again) * 100) / 100;
    await s.stop();
    await expectNoProcess(at.sock);
    expect(existsSync(at.sock)).toBe(false);
  });

  test("adopts an emulator already running with the same mask, and leaves it running on stop", async () => {
    const at = place();
    const foreign = await foreignTarget(at, "[0-1]");
    await foreign.client.close();
    let hooks = 0;
    const s = supervisor(at, { onRestart: () => void hooks++ });
    const t0 = performance.now();
    await s.ensureRunning();
    figures.adopt = Math.round(performance.now() - t0);
    expect(s.state).toBe("adopted");
    expect(s.pid).toBe(foreign.proc.pid);
    await s.stop();
    expect(hooks).toBe(0);
    expect(foreign.proc.exitCode).toBeNull();
    expect(await reactorLcores(at.sock)).toEqual([0, 1]);
  });

  test("adopts an emulator waiting in --wait-for-rpc by initialising it (a new target: onRestart)", async () => {
    const at = place();
    const foreign = await foreignTarget(at, "0x3", true);
    await foreign.client.close();
    let hooks = 0;
    const s = supervisor(at, { onRestart: () => void hooks++ });
    await s.ensureRunning();
    expect(s.state).toBe("adopted");
    await waitFor(() => hooks === 1, 1000, "onRestart");
    await s.stop();
    expect(foreign.proc.exitCode).toBeNull();
  });

  test("refuses an emulator running another mask, names both masks, and does not touch it", async () => {
    const at = place();
    const foreign = await foreignTarget(at, "0x1");
    await foreign.client.close();
    const s = supervisor(at);
    const err = (await s.ensureRunning().catch((e: unknown) => e)) as StorageError;
    expect(err.kind).toBe("precondition");
    expect(err.message).toContain("0x1");
    expect(err.message).toContain("0x3");
    expect(s.state).toBe("down");
    expect(foreign.proc.exitCode).toBeNull();
    expect(processesMentioning(at.sock).map((p) => p.pid)).toEqual([foreign.proc.pid]);
    expect(await reactorLcores(at.sock)).toEqual([0]);
  });

  test("kill -9 of the managed emulator: detected, restarted with a new pid, onRestart fires", async () => {
    const at = place();
    let hooks = 0;
    let hookAt = 0;
    const s = supervisor(at, {
      livenessPeriodMs: 1000,
      restartBackoff: { initialMs: 50, maxMs: 2000 },
      onRestart: () => {
        hooks++;
        hookAt = performance.now();
      },
    });
    s.start();
    await waitFor(() => s.state === "started" && hooks === 1, 10_000, "first start");
    const first = s.pid as number;
    const killedAt = performance.now();
    process.kill(first, "SIGKILL");
    await waitFor(() => s.state !== "started", 5000, "the loss to be noticed");
    figures.killToDetected = Math.round((performance.now() - killedAt) * 10) / 10;
    await waitFor(() => hooks === 2, 10_000, "onRestart after the restart");
    figures.killToRestartedReady = Math.round(hookAt - killedAt);
    expect(s.state).toBe("started");
    expect(s.pid).not.toBe(first);
    expect(await reactorLcores(at.sock)).toEqual([0, 1]);
    // The killed process was reaped: no zombie left behind.
    expect(existsSync(`/proc/${first}`)).toBe(false);
    await s.stop();
    await expectNoProcess(at.sock);
  });

  test("a command that exits at once fails the start and leaves no process behind", async () => {
    const at = place();
    const s = supervisor(at, { command: ["/bin/sh", "-c", "echo cannot start >&2; exit 3", "sh"] });
    const t0 = performance.now();
    const err = (await s.ensureRunning().catch((e: unknown) => e)) as StorageError;
    figures.immediateExitFailure = Math.round(performance.now() - t0);
    expect(err.kind).toBe("unavailable");
    expect(err.message).toContain("exited with code 3");
    expect(err.message).toContain("cannot start");
    expect(s.state).toBe("down");
    await expectNoProcess(at.sock);
  });

  test("a failing startup step terminates and reaps the emulator and removes its socket", async () => {
    const at = place();
    // Valid for the client, refused by the target: iobuf's small pool must hold at least 64.
    const s = supervisor(at, { startupOptions: { iobuf: { small_pool_count: 1 } } });
    const err = (await s.ensureRunning().catch((e: unknown) => e)) as StorageError;
    expect(err.message).toContain("failed at iobuf_set_options");
    const pid = (err.details as { pid: number }).pid;
    expect(existsSync(`/proc/${pid}`)).toBe(false);
    await expectNoProcess(at.sock);
    expect(existsSync(at.sock)).toBe(false);
    // A retry with usable options starts clean.
    const ok = supervisor(at);
    await ok.ensureRunning();
    expect(ok.state).toBe("started");
  });

  test("stop() terminates the managed emulator and leaves no stray process", async () => {
    const at = place();
    const s = supervisor(at);
    s.start();
    await waitFor(() => s.state === "started", 10_000, "start");
    const pid = s.pid as number;
    const t0 = performance.now();
    await s.stop();
    figures.stop = Math.round(performance.now() - t0);
    expect(s.state).toBe("down");
    expect(existsSync(`/proc/${pid}`)).toBe(false);
    await expectNoProcess(at.sock);
    expect(existsSync(at.sock)).toBe(false);
  });

  test.skipIf(SETPRIV === undefined)(
    "the managed emulator dies with a SIGKILLed agent (pdeathsig)",
    async () => {
      const at = place();
      const driver = join(root, "agent-driver.ts");
      writeFileSync(
        driver,
        `import { NvmfTgtSupervisor } from ${JSON.stringify(SUPERVISOR)};
import { SpdkClient } from ${JSON.stringify(new URL("./client.ts", import.meta.url).pathname)};
import { bunProcessRunner, hostSocketFiles, procInspector } from ${JSON.stringify(new URL("./process-runner.ts", import.meta.url).pathname)};
import { hostFs } from ${JSON.stringify(new URL("../fs.ts", import.meta.url).pathname)};
import { realClock } from ${JSON.stringify(new URL("../clock.ts", import.meta.url).pathname)};
import { silentLogger } from ${JSON.stringify(new URL("../log.ts", import.meta.url).pathname)};
const [sock, data, setpriv] = process.argv.slice(2) as [string, string, string];
const s = new NvmfTgtSupervisor({
  command: [process.execPath, ${JSON.stringify(EMULATOR)}], socketPath: sock, coreMask: "0x1",
  extraArgs: ["--sim-data-dir", data],
  openClient: () => new SpdkClient({ socketPath: sock, logger: silentLogger }),
  runner: bunProcessRunner({ setprivPath: setpriv }), inspector: procInspector(hostFs("/")),
  sockets: hostSocketFiles(), clock: realClock, logger: silentLogger,
});
await s.ensureRunning();
process.stdout.write(String(s.pid) + "\\n");
await Bun.sleep(60_000);
`,
      );
      const agent = Bun.spawn([BUN, driver, at.sock, at.data, SETPRIV as string], {
        stdin: "ignore",
        stdout: "pipe",
        stderr: "inherit",
      });
      strays.push(agent);
      const reader = (agent.stdout as ReadableStream<Uint8Array>).getReader();
      let text = "";
      while (!text.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
      const pid = Number(text.trim());
      expect(pid).toBeGreaterThan(0);
      strayPids.push(pid);
      expect(existsSync(`/proc/${pid}`)).toBe(true);
      agent.kill("SIGKILL");
      await agent.exited;
      // Killed by the kernel the moment its parent died; reparented, it may linger as a zombie
      // until init reaps it, but it no longer runs.
      const until = Date.now() + 3000;
      const running = () => processesMentioning(at.sock).filter((p) => p.state !== "Z");
      while (running().length > 0 && Date.now() < until) await Bun.sleep(20);
      expect(running()).toEqual([]);
    },
  );
});

describe("host ports", () => {
  test("bunProcessRunner forwards output lines and reports exit codes and signals", async () => {
    const runner = bunProcessRunner({ setprivPath: SETPRIV });
    const lines: string[] = [];
    const child = runner.spawn(["/bin/sh", "-c", "echo one; printf 'two\\nthree'; echo err >&2; exit 7"], {
      dieWithParent: true,
      onOutput: (stream, line) => lines.push(`${stream}:${line}`),
    });
    expect(child.exit).toBeUndefined();
    expect(await child.exited).toEqual({ code: 7, signal: null });
    expect(child.exit).toEqual({ code: 7, signal: null });
    expect(lines.filter((l) => l.startsWith("stdout:"))).toEqual([
      "stdout:one",
      "stdout:two",
      "stdout:three",
    ]);
    expect(lines).toContain("stderr:err");
    if (SETPRIV) expect(child.argv.slice(0, 4)).toEqual([SETPRIV, "--pdeathsig", "KILL", "--"]);

    const sleeper = runner.spawn(["sleep", "30"]);
    sleeper.kill("SIGTERM");
    expect(await sleeper.exited).toEqual({ code: null, signal: "SIGTERM" });
    sleeper.kill("SIGKILL"); // after the end: a no-op
    expect(existsSync(`/proc/${sleeper.pid}`)).toBe(false);
    expect(() => runner.spawn([join(root, "no-such-binary")])).toThrow("cannot start");
  });

  test("procInspector reads state and parent from /proc, also for odd command names", async () => {
    const proc = procInspector(hostFs("/"));
    expect(await proc.state(process.pid)).toBe("alive");
    expect(await proc.parentPid(process.pid)).toBe(process.ppid);
    const child = Bun.spawn(["true"]);
    await child.exited;
    expect(await proc.state(child.pid)).toBe("gone");
    expect(await proc.parentPid(child.pid)).toBeUndefined();
    expect(await proc.state(-1)).toBe("gone");

    const fake = join(root, "fakeproc");
    mkdirSync(join(fake, "proc", "4321"), { recursive: true });
    writeFileSync(join(fake, "proc", "4321", "stat"), "4321 (reactor) 0 (x) Z 77 4321 4321 0 -1\n");
    const rooted = procInspector(hostFs(fake));
    expect(await rooted.state(4321)).toBe("zombie");
    expect(await rooted.parentPid(4321)).toBe(77);
  });

  test("hostSocketFiles removes only sockets nobody listens on", async () => {
    const files = hostSocketFiles();
    const dir = join(root, "sockets");
    mkdirSync(dir, { recursive: true });
    expect(await files.removeIfStale(join(dir, "absent.sock"))).toBe("absent");
    const plain = join(dir, "plain");
    writeFileSync(plain, "x");
    expect(await files.removeIfStale(plain)).toBe("not-a-socket");
    expect(existsSync(plain)).toBe(true);

    const live = join(dir, "live.sock");
    const server = createServer(() => {});
    await new Promise<void>((resolve) => server.listen(live, resolve));
    expect(await files.removeIfStale(live)).toBe("in-use");
    expect(existsSync(live)).toBe(true);
    await new Promise<void>((resolve) => server.close(() => resolve()));

    // A socket file whose owner was SIGKILLed stays behind; that one goes.
    const at = place();
    const foreign = await foreignTarget(at, "0x1");
    await foreign.client.close();
    foreign.proc.kill("SIGKILL");
    await foreign.proc.exited;
    expect(existsSync(at.sock)).toBe(true);
    expect(await files.removeIfStale(at.sock)).toBe("removed");
    expect(existsSync(at.sock)).toBe(false);
  });
});
