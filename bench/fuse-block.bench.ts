// The lab's userspace block path: a loop device over a FUSE block file (lab/sim/fuse) served from
// memory by a Bun child process, measured with fio (sequential MB/s, 4 KiB random IOPS at queue
// depth 1 and 16). Yardstick (same run, same fio jobs, interleaved): a loop device over a plain file
// in /tmp, attached the same way (--direct-io=off). Needs root, /dev/fuse and fio (Debian: fio).
// Run: bun bench/fuse-block.bench.ts [seconds per job] [rounds] [job id...]
import { existsSync, mkdirSync, mkdtempSync } from "node:fs";
import { getPriority, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { cpuSeconds } from "./proc-stats.ts";
import { type Figure, fmt, median, writeResult } from "./report.ts";

const SECONDS = Number(process.argv[2] ?? 3);
// Rounds alternate the two devices; each figure is the median over them (a loaded machine swings a lot).
const ROUNDS = Number(process.argv[3] ?? 3);
const SIZE = 256 * 2 ** 20;
const say = (s: string) => process.stdout.write(`${s}\n`);

async function sh(argv: string[], timeoutMs = 120_000): Promise<string> {
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

interface Job {
  id: string;
  label: string;
  rw: "write" | "read" | "randwrite" | "randread";
  bs: string;
  depth: number;
  unit: "MB/s" | "IOPS";
}

const ALL_JOBS: Job[] = [
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
const ONLY = process.argv.slice(4);
const JOBS = ONLY.length > 0 ? ALL_JOBS.filter((j) => ONLY.includes(j.id)) : ALL_JOBS;

/** One fio job on `dev` with O_DIRECT and libaio; MB/s (10^6 bytes) or IOPS. */
async function fio(dev: string, j: Job): Promise<number> {
  const out = await sh([
    "fio",
    `--name=${j.id}`,
    `--filename=${dev}`,
    "--direct=1",
    "--ioengine=libaio",
    `--rw=${j.rw}`,
    `--bs=${j.bs}`,
    `--iodepth=${j.depth}`,
    `--size=${SIZE}`,
    "--time_based",
    `--runtime=${SECONDS}`,
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

async function main(): Promise<void> {
  const failAll = (why: string) =>
    writeResult({
      bench: "fuse-block",
      figures: JOBS.map((j) => ({
        id: j.id,
        label: `FUSE loop: ${j.label}`,
        value: Number.NaN,
        unit: j.unit,
        better: "higher" as const,
        failed: why,
      })),
    });
  if (process.getuid?.() !== 0 || !existsSync("/dev/fuse")) return failAll("needs root and /dev/fuse");
  if (!Bun.which("fio")) return failAll("fio is not installed (Debian: apt-get install fio)");

  const dir = mkdtempSync(join(tmpdir(), "distort-fuse-bench-"));
  const mp = join(dir, "mnt");
  mkdirSync(mp);
  const plain = join(dir, "plain.img");
  const loops: string[] = [];
  const server = Bun.spawn(
    [process.execPath, join(import.meta.dir, "../lab/sim/fuse/serve-memory-files.ts"), mp, `disk:${SIZE}`],
    { stdin: "pipe", stdout: "pipe", stderr: "inherit" },
  );
  try {
    const first = await server.stdout.getReader().read();
    if (!new TextDecoder().decode(first.value).includes("ready"))
      throw new Error("the FUSE server did not start");
    await sh(["fallocate", "-l", String(SIZE), plain]);
    const fuseDev = await sh(["losetup", "--find", "--show", "--direct-io=off", join(mp, "disk")]);
    loops.push(fuseDev);
    const plainDev = await sh(["losetup", "--find", "--show", "--direct-io=off", plain]);
    loops.push(plainDev);

    const figures: Figure[] = [];
    const notes: string[] = [];
    for (const j of JOBS) {
      const oursAll: number[] = [];
      const yardAll: number[] = [];
      const cpu: number[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        const cpu0 = cpuSeconds(server.pid);
        oursAll.push(await fio(fuseDev, j));
        cpu.push(cpuSeconds(server.pid) - cpu0);
        yardAll.push(await fio(plainDev, j));
      }
      const ours = median(oursAll);
      const yard = median(yardAll);
      const list = (xs: number[]) => xs.map(fmt).join(", ");
      say(`${j.id}: FUSE loop ${list(oursAll)} ${j.unit}; plain-file loop ${list(yardAll)} ${j.unit}`);
      notes.push(
        `${j.id}: FUSE loop ${list(oursAll)}, plain-file loop ${list(yardAll)} ${j.unit}; FUSE server CPU ${fmt(median(cpu) / (SECONDS + 1))} cores`,
      );
      figures.push({
        id: j.id,
        label: `FUSE loop: ${j.label}`,
        value: ours,
        unit: j.unit,
        better: "higher",
        yardstick: { label: "loop on a plain file", value: yard, unit: j.unit },
        ratio: ours / yard,
        ratioLabel: "FUSE loop / plain-file loop",
      });
    }
    writeResult({
      bench: "fuse-block",
      figures,
      notes: [
        `fio ${await sh(["fio", "--version"])}, O_DIRECT libaio on the loop devices, ${SECONDS} s per job after 1 s ramp, median of ${ROUNDS} rounds alternating the devices, ${SIZE / 2 ** 20} MiB devices; both loop devices attached with --direct-io=off (loop then sends one request at a time to its file, whatever the queue depth above it).`,
        `Machine load average ${loadavg()
          .map((l) => l.toFixed(1))
          .join(
            " / ",
          )} at the end; the FUSE server ran at nice ${getPriority(server.pid)} (inherited), the plain-file loop's I/O in kernel threads at nice 0: on a busy machine every FUSE request waits for two thread wake-ups (reader Worker, main thread), so the FUSE figures fall far more than the yardstick.`,
        "FUSE side: lab/sim/fuse served from an in-memory handler by a Bun child process (Worker reading /dev/fuse, replies from the main thread, FOPEN_DIRECT_IO, max_write 1 MiB). Plain side: a file in the page cache of /tmp.",
        ...notes,
      ],
    });
  } finally {
    for (const d of loops) await sh(["losetup", "-d", d]).catch(() => {});
    server.stdin.end();
    await Promise.race([server.exited, Bun.sleep(10_000)]);
    if (server.exitCode === null) {
      server.kill("SIGKILL");
      await sh(["umount", "-l", mp]).catch(() => {});
    }
    await sh(["rm", "-rf", "--one-file-system", dir]).catch(() => {});
  }
}

if (import.meta.main) await main();
