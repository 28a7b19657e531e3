// The lab's userspace block path: a loop device over a FUSE block file (lab/sim/fuse) served from
// memory by a Bun child process, measured with fio (sequential MB/s, 4 KiB random IOPS at queue
// depth 1 and 16). Yardstick (same run, same fio jobs, interleaved): a loop device over a plain file
// in /tmp, attached the same way (--direct-io=off). Needs root, /dev/fuse and fio (Debian: fio).
// Run: bun bench/fuse-block.bench.ts [seconds per job] [rounds] [job id...]
import { existsSync, mkdirSync, mkdtempSync } from "node:fs";
import { getPriority, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { FIO_JOBS, fio, sh } from "./fio.ts";
import { cpuSeconds } from "./proc-stats.ts";
import { type Figure, fmt, median, writeResult } from "./report.ts";

const SECONDS = Number(process.argv[2] ?? 3);
// Rounds alternate the two devices; each figure is the median over them (a loaded machine swings a lot).
const ROUNDS = Number(process.argv[3] ?? 3);
const SIZE = 256 * 2 ** 20;
const say = (s: string) => process.stdout.write(`${s}\n`);

const ONLY = process.argv.slice(4);
const JOBS = ONLY.length > 0 ? FIO_JOBS.filter((j) => ONLY.includes(j.id)) : FIO_JOBS;

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
        oursAll.push(await fio(fuseDev, j, SECONDS, SIZE));
        cpu.push(cpuSeconds(server.pid) - cpu0);
        yardAll.push(await fio(plainDev, j, SECONDS, SIZE));
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
