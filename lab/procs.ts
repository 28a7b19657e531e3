// The lab's process table: every component runs as its own OS process, restarted like a container
// with restartPolicy Always, logging to <dir>/logs/<name>.log and tied to this process by a
// parent-death signal, so a fault test can kill -9 any of them and nothing outlives the lab.
import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { type Clock, realClock } from "../lib/clock.ts";

export interface ProcSpec {
  /** Unique name, also the log file's name ("manager-0", "agent/storage-a", ...). */
  name: string;
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** Restart after an exit nobody asked for (default true): what kubelet does for a container. */
  restart?: boolean;
  /**
   * Resolves once the process serves (a socket answers, a health endpoint says ok). Awaited by
   * start() and after every restart, with the deadline readyTimeoutMs (default 60 s).
   */
  ready?: (pid: number) => Promise<boolean>;
  readyTimeoutMs?: number;
}

export interface ProcState {
  name: string;
  pid: number | undefined;
  restarts: number;
  /** Exits not asked for (killed by a fault, crashed). */
  unexpectedExits: number;
}

interface Entry {
  spec: ProcSpec;
  proc: Subprocess | undefined;
  restarts: number;
  unexpectedExits: number;
  /** Index into RESTART_DELAYS_MS for the next restart. */
  backoff: number;
  /** Set while a stop or a deliberate kill is under way, so its exit is not "unexpected". */
  stopping: boolean;
  /** Exit of the current incarnation. */
  exited: Promise<void>;
}

const RESTART_DELAYS_MS = [200, 500, 1000, 2000, 5000];
/** Running longer than this resets the restart back-off. */
const BACKOFF_RESET_MS = 60_000;

/** The lab's processes, by name. Not reentrant per name: one start/kill/stop at a time per process. */
export class ProcessTable {
  readonly #dir: string;
  readonly #entries = new Map<string, Entry>();
  readonly #say: (line: string) => void;
  readonly #clock: Clock;
  #closed = false;

  /**
   * `dir` receives logs/ and pids.json (the pids `lab down` sweeps if this process died). `clock`
   * times the restart back-off (tests step it); the processes themselves run in real time.
   */
  constructor(dir: string, say: (line: string) => void = () => {}, clock: Clock = realClock) {
    this.#dir = dir;
    this.#say = say;
    this.#clock = clock;
    mkdirSync(join(dir, "logs"), { recursive: true });
  }

  logPath(name: string): string {
    return join(this.#dir, "logs", `${name.replaceAll("/", "_")}.log`);
  }

  /** Starts `spec` and waits for it to be ready. Throws (with the log's tail) if it exits or times out. */
  async start(spec: ProcSpec): Promise<void> {
    if (this.#entries.has(spec.name)) throw new Error(`process ${spec.name} already exists`);
    const entry: Entry = {
      spec,
      proc: undefined,
      restarts: 0,
      unexpectedExits: 0,
      backoff: 0,
      stopping: false,
      exited: Promise.resolve(),
    };
    this.#entries.set(spec.name, entry);
    await this.#launch(entry);
  }

  async #launch(e: Entry): Promise<void> {
    const log = this.logPath(e.spec.name);
    appendFileSync(log, `--- ${new Date().toISOString()} start ${e.spec.argv.join(" ")}\n`);
    // Appending: a restarted process adds to its log instead of overwriting the previous run's.
    const fd = openSync(log, "a");
    let proc: Subprocess;
    try {
      // util-linux setpriv: the child gets SIGKILL when this process dies, even by kill -9.
      proc = Bun.spawn(["setpriv", "--pdeathsig", "KILL", "--", ...e.spec.argv], {
        cwd: e.spec.cwd ?? this.#dir,
        env: { ...process.env, ...e.spec.env },
        stdin: "ignore",
        stdout: fd,
        stderr: fd,
      });
    } finally {
      closeSync(fd);
    }
    const startedAt = this.#clock.now();
    e.proc = proc;
    e.stopping = false;
    this.#writePids();
    e.exited = proc.exited.then((code) => {
      if (e.proc !== proc) return;
      const how = proc.signalCode ? `signal ${proc.signalCode}` : `exit ${code}`;
      appendFileSync(log, `--- ${new Date().toISOString()} ${how}\n`);
      if (e.stopping || this.#closed) return;
      e.unexpectedExits++;
      if (e.spec.restart === false) return;
      // Like kubelet's back-off: a process that ran a while starts again from the shortest delay.
      if (this.#clock.now() - startedAt > BACKOFF_RESET_MS) e.backoff = 0;
      const delay = RESTART_DELAYS_MS[Math.min(e.backoff, RESTART_DELAYS_MS.length - 1)] ?? 5000;
      e.backoff++;
      this.#say(`${e.spec.name} ended (${how}); restarting in ${delay} ms`);
      this.#clock.setTimeout(() => {
        if (this.#closed || e.stopping || e.proc !== proc) return;
        e.restarts++;
        this.#launch(e).catch((err) => this.#say(`${e.spec.name} restart failed: ${String(err)}`));
      }, delay);
    });
    if (!e.spec.ready) return;
    const deadline = Date.now() + (e.spec.readyTimeoutMs ?? 60_000);
    for (;;) {
      if (proc.exitCode !== null || proc.signalCode !== null)
        throw new Error(`${e.spec.name} exited while starting:\n${tail(log)}`);
      if (await e.spec.ready(proc.pid).catch(() => false)) return;
      if (Date.now() > deadline) throw new Error(`${e.spec.name} not ready in time:\n${tail(log)}`);
      await Bun.sleep(50);
    }
  }

  /** The current pid of `name`; undefined while it is down. */
  pid(name: string): number | undefined {
    const p = this.#entries.get(name)?.proc;
    return p && p.exitCode === null && p.signalCode === null ? p.pid : undefined;
  }

  names(): string[] {
    return [...this.#entries.keys()];
  }

  state(): ProcState[] {
    return [...this.#entries.values()].map((e) => ({
      name: e.spec.name,
      pid: this.pid(e.spec.name),
      restarts: e.restarts,
      unexpectedExits: e.unexpectedExits,
    }));
  }

  /**
   * Sends `signal` to `name` as a fault would (the restart policy then brings it back); resolves
   * when that incarnation has exited, or at once if it was down.
   */
  async kill(name: string, signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const e = this.#must(name);
    const proc = e.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill(signal);
    await proc.exited;
  }

  /** Waits until `name` is running again after a kill and its readiness probe passes. */
  async waitRunning(name: string, timeoutMs = 60_000): Promise<void> {
    const e = this.#must(name);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pid = this.pid(name);
      if (pid !== undefined && (!e.spec.ready || (await e.spec.ready(pid).catch(() => false)))) return;
      if (Date.now() > deadline) throw new Error(`${name} did not come back in ${timeoutMs} ms`);
      await Bun.sleep(50);
    }
  }

  /** Stops `name` for good (TERM, KILL after graceMs) and forgets it. Idempotent. */
  async stop(name: string, graceMs = 10_000): Promise<void> {
    const e = this.#entries.get(name);
    if (!e) return;
    e.stopping = true;
    const proc = e.proc;
    if (proc && proc.exitCode === null && proc.signalCode === null) {
      proc.kill("SIGTERM");
      const done = await Promise.race([proc.exited.then(() => true), Bun.sleep(graceMs).then(() => false)]);
      if (!done) {
        proc.kill("SIGKILL");
        await proc.exited;
      }
    }
    this.#entries.delete(name);
    this.#writePids();
  }

  /** Stops every process, last started first. Idempotent. */
  async stopAll(graceMs = 10_000): Promise<void> {
    this.#closed = true;
    for (const name of [...this.#entries.keys()].reverse()) await this.stop(name, graceMs);
  }

  #must(name: string): Entry {
    const e = this.#entries.get(name);
    if (!e) throw new Error(`no lab process named ${name}`);
    return e;
  }

  #writePids(): void {
    const pids: Record<string, number> = {};
    for (const [name, e] of this.#entries) if (e.proc) pids[name] = e.proc.pid;
    writeFileSync(join(this.#dir, "pids.json"), `${JSON.stringify(pids, null, 2)}\n`);
  }
}

/** The last lines of a log, for an error message. */
export function tail(path: string, lines = 25): string {
  try {
    return readFileSync(path, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return `(no log at ${path})`;
  }
}
