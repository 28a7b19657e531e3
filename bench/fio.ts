// What the block-device benches share: running a command with a deadline, the fio jobs the issue
// asks for (sequential MB/s, 4 KiB random IOPS at queue depth 1 and 16) and one fio run's figure.

/** Runs `argv`, resolves with its trimmed stdout; rejects on a non-zero exit or after `timeoutMs` (killed). */
export async function sh(argv: string[], timeoutMs = 120_000): Promise<string> {
  const p = Bun.spawn(argv, { stdout: "pipe", stderr: "pipe" });
  const t = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  clearTimeout(t);
  if (code !== 0) throw new Error(`${argv.join(" ")} failed (${code}): ${err.trim()}`);
  return out.trim();
}

/** One fio job. */
export interface FioJob {
  id: string;
  label: string;
  rw: "write" | "read" | "randwrite" | "randread";
  bs: string;
  depth: number;
  unit: "MB/s" | "IOPS";
}

/** Sequential write and read (1 MiB, QD4), random 4 KiB write and read at QD1 and QD16. */
export const FIO_JOBS: readonly FioJob[] = [
  { id: "seq-write", label: "sequential write, 1 MiB, QD4", rw: "write", bs: "1M", depth: 4, unit: "MB/s" },
  { id: "seq-read", label: "sequential read, 1 MiB, QD4", rw: "read", bs: "1M", depth: 4, unit: "MB/s" },
  {
    id: "rand-write-qd1",
    label: "random write 4 KiB, QD1",
    rw: "randwrite",
    bs: "4k",
    depth: 1,
    unit: "IOPS",
  },
  { id: "rand-read-qd1", label: "random read 4 KiB, QD1", rw: "randread", bs: "4k", depth: 1, unit: "IOPS" },
  {
    id: "rand-write-qd16",
    label: "random write 4 KiB, QD16",
    rw: "randwrite",
    bs: "4k",
    depth: 16,
    unit: "IOPS",
  },
  {
    id: "rand-read-qd16",
    label: "random read 4 KiB, QD16",
    rw: "randread",
    bs: "4k",
    depth: 16,
    unit: "IOPS",
  },
];

/**
 * One fio job on block device `dev` (O_DIRECT, libaio, `seconds` after a 1 s ramp, within the
 * first `sizeBytes`): MB/s (10^6 bytes) or IOPS as the job's unit says. Rejects when fio fails.
 */
export async function fio(dev: string, j: FioJob, seconds: number, sizeBytes: number): Promise<number> {
  const out = await sh([
    "fio",
    `--name=${j.id}`,
    `--filename=${dev}`,
    "--direct=1",
    "--ioengine=libaio",
    `--rw=${j.rw}`,
    `--bs=${j.bs}`,
    `--iodepth=${j.depth}`,
    `--size=${sizeBytes}`,
    "--time_based",
    `--runtime=${seconds}`,
    "--ramp_time=1",
    "--norandommap",
    "--randrepeat=0",
    "--output-format=json",
  ]);
  const r = JSON.parse(out.slice(out.indexOf("{"))) as {
    jobs: { read: { bw_bytes: number; iops: number }; write: { bw_bytes: number; iops: number } }[];
  };
  const side = j.rw.includes("write") ? r.jobs[0]?.write : r.jobs[0]?.read;
  if (!side) throw new Error(`fio printed no result for ${j.id}`);
  return j.unit === "MB/s" ? side.bw_bytes / 1e6 : side.iops;
}
