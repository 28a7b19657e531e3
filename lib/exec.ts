// Running host commands (nvme, parted, mkfs, mount, blkid...) as a port. Production code receives
// an Exec and never spawns processes itself, so tests can assert the exact argv it would run.
import { StorageError } from "./errors.ts";

export interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface ExecOptions {
  /** Kill the command after this long; the result is StorageError("timeout"). */
  timeoutMs?: number;
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
}

export interface Exec {
  /**
   * Runs argv[0] with the rest as arguments (no shell). Resolves with the exit code whatever it
   * is; rejects only when the command cannot start ("unavailable") or times out ("timeout").
   */
  run(argv: readonly string[], opts?: ExecOptions): Promise<ExecResult>;
}

/** Runs `argv` and returns stdout, turning a non-zero exit into StorageError with its stderr. */
export async function runChecked(exec: Exec, argv: readonly string[], opts?: ExecOptions): Promise<string> {
  const r = await exec.run(argv, opts);
  if (r.code !== 0) {
    throw new StorageError(
      "internal",
      `${argv.join(" ")} exited ${r.code}: ${(r.stderr || r.stdout).trim().slice(0, 2000)}`,
      {
        details: { argv, code: r.code },
      },
    );
  }
  return r.stdout;
}

/** The real thing, on Bun.spawn. */
export const hostExec: Exec = {
  async run(argv, opts = {}) {
    let proc: ReturnType<typeof Bun.spawn>;
    try {
      proc = Bun.spawn([...argv], {
        cwd: opts.cwd,
        env: opts.env ? { ...process.env, ...opts.env } : undefined,
        stdin: opts.stdin === undefined ? "ignore" : new TextEncoder().encode(opts.stdin),
        stdout: "pipe",
        stderr: "pipe",
      });
    } catch (err) {
      throw new StorageError("unavailable", `cannot run ${argv[0]}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    let timedOut = false;
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          proc.kill("SIGKILL");
        }, opts.timeoutMs)
      : undefined;
    const [code, stdout, stderr] = await Promise.all([
      proc.exited,
      new Response(proc.stdout as ReadableStream).text(),
      new Response(proc.stderr as ReadableStream).text(),
    ]);
    if (timer) clearTimeout(timer);
    if (timedOut) throw new StorageError("timeout", `${argv.join(" ")} timed out after ${opts.timeoutMs} ms`);
    return { code, stdout, stderr };
  },
};
