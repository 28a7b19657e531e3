// Runs a Pod's workload container as a child process (`bun lab/workload.ts ...`), the stand-in's
// container runtime: collects its JSON result lines, reports its exit as a container would
// (128 + signal when killed), and stops it with SIGTERM, then SIGKILL after a grace period.
import { constants } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import type { Logger } from "../../lib/log.ts";

/** The workload program the stand-in runs. */
export const WORKLOAD_SCRIPT = join(import.meta.dir, "..", "workload.ts");

/** kubelet's cap on a termination message. */
export const MAX_TERMINATION_MESSAGE = 4096;

/** How a workload process ended, in container terms. */
export interface WorkloadExit {
  exitCode: number;
  /** The signal that ended it, when one did. */
  signal?: string;
  /** The last JSON line printed on stdout, else the tail of stderr; at most 4096 bytes. */
  message: string;
  startedAt: string;
  finishedAt: string;
}

/** A started workload process. Its exit is reported once, through `exited`. */
export interface RunningWorkload {
  readonly pid: number;
  readonly startedAt: string;
  /** The last JSON result line so far, if any. */
  readonly lastResult: string | undefined;
  readonly exited: Promise<WorkloadExit>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit. Idempotent. */
  stop(graceMs: number): Promise<WorkloadExit>;
}

function isoNow(): string {
  return `${new Date().toISOString().slice(0, 19)}Z`;
}

function truncate(s: string): string {
  const b = Buffer.from(s);
  return b.length <= MAX_TERMINATION_MESSAGE ? s : b.subarray(b.length - MAX_TERMINATION_MESSAGE).toString();
}

async function eachLine(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void): Promise<void> {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of stream) {
    buf += dec.decode(chunk, { stream: true });
    let nl = buf.indexOf("\n");
    while (nl >= 0) {
      onLine(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      nl = buf.indexOf("\n");
    }
  }
  if (buf) onLine(buf);
}

/**
 * Starts `bun lab/workload.ts <args>`. `onResult` sees each JSON result line as it is printed.
 * The child dies with this process (parent-death signal) when setpriv is available, so a killed
 * stand-in leaves no workload behind.
 */
export function startWorkload(
  args: readonly string[],
  o: { logger: Logger; onResult?: (line: string) => void },
): RunningWorkload {
  const setpriv = Bun.which("setpriv");
  const argv = [process.execPath, WORKLOAD_SCRIPT, ...args];
  const proc: Subprocess<"ignore", "pipe", "pipe"> = Bun.spawn(
    setpriv ? [setpriv, "--pdeathsig", "KILL", "--", ...argv] : argv,
    { stdin: "ignore", stdout: "pipe", stderr: "pipe" },
  );
  const startedAt = isoNow();
  let lastResult: string | undefined;
  const stderr: string[] = [];
  const out = eachLine(proc.stdout, (line) => {
    const t = line.trim();
    if (!t.startsWith("{")) return;
    try {
      JSON.parse(t);
    } catch {
      return;
    }
    lastResult = t;
    o.onResult?.(t);
  });
  const err = eachLine(proc.stderr, (line) => {
    stderr.push(line);
    if (stderr.length > 40) stderr.shift();
    o.logger.debug("workload stderr", { line });
  });
  const exited = (async (): Promise<WorkloadExit> => {
    await proc.exited;
    await Promise.all([out, err]).catch(() => {});
    const code: unknown = proc.signalCode;
    const signal = typeof code === "string" ? code : undefined;
    const signo = signal ? (constants.signals as Record<string, number>)[signal] : undefined;
    return {
      exitCode: proc.exitCode ?? 128 + (signo ?? 9),
      ...(signal ? { signal } : {}),
      message: truncate(lastResult ?? stderr.join("\n").trim()),
      startedAt,
      finishedAt: isoNow(),
    };
  })();
  let stopping: Promise<WorkloadExit> | undefined;
  return {
    pid: proc.pid,
    startedAt,
    get lastResult() {
      return lastResult;
    },
    exited,
    stop(graceMs) {
      stopping ??= (async () => {
        if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
        const done = await Promise.race([exited.then(() => true), Bun.sleep(graceMs).then(() => false)]);
        if (!done) proc.kill("SIGKILL");
        return exited;
      })();
      return stopping;
    },
  };
}
