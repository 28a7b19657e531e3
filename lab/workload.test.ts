// The lab workload: argument parsing, the pattern's determinism, and write/verify on a temporary
// directory, including mismatch detection and the CLI's result line and exit codes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  formatWorkloadArgs,
  PatternStream,
  parseByteCount,
  parseWorkloadArgs,
  patternBytes,
  roundSeed,
  runRounds,
  runWorkload,
  targetFile,
  verifyPattern,
  WORKLOAD_FILE,
  WorkloadUsageError,
  writePattern,
} from "./workload.ts";

const MiB = 1024 * 1024;
const SCRIPT = join(import.meta.dir, "workload.ts");
let dir: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "distort-workload-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

describe("arguments", () => {
  test("data modes take bytes, seed and a target", () => {
    expect(parseWorkloadArgs(["write", "--bytes=4096", "--seed=s1", "--dir=/v"])).toEqual({
      mode: "write",
      bytes: 4096,
      seed: "s1",
      thenHold: false,
      target: { kind: "dir", path: "/v" },
    });
    expect(
      parseWorkloadArgs(["verify", "--bytes=64Mi", "--seed=x", "--device=/dev/b", "--then-hold"]),
    ).toEqual({
      mode: "verify",
      bytes: 64 * MiB,
      seed: "x",
      thenHold: true,
      target: { kind: "device", path: "/dev/b" },
    });
    expect(parseWorkloadArgs(["hold"])).toEqual({ mode: "hold", bytes: 0, seed: "", thenHold: false });
  });

  test("a Pod's args may leave the target to the kubelet", () => {
    expect(parseWorkloadArgs(["write-verify", "--bytes=1Ki", "--seed=a"], { requireTarget: false })).toEqual({
      mode: "write-verify",
      bytes: 1024,
      seed: "a",
      thenHold: false,
    });
  });

  test.each([
    [[], "first argument"],
    [["scribble"], "first argument"],
    [["write", "--seed=a", "--dir=/v"], "needs --bytes"],
    [["write", "--bytes=1", "--dir=/v"], "non-empty --seed"],
    [["write", "--bytes=1", "--seed=", "--dir=/v"], "non-empty --seed"],
    [["write", "--bytes=1", "--seed=a"], "--dir or --device"],
    [["write", "--bytes=1", "--seed=a", "--dir=/v", "--device=/d"], "exclude each other"],
    [["write", "--bytes=1", "--seed=a", "--dir=/v", "--dir=/w"], "twice"],
    [["write", "--bytes=1", "--seed=a", "--dir=/v", "--fast"], "unknown argument"],
    [["write", "--bytes=1.5", "--seed=a", "--dir=/v"], "--bytes"],
    [["write", "--bytes=1Ti", "--seed=a", "--dir=/v"], "--bytes"],
    [["hold", "--bytes=1"], "hold takes no"],
    [["write", "--bytes=1", "--seed=a", "--dir=/v", "--rounds=3"], "write-verify only"],
    [["write-verify", "--bytes=1", "--seed=a", "--dir=/v", "--rounds=-1"], "whole number"],
    [["write-verify", "--bytes=1", "--seed=a", "--dir=/v", "--rounds=x"], "whole number"],
  ])("%j is refused (%s)", (argv, why) => {
    expect(() => parseWorkloadArgs(argv)).toThrow(WorkloadUsageError);
    expect(() => parseWorkloadArgs(argv)).toThrow(why);
  });

  test("byte counts and the formatted command line read back", () => {
    expect(parseByteCount("0")).toBe(0);
    expect(parseByteCount("3Gi")).toBe(3 * 1024 ** 3);
    const args = parseWorkloadArgs([
      "write",
      "--bytes=12345",
      "--seed=seed with spaces",
      "--device=/d",
      "--then-hold",
    ]);
    expect(parseWorkloadArgs(formatWorkloadArgs(args))).toEqual(args);
    expect(formatWorkloadArgs(parseWorkloadArgs(["hold", "--dir=/v"]))).toEqual(["hold", "--dir=/v"]);
    expect(targetFile({ kind: "dir", path: "/v" })).toBe(`/v/${WORKLOAD_FILE}`);
    expect(targetFile({ kind: "device", path: "/dev/x" })).toBe("/dev/x");
  });
});

describe("pattern", () => {
  test("is a function of the seed alone, and chunking does not change it", () => {
    const a = patternBytes("seed-1", 100_000);
    expect(patternBytes("seed-1", 100_000).equals(a)).toBe(true);
    expect(patternBytes("seed-2", 100_000).equals(a)).toBe(false);
    expect(patternBytes("seed-1", 1000).equals(a.subarray(0, 1000))).toBe(true);
    const s = new PatternStream("seed-1");
    const parts = Buffer.concat([s.next(7), s.next(4096), s.next(95_897)]);
    expect(parts.equals(a)).toBe(true);
    // Not a repeating or sparse fill.
    expect(a.subarray(0, 4096).equals(a.subarray(4096, 8192))).toBe(false);
    expect(a.filter((b) => b === 0).length).toBeLessThan(1000);
  });
});

describe("write and verify", () => {
  // Not a multiple of the 4 MiB chunk: the last chunk is short.
  const bytes = 9 * MiB + 123;

  test("what is written verifies, with the same sha256 as the pattern", async () => {
    const target = { kind: "dir" as const, path: join(dir, "ok") };
    rmSync(target.path, { recursive: true, force: true });
    mkdirSync(target.path);
    const w = await writePattern(target, bytes, "s");
    expect(w).toEqual({ mode: "write", bytes, sha256: sha(patternBytes("s", bytes)), ok: true });
    expect(statSync(targetFile(target)).size).toBe(bytes);
    const v = await verifyPattern(target, bytes, "s");
    expect(v).toEqual({ mode: "verify", bytes, sha256: w.sha256, ok: true });
    expect((await runWorkload({ mode: "write-verify", bytes, seed: "s", thenHold: false, target })).ok).toBe(
      true,
    );
  });

  test("rounds: each round writes and verifies its own seed, one line each, and stops when asked", async () => {
    const target = { kind: "dir" as const, path: join(dir, "rounds") };
    mkdirSync(target.path, { recursive: true });
    const args = parseWorkloadArgs([
      "write-verify",
      "--bytes=64Ki",
      "--seed=r",
      `--dir=${target.path}`,
      "--rounds=3",
    ]);
    expect(args.rounds).toBe(3);
    expect(parseWorkloadArgs(formatWorkloadArgs(args))).toEqual(args);
    const lines: { round?: number; ok: boolean; sha256: string }[] = [];
    const last = await runRounds(
      args,
      (l) => lines.push(l),
      () => false,
    );
    expect(lines.map((l) => [l.round, l.ok])).toEqual([
      [0, true],
      [1, true],
      [2, true],
    ]);
    // The file holds the last round's pattern, and each round's differs.
    expect(last?.sha256).toBe(sha(patternBytes(roundSeed("r", 2), 64 * 1024)));
    expect(new Set(lines.map((l) => l.sha256)).size).toBe(3);
    expect((await verifyPattern(target, 64 * 1024, roundSeed("r", 2))).ok).toBe(true);
    // 0: until stopped; the stop is seen between rounds.
    const seen: number[] = [];
    await runRounds(
      { ...args, rounds: 0 },
      (l) => seen.push(l.round ?? -1),
      () => seen.length >= 2,
    );
    expect(seen).toEqual([0, 1]);
    // A round that fails ends the loop with its line.
    const broken = { ...args, target: { kind: "dir" as const, path: join(dir, "no-such-dir") } };
    const failed: boolean[] = [];
    const end = await runRounds(
      broken,
      (l) => failed.push(l.ok),
      () => false,
    );
    expect(failed).toEqual([false]);
    expect(end?.ok).toBe(false);
  });

  test("a changed byte, a short file, another seed and a missing file are caught", async () => {
    const target = { kind: "dir" as const, path: join(dir, "bad") };
    mkdirSync(target.path, { recursive: true });
    await writePattern(target, bytes, "s");
    const file = targetFile(target);
    const flipAt = 5 * MiB + 17;
    const fd = openSync(file, "r+");
    const orig = readFileSync(file).subarray(flipAt, flipAt + 1);
    writeSync(fd, Buffer.from([(orig[0] ?? 0) ^ 0xff]), 0, 1, flipAt);
    closeSync(fd);
    const flipped = await verifyPattern(target, bytes, "s");
    expect(flipped.ok).toBe(false);
    expect(flipped.firstMismatchAt).toBe(flipAt);
    expect(flipped.sha256).toBe(sha(readFileSync(file)));

    truncateSync(file, 1000);
    const short = await verifyPattern(target, bytes, "s");
    expect(short).toMatchObject({ ok: false, firstMismatchAt: 1000 });

    await writePattern(target, 4096, "s");
    expect((await verifyPattern(target, 4096, "other")).firstMismatchAt).toBeLessThan(16);

    const missing = await verifyPattern({ kind: "dir", path: join(dir, "nowhere") }, 10, "s");
    expect(missing.ok).toBe(false);
    expect(missing.error).toContain("ENOENT");
  });

  test("a device target is written in place, never created or truncated", async () => {
    const device = join(dir, "device.img");
    writeFileSync(device, Buffer.alloc(2 * MiB, 0xaa));
    const target = { kind: "device" as const, path: device };
    expect((await writePattern(target, MiB, "dev")).ok).toBe(true);
    expect(statSync(device).size).toBe(2 * MiB);
    expect((await verifyPattern(target, MiB, "dev")).ok).toBe(true);
    expect(readFileSync(device)[MiB]).toBe(0xaa);
    expect((await writePattern({ kind: "device", path: join(dir, "absent.img") }, 10, "d")).ok).toBe(false);
  });
});

async function run(args: string[]): Promise<{ code: number; lines: string[]; stderr: string }> {
  const p = Bun.spawn([process.execPath, SCRIPT, ...args], { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, lines: out.split("\n").filter(Boolean), stderr: err };
}

describe("command line", () => {
  test("64 MiB write then verify: one JSON line each, matching sha256, exit 0, quickly", async () => {
    const d = join(dir, "cli");
    mkdirSync(d, { recursive: true });
    const t0 = performance.now();
    const w = await run(["write", "--bytes=64Mi", "--seed=cli", `--dir=${d}`]);
    // The wrong seed's verify reads the same file alongside the right one's.
    const [v, bad] = await Promise.all([
      run(["verify", "--bytes=64Mi", "--seed=cli", `--dir=${d}`]),
      run(["verify", "--bytes=64Mi", "--seed=other", `--dir=${d}`]),
    ]);
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(w.code).toBe(0);
    expect(v.code).toBe(0);
    expect(w.lines).toHaveLength(1);
    expect(v.lines).toHaveLength(1);
    const wr = JSON.parse(w.lines[0] as string);
    const vr = JSON.parse(v.lines[0] as string);
    expect(wr).toMatchObject({ mode: "write", bytes: 64 * MiB, ok: true });
    expect(vr).toMatchObject({ mode: "verify", bytes: 64 * MiB, ok: true, sha256: wr.sha256 });
    expect(bad.code).toBe(1);
    expect(JSON.parse(bad.lines[0] as string)).toMatchObject({ ok: false, firstMismatchAt: 0 });
  }, 30_000);

  test("bad arguments exit 2 with the usage", async () => {
    const r = await run(["write", "--bytes=1"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("usage: workload.ts");
    expect(r.lines).toHaveLength(0);
  });

  test("hold and --then-hold run until SIGTERM", async () => {
    const hold = Bun.spawn([process.execPath, SCRIPT, "hold"], { stdout: "pipe" });
    const d = join(dir, "then-hold");
    mkdirSync(d, { recursive: true });
    const p = Bun.spawn(
      [process.execPath, SCRIPT, "write", "--bytes=4096", "--seed=h", `--dir=${d}`, "--then-hold"],
      {
        stdout: "pipe",
      },
    );
    const reader = p.stdout.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    expect(JSON.parse(first.trim())).toMatchObject({ mode: "write", ok: true });
    // Both held meanwhile: hold since its start, --then-hold since its result line.
    await Bun.sleep(300);
    expect(hold.exitCode).toBeNull();
    expect(p.exitCode).toBeNull();
    hold.kill("SIGTERM");
    p.kill("SIGTERM");
    expect(await hold.exited).toBe(0);
    expect(await p.exited).toBe(0);
  });
});
