// The lab's container workload: writes a deterministic pseudo-random pattern to a volume (a file
// in a mounted directory, or a raw block device) and reads it back byte for byte, printing one
// JSON result line on stdout (and as the termination message under a kubelet); or holds until
// terminated. It runs as a lab Pod's container; images/lab/workload.Containerfile compiles it.
import { createCipheriv, createHash, type Hash } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { join } from "node:path";

/** write: pattern to the target; verify: read back and compare; write-verify: both; hold: run until terminated. */
export type WorkloadMode = "write" | "verify" | "write-verify" | "hold";
/** Every mode, in the order the usage names them. */
export const WORKLOAD_MODES: readonly WorkloadMode[] = ["write", "verify", "write-verify", "hold"];

/** Where kubelet reads a container's termination message by default. */
export const TERMINATION_LOG = "/dev/termination-log";

/** The file a workload uses inside a mounted volume's directory. */
export const WORKLOAD_FILE = "distort-workload.bin";

/** Where the pattern goes: a file inside a mounted directory, or a block device (or any file) itself. */
export type WorkloadTarget = { kind: "dir"; path: string } | { kind: "device"; path: string };

/** A parsed workload command line. */
export interface WorkloadArgs {
  mode: WorkloadMode;
  /** Pattern length; 0 for hold. */
  bytes: number;
  /** Selects the pattern: the same seed always yields the same bytes. Empty for hold. */
  seed: string;
  target?: WorkloadTarget;
  /** After the result line, keep running until terminated (the Pod stays Running). */
  thenHold: boolean;
  /**
   * write-verify only: that many rounds (0: until terminated), round i with seed `<seed>#<i>`,
   * one result line each; a SIGTERM ends the loop after the round under way. Absent: one round
   * with the seed itself.
   */
  rounds?: number;
}

/** One result line, as printed on stdout (the first line of the Pod's log, and its termination message). */
export interface WorkloadResult {
  mode: WorkloadMode;
  bytes: number;
  /** sha256 of the bytes written (write) or of the bytes read (verify, write-verify). */
  sha256: string;
  ok: boolean;
  /** Verify only: offset of the first byte that differs from the pattern (or the file's end, when short). */
  firstMismatchAt?: number;
  /** Set when an I/O call failed; ok is false then. */
  error?: string;
  /** With --rounds: the round this line reports (its seed is `<seed>#<round>`). */
  round?: number;
}

/** A command line that is not in the workload protocol; the CLI exits 2 on it. */
export class WorkloadUsageError extends Error {
  override readonly name = "WorkloadUsageError";
}

/** The CLI's usage text. */
export const WORKLOAD_USAGE =
  "usage: workload.ts <write|verify|write-verify> --bytes=<n>[Ki|Mi|Gi] --seed=<s> (--dir=<d> | --device=<f>) [--then-hold]\n" +
  "       workload.ts write-verify ... --rounds=<n>   (n rounds, 0: until terminated; round i uses seed <s>#<i>)\n" +
  "       workload.ts hold";

const SIZE_UNITS: Record<string, number> = { "": 1, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3 };

/** "4096", "64Mi" -> bytes. WorkloadUsageError for anything else or beyond 2^53. */
export function parseByteCount(text: string): number {
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(text);
  if (!m) throw new WorkloadUsageError(`--bytes must be a whole number with an optional Ki/Mi/Gi suffix`);
  const n = Number(m[1]) * (SIZE_UNITS[m[2] ?? ""] ?? 1);
  if (!Number.isSafeInteger(n)) throw new WorkloadUsageError("--bytes is too large");
  return n;
}

/**
 * Parses a workload command line (the container's args). `requireTarget` false accepts a command
 * without --dir/--device.
 * Throws WorkloadUsageError naming the first problem. Pure.
 */
export function parseWorkloadArgs(
  argv: readonly string[],
  opts: { requireTarget?: boolean } = {},
): WorkloadArgs {
  const [mode, ...rest] = argv;
  if (mode === undefined || !(WORKLOAD_MODES as readonly string[]).includes(mode)) {
    throw new WorkloadUsageError(
      `the first argument must be one of ${WORKLOAD_MODES.join(", ")}${mode === undefined ? "" : ` (got ${JSON.stringify(mode)})`}`,
    );
  }
  const flags = new Map<string, string>();
  let thenHold = false;
  for (const arg of rest) {
    if (arg === "--then-hold") {
      thenHold = true;
      continue;
    }
    const m = /^--(bytes|seed|dir|device|rounds)=(.*)$/.exec(arg);
    if (!m) throw new WorkloadUsageError(`unknown argument ${JSON.stringify(arg)}`);
    const [, name, value] = m as unknown as [string, string, string];
    if (flags.has(name)) throw new WorkloadUsageError(`--${name} is given twice`);
    flags.set(name, value);
  }
  const dir = flags.get("dir");
  const device = flags.get("device");
  if (dir !== undefined && device !== undefined)
    throw new WorkloadUsageError("--dir and --device exclude each other");
  const target: WorkloadTarget | undefined =
    dir !== undefined
      ? { kind: "dir", path: dir }
      : device !== undefined
        ? { kind: "device", path: device }
        : undefined;
  if (target !== undefined && target.path === "")
    throw new WorkloadUsageError(`--${target.kind} must not be empty`);
  if (mode === "hold") {
    if (flags.has("bytes") || flags.has("seed") || thenHold)
      throw new WorkloadUsageError("hold takes no --bytes, --seed or --then-hold");
    return { mode, bytes: 0, seed: "", thenHold: false, ...(target ? { target } : {}) };
  }
  const bytesText = flags.get("bytes");
  if (bytesText === undefined) throw new WorkloadUsageError(`${mode} needs --bytes`);
  const seed = flags.get("seed");
  if (seed === undefined || seed === "") throw new WorkloadUsageError(`${mode} needs a non-empty --seed`);
  if (target === undefined && opts.requireTarget !== false)
    throw new WorkloadUsageError(`${mode} needs --dir or --device`);
  const roundsText = flags.get("rounds");
  let rounds: number | undefined;
  if (roundsText !== undefined) {
    if (mode !== "write-verify") throw new WorkloadUsageError("--rounds is for write-verify only");
    if (!/^\d{1,9}$/.test(roundsText))
      throw new WorkloadUsageError("--rounds must be a whole number (0: until terminated)");
    rounds = Number(roundsText);
  }
  return {
    mode: mode as WorkloadMode,
    bytes: parseByteCount(bytesText),
    seed,
    thenHold,
    ...(target ? { target } : {}),
    ...(rounds === undefined ? {} : { rounds }),
  };
}

/** The command line parseWorkloadArgs reads back as `args`. Pure. */
export function formatWorkloadArgs(args: WorkloadArgs): string[] {
  const out: string[] = [args.mode];
  if (args.mode !== "hold") out.push(`--bytes=${args.bytes}`, `--seed=${args.seed}`);
  if (args.target) out.push(`--${args.target.kind}=${args.target.path}`);
  if (args.rounds !== undefined) out.push(`--rounds=${args.rounds}`);
  if (args.thenHold) out.push("--then-hold");
  return out;
}

/** The path the pattern is written to or read from. */
export function targetFile(target: WorkloadTarget): string {
  return target.kind === "dir" ? join(target.path, WORKLOAD_FILE) : target.path;
}

const CHUNK = 4 << 20;

/**
 * The pattern of `seed` as a stream of chunks: the AES-256-CTR keystream under sha256(seed) with
 * a zero IV. Deterministic, incompressible and fast (hardware AES), so verifying catches
 * misplaced, stale or zeroed blocks alike.
 */
export class PatternStream {
  private readonly cipher;
  private zeros = Buffer.alloc(0);

  constructor(seed: string) {
    const key = createHash("sha256").update(`distort-workload\0${seed}`).digest();
    this.cipher = createCipheriv("aes-256-ctr", key, Buffer.alloc(16));
  }

  /** The next `n` bytes of the pattern. */
  next(n: number): Buffer {
    if (this.zeros.length < n) this.zeros = Buffer.alloc(n);
    return this.cipher.update(this.zeros.subarray(0, n));
  }
}

/** The first `bytes` bytes of `seed`'s pattern, in one buffer (tests; small sizes). */
export function patternBytes(seed: string, bytes: number): Buffer {
  return new PatternStream(seed).next(bytes);
}

async function writeAll(fh: FileHandle, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    const { bytesWritten } = await fh.write(buf, done, buf.length - done, position + done);
    done += bytesWritten;
  }
}

/** Writes `bytes` of the pattern at offset 0 of the target and fsyncs it. Never throws. */
export async function writePattern(
  target: WorkloadTarget,
  bytes: number,
  seed: string,
): Promise<WorkloadResult> {
  const hash = createHash("sha256");
  let fh: FileHandle | undefined;
  try {
    // A directory target gets a fresh file; a device is written in place (it cannot be created).
    fh = await open(targetFile(target), target.kind === "dir" ? "w" : "r+");
    const pattern = new PatternStream(seed);
    for (let off = 0; off < bytes; off += CHUNK) {
      const chunk = pattern.next(Math.min(CHUNK, bytes - off));
      hash.update(chunk);
      await writeAll(fh, chunk, off);
    }
    await fh.sync();
    await fh.close();
    fh = undefined;
    return { mode: "write", bytes, sha256: hash.digest("hex"), ok: true };
  } catch (err) {
    await fh?.close().catch(() => {});
    return { mode: "write", bytes, sha256: "", ok: false, error: (err as Error).message };
  }
}

/** Offset of the first differing byte of two equally long buffers, or -1. */
function firstDifference(a: Buffer, b: Buffer): number {
  if (a.equals(b)) return -1;
  // Narrow down in blocks so a late mismatch in a big chunk costs little.
  const block = 4096;
  for (let i = 0; i < a.length; i += block) {
    const end = Math.min(i + block, a.length);
    if (a.subarray(i, end).equals(b.subarray(i, end))) continue;
    for (let j = i; j < end; j++) if (a[j] !== b[j]) return j;
  }
  return -1;
}

async function readFully(fh: FileHandle, buf: Buffer, position: number): Promise<number> {
  let done = 0;
  while (done < buf.length) {
    const { bytesRead } = await fh.read(buf, done, buf.length - done, position + done);
    if (bytesRead === 0) break;
    done += bytesRead;
  }
  return done;
}

/**
 * Reads `bytes` from offset 0 of the target and compares them with the pattern; sha256 is over
 * what was read. A short file is a mismatch at its end. Never throws.
 */
export async function verifyPattern(
  target: WorkloadTarget,
  bytes: number,
  seed: string,
): Promise<WorkloadResult> {
  const hash: Hash = createHash("sha256");
  let fh: FileHandle | undefined;
  let firstMismatchAt: number | undefined;
  try {
    fh = await open(targetFile(target), "r");
    const pattern = new PatternStream(seed);
    const buf = Buffer.alloc(Math.min(CHUNK, Math.max(bytes, 1)));
    for (let off = 0; off < bytes; off += CHUNK) {
      const want = pattern.next(Math.min(CHUNK, bytes - off));
      const got = await readFully(fh, buf.subarray(0, want.length), off);
      hash.update(buf.subarray(0, got));
      if (firstMismatchAt === undefined) {
        const d = firstDifference(buf.subarray(0, got), want.subarray(0, got));
        if (d >= 0) firstMismatchAt = off + d;
        else if (got < want.length) firstMismatchAt = off + got;
      }
      if (got < want.length) break;
    }
    await fh.close();
    fh = undefined;
    return {
      mode: "verify",
      bytes,
      sha256: hash.digest("hex"),
      ok: firstMismatchAt === undefined,
      ...(firstMismatchAt === undefined ? {} : { firstMismatchAt }),
    };
  } catch (err) {
    await fh?.close().catch(() => {});
    return { mode: "verify", bytes, sha256: "", ok: false, error: (err as Error).message };
  }
}

/** Runs a data mode (not hold) and returns its result line. Never throws. */
export async function runWorkload(args: WorkloadArgs): Promise<WorkloadResult> {
  if (args.mode === "hold" || args.target === undefined)
    throw new WorkloadUsageError(`${args.mode} is not a data mode with a target`);
  if (args.mode === "write") return writePattern(args.target, args.bytes, args.seed);
  if (args.mode === "verify") return verifyPattern(args.target, args.bytes, args.seed);
  const written = await writePattern(args.target, args.bytes, args.seed);
  if (!written.ok) return { ...written, mode: "write-verify" };
  return { ...(await verifyPattern(args.target, args.bytes, args.seed)), mode: "write-verify" };
}

/** The seed of round `round` of a --rounds workload seeded `seed`. Pure. */
export function roundSeed(seed: string, round: number): string {
  return `${seed}#${round}`;
}

/**
 * A --rounds workload: write-verify round after round (round i with roundSeed(seed, i)), each
 * result line passed to `report`, until `rounds` are done (0: no limit), a round fails, or
 * `stopped()` says so between rounds. Returns the last line (undefined when none ran). Never throws.
 */
export async function runRounds(
  args: WorkloadArgs,
  report: (line: WorkloadResult) => void,
  stopped: () => boolean,
): Promise<WorkloadResult | undefined> {
  let last: WorkloadResult | undefined;
  for (let i = 0; (args.rounds === 0 || i < (args.rounds ?? 1)) && !stopped(); i++) {
    last = {
      ...(await runWorkload({ ...args, seed: roundSeed(args.seed, i), rounds: undefined })),
      round: i,
    };
    report(last);
    if (!last.ok) break;
  }
  return last;
}

/** Resolves on SIGTERM or SIGINT: how a container is asked to stop. */
function terminated(): Promise<string> {
  return new Promise((resolve) => {
    process.once("SIGTERM", () => resolve("SIGTERM"));
    process.once("SIGINT", () => resolve("SIGINT"));
  });
}

if (import.meta.main) {
  let args: WorkloadArgs;
  try {
    args = parseWorkloadArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`workload: ${(err as Error).message}\n${WORKLOAD_USAGE}\n`);
    process.exit(2);
  }
  if (args.mode === "hold") {
    await terminated();
    process.exit(0);
  }
  if (args.rounds !== undefined) {
    let stopping = false;
    const stop = terminated().then(() => {
      stopping = true;
    });
    const last = await runRounds(
      args,
      (r) => process.stdout.write(`${JSON.stringify(r)}\n`),
      () => stopping,
    );
    if (last && existsSync(TERMINATION_LOG)) writeFileSync(TERMINATION_LOG, `${JSON.stringify(last)}\n`);
    if (args.thenHold && last?.ok) await stop;
    process.exit(last === undefined || last.ok ? 0 : 1);
  }
  const stop = args.thenHold ? terminated() : undefined;
  const result = await runWorkload(args);
  const line = `${JSON.stringify(result)}\n`;
  process.stdout.write(line);
  // Under a real kubelet the result is also the container's termination message: kubelet creates
  // this file in every container (terminationMessagePath's default). Elsewhere it is absent.
  if (existsSync(TERMINATION_LOG)) writeFileSync(TERMINATION_LOG, line);
  if (stop) await stop;
  process.exit(result.ok ? 0 : 1);
}
