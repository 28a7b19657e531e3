// The host side of running a daemon, as ports: spawning and signalling a long-running process
// (ProcessRunner), looking at processes through /proc (ProcessInspector), and clearing a unix
// socket file its dead owner left behind (SocketFiles). Production implementations included.

import { lstat, unlink } from "node:fs/promises";
import { createConnection } from "node:net";
import { StorageError } from "../errors.ts";
import type { HostFs } from "../fs.ts";

/** How a process ended: its exit code, or the signal that killed it. */
export interface ProcessExit {
  /** Exit status when it exited; null when a signal killed it. */
  readonly code: number | null;
  /** Signal name ("SIGKILL") when a signal killed it; null when it exited. */
  readonly signal: string | null;
}

/** A running child process. */
export interface ChildProcess {
  readonly pid: number;
  /** The argv actually executed, wrapper included (for logs). */
  readonly argv: readonly string[];
  /**
   * Resolves once the process has ended and been reaped (so it is no zombie); never rejects.
   * Stays resolved with the same value.
   */
  readonly exited: Promise<ProcessExit>;
  /** How it ended, or undefined while it runs. */
  readonly exit: ProcessExit | undefined;
  /** Sends `signal`; does nothing once the process has ended. Never throws. */
  kill(signal: "SIGTERM" | "SIGKILL"): void;
}

export interface SpawnOptions {
  /**
   * Ask the kernel to SIGKILL the child when its parent dies (PR_SET_PDEATHSIG), so it cannot
   * outlive the agent. Best effort: honoured only where the runner can do it (see dieWithParent).
   */
  dieWithParent?: boolean;
  /** Each line the child writes (without its newline), in order per stream. */
  onOutput?: (stream: "stdout" | "stderr", line: string) => void;
}

/** Starts child processes. */
export interface ProcessRunner {
  /** Whether spawn() can honour SpawnOptions.dieWithParent on this host. */
  readonly dieWithParent: boolean;
  /**
   * Starts argv[0] with the rest as arguments (no shell), stdin closed. Throws
   * StorageError("unavailable") when the executable cannot be started at all.
   */
  spawn(argv: readonly string[], opts?: SpawnOptions): ChildProcess;
}

/** Where a pid stands: running (or sleeping, or stopped), a zombie awaiting reaping, or gone. */
export type ProcessState = "alive" | "zombie" | "gone";

/** Read-only look at other processes of the host. */
export interface ProcessInspector {
  /** State of `pid`. Never throws: an unreadable entry counts as "gone". */
  state(pid: number): Promise<ProcessState>;
  /** Parent pid of `pid`, or undefined when the process is not visible. Never throws. */
  parentPid(pid: number): Promise<number | undefined>;
}

/** What removeIfStale found. */
export type SocketFileOutcome = "removed" | "absent" | "in-use" | "not-a-socket";

/** Unix socket files on the host. */
export interface SocketFiles {
  /**
   * Removes the unix socket at `path` only when nothing listens on it (a connect is refused):
   * "removed". Leaves a socket somebody serves ("in-use"), anything that is not a socket
   * ("not-a-socket") and a missing path ("absent") alone. Idempotent; never throws.
   */
  removeIfStale(path: string): Promise<SocketFileOutcome>;
}

// Longer lines are cut: a runaway writer must not make the reader buffer without bound.
const MAX_LINE = 4096;

async function forwardLines(stream: ReadableStream<Uint8Array>, emit: (line: string) => void): Promise<void> {
  const decoder = new TextDecoder();
  let buf = "";
  const flush = (final: boolean) => {
    for (;;) {
      const nl = buf.indexOf("\n");
      if (nl < 0) break;
      emit(buf.slice(0, nl).replace(/\r$/, "").slice(0, MAX_LINE));
      buf = buf.slice(nl + 1);
    }
    if (buf.length > MAX_LINE) {
      emit(buf.slice(0, MAX_LINE));
      buf = "";
    }
    if (final && buf !== "") {
      emit(buf);
      buf = "";
    }
  };
  try {
    for await (const chunk of stream) {
      buf += decoder.decode(chunk, { stream: true });
      flush(false);
    }
  } catch {
    // The pipe broke with the process; what was read has been forwarded.
  }
  buf += decoder.decode();
  flush(true);
}

/**
 * A ProcessRunner on Bun.spawn. dieWithParent is done by running the child under util-linux
 * `setpriv --pdeathsig KILL --` (setpriv execs, so the pid stays the child's); `setprivPath`
 * undefined means the host has none and the option is ignored. Output is read continuously so a
 * chatty child never blocks on a full pipe.
 */
export function bunProcessRunner(opts: { setprivPath: string | undefined }): ProcessRunner {
  const setpriv = opts.setprivPath;
  return {
    dieWithParent: setpriv !== undefined,
    spawn(argv, spawnOpts = {}) {
      if (argv.length === 0 || argv[0] === "") {
        throw new StorageError("invalid", "spawn: argv must name an executable");
      }
      const full =
        spawnOpts.dieWithParent && setpriv !== undefined
          ? [setpriv, "--pdeathsig", "KILL", "--", ...argv]
          : [...argv];
      let proc: ReturnType<typeof Bun.spawn>;
      try {
        proc = Bun.spawn(full, { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
      } catch (err) {
        throw new StorageError("unavailable", `cannot start ${argv[0]}: ${(err as Error).message}`, {
          cause: err,
          details: { argv: full },
        });
      }
      const emit = spawnOpts.onOutput ?? (() => {});
      const readers = Promise.all([
        forwardLines(proc.stdout as ReadableStream<Uint8Array>, (l) => emit("stdout", l)),
        forwardLines(proc.stderr as ReadableStream<Uint8Array>, (l) => emit("stderr", l)),
      ]);
      let exit: ProcessExit | undefined;
      // Bun reaps the child before `exited` settles; output is awaited too (bounded: the pipes
      // close when the process and anything it forked with them are gone) so the last lines
      // are forwarded before callers learn of the exit.
      const exited = proc.exited.then(async (code) => {
        const sig = proc.signalCode;
        const result: ProcessExit =
          sig === null || sig === undefined
            ? { code, signal: null }
            : { code: null, signal: typeof sig === "number" ? `signal ${sig}` : sig };
        await Promise.race([readers, Bun.sleep(1000)]);
        exit = Object.freeze(result);
        return exit;
      });
      return {
        pid: proc.pid,
        argv: full,
        exited,
        get exit() {
          return exit;
        },
        kill(signal) {
          if (exit !== undefined || proc.exitCode !== null || proc.signalCode !== null) return;
          try {
            proc.kill(signal);
          } catch {
            // Already gone between the check and the signal.
          }
        },
      };
    },
  };
}

/**
 * Finds util-linux setpriv with --pdeathsig support, or undefined. Runs `setpriv --help` once;
 * for wiring at startup, not for hot paths.
 */
export function findSetpriv(): string | undefined {
  const path = Bun.which("setpriv");
  if (!path) return undefined;
  try {
    const r = Bun.spawnSync([path, "--help"], { stdout: "pipe", stderr: "pipe" });
    const text = `${r.stdout?.toString() ?? ""}${r.stderr?.toString() ?? ""}`;
    return text.includes("--pdeathsig") ? path : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The fields of /proc/<pid>/stat after the command name, which may itself hold spaces and
 * parentheses; hence the split at the last ")".
 */
function statFields(text: string): string[] | undefined {
  const close = text.lastIndexOf(")");
  if (close < 0) return undefined;
  return text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
}

/** A ProcessInspector over /proc, read through a HostFs (so tests can root it in a directory). */
export function procInspector(fs: HostFs): ProcessInspector {
  const stat = async (pid: number): Promise<string[] | undefined> => {
    if (!Number.isInteger(pid) || pid <= 0) return undefined;
    try {
      return statFields(await fs.readFile(`/proc/${pid}/stat`));
    } catch {
      return undefined;
    }
  };
  return {
    async state(pid) {
      const f = await stat(pid);
      if (!f || f[0] === undefined) return "gone";
      // X (dead) is a task being torn down: as good as gone.
      if (f[0] === "X" || f[0] === "x") return "gone";
      return f[0] === "Z" ? "zombie" : "alive";
    },
    async parentPid(pid) {
      const f = await stat(pid);
      const ppid = f?.[1] === undefined ? Number.NaN : Number(f[1]);
      return Number.isInteger(ppid) ? ppid : undefined;
    },
  };
}

/** SocketFiles over node:fs and node:net. */
export function hostSocketFiles(opts: { connectTimeoutMs?: number } = {}): SocketFiles {
  const timeoutMs = opts.connectTimeoutMs ?? 1000;
  const probe = (path: string): Promise<"listening" | "refused" | "unknown"> =>
    new Promise((resolve) => {
      const sock = createConnection({ path });
      const done = (r: "listening" | "refused" | "unknown") => {
        clearTimeout(timer);
        sock.destroy();
        resolve(r);
      };
      // A listener with a full backlog does not complete the connect: treat as in use.
      const timer = setTimeout(() => done("unknown"), timeoutMs);
      sock.once("connect", () => done("listening"));
      sock.once("error", (err: NodeJS.ErrnoException) =>
        done(err.code === "ECONNREFUSED" ? "refused" : "unknown"),
      );
    });
  return {
    async removeIfStale(path) {
      try {
        const st = await lstat(path);
        if (!st.isSocket()) return "not-a-socket";
      } catch {
        return "absent";
      }
      if ((await probe(path)) !== "refused") return "in-use";
      try {
        await unlink(path);
        return "removed";
      } catch (err) {
        return (err as NodeJS.ErrnoException).code === "ENOENT" ? "absent" : "in-use";
      }
    },
  };
}
