// A manager binary (manager/main.ts) as a child process for tests and benchmarks: its JSON log
// lines are collected, its /metrics endpoint is found from its startup line, and it can be
// paused, resumed, killed and restarted like a misbehaving Pod.
import { join } from "node:path";
import type { Subprocess } from "bun";
import { freePort } from "../../lab/cluster/control-plane.ts";

const MAIN = join(import.meta.dir, "..", "main.ts");

export interface LogLine {
  ts: string;
  level: string;
  msg: string;
  [k: string]: unknown;
}

export class ManagerProcess {
  readonly lines: LogLine[] = [];
  #proc: Subprocess<"ignore", "pipe", "pipe"> | undefined;
  #url: string | undefined;

  constructor(
    readonly id: string,
    private readonly env: Record<string, string>,
    /** Echo log lines to stderr (for debugging a test). */
    private readonly echo = process.env.DISTORT_TEST_LOGS !== undefined,
  ) {}

  /** Starts (or restarts) the process; resolves once it answers /healthz. */
  async start(): Promise<void> {
    const port = await freePort();
    this.#url = `http://127.0.0.1:${port}`;
    const proc = Bun.spawn([process.execPath, MAIN], {
      env: {
        ...process.env,
        ...this.env,
        DISTORT_IDENTITY: this.id,
        DISTORT_HEALTH_HOST: "127.0.0.1",
        DISTORT_HEALTH_PORT: String(port),
      },
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
    });
    this.#proc = proc;
    void this.#pump(proc.stdout);
    void this.#pump(proc.stderr);
    // Only catches a hung start (an exit fails at once): long enough for a machine whose load is
    // many times its cores, where a bun process can take tens of seconds to serve its first probe.
    const deadline = Date.now() + 180_000;
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`manager ${this.id} exited with ${proc.exitCode}`);
      if (Date.now() > deadline) throw new Error(`manager ${this.id} did not start`);
      const ok = await fetch(`${this.#url}/healthz`)
        .then((r) => r.ok)
        .catch(() => false);
      if (ok) return;
      await Bun.sleep(50);
    }
  }

  async #pump(stream: ReadableStream<Uint8Array>): Promise<void> {
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of stream) {
      buf += dec.decode(chunk, { stream: true });
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const text = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (this.echo) process.stderr.write(`[${this.id}] ${text}\n`);
        let line: LogLine;
        try {
          line = JSON.parse(text) as LogLine;
        } catch {
          continue;
        }
        this.lines.push(line);
      }
    }
  }

  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  get running(): boolean {
    return this.#proc !== undefined && this.#proc.exitCode === null && this.#proc.signalCode === null;
  }

  pause(): void {
    this.#proc?.kill("SIGSTOP");
  }

  resume(): void {
    this.#proc?.kill("SIGCONT");
  }

  /** SIGKILL: no lease release, no cleanup, requests possibly half-sent. */
  async kill(): Promise<void> {
    const p = this.#proc;
    if (!p) return;
    p.kill("SIGKILL");
    await p.exited;
  }

  /** SIGTERM and wait for a clean exit (the lease is released). */
  async terminate(): Promise<number | null> {
    const p = this.#proc;
    if (!p) return null;
    p.kill("SIGCONT");
    p.kill("SIGTERM");
    return p.exited;
  }

  /** The Prometheus text of the live process. */
  async metrics(): Promise<string> {
    if (!this.#url) throw new Error(`manager ${this.id} has no metrics endpoint`);
    return (await fetch(`${this.#url}/metrics`)).text();
  }

  async probe(path: "/healthz" | "/readyz"): Promise<number> {
    if (!this.#url) throw new Error(`manager ${this.id} has no health endpoint`);
    return (await fetch(`${this.#url}${path}`)).status;
  }

  /** Peak resident set size of the live process in bytes (Linux VmHWM). */
  async peakRssBytes(): Promise<number | undefined> {
    if (!this.pid) return undefined;
    try {
      const status = await Bun.file(`/proc/${this.pid}/status`).text();
      const kb = /VmHWM:\s+(\d+) kB/.exec(status)?.[1];
      return kb ? Number(kb) * 1024 : undefined;
    } catch {
      return undefined;
    }
  }

  /** Log lines with this msg. */
  count(msg: string): number {
    return this.lines.filter((l) => l.msg === msg).length;
  }
}

/** The value of one sample in Prometheus text (0 when absent). */
export function metricValue(text: string, series: string): number {
  for (const line of text.split("\n")) {
    if (line.startsWith(`${series} `)) return Number(line.slice(series.length + 1));
  }
  return 0;
}
