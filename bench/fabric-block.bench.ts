// The lab's whole block path, as the e2e suites use it: a loop device over the FUSE file of the
// node's NVMe host daemon (lab/sim/fabric/host-daemon.ts), every request a command over the unix
// socket fabric to the emulated nvmf_tgt (lab/sim/spdk/nvmf-tgt.ts), which does it on a thick lvol
// on a simulated drive's backing file. Yardstick, same run, interleaved: a loop device over the
// same backing file at the lvol's extent, --direct-io=off (the file in the page cache). fio figures
// (sequential MB/s, 4 KiB random IOPS at QD1 and QD16) and mkfs.ext4's wall time on each, with the
// CPU the host daemon and nvmf_tgt got and the time they waited for one (a starved run says so).
// Needs root, /dev/fuse, losetup, mkfs.ext4 and fio (Debian: fio).
// Run: bun bench/fabric-block.bench.ts [seconds per job] [rounds] [job id...]
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readSync,
  writeFileSync,
} from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { basename, join } from "node:path";
import { HostControlInitiator } from "../lab/sim/fabric/host-control.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { FIO_JOBS, type FioJob, fio, sh } from "./fio.ts";
import { cpuSeconds, runDelaySeconds } from "./proc-stats.ts";
import { type Figure, fmt, median, writeResult } from "./report.ts";

const SECONDS = Number(process.argv[2] ?? 3);
const ROUNDS = Number(process.argv[3] ?? 3);
const ONLY = process.argv.slice(4);
const JOBS = ONLY.length > 0 ? FIO_JOBS.filter((j) => ONLY.includes(j.id)) : FIO_JOBS;
const MIB = 2 ** 20;
const SIZE = 256 * MIB;
const DRIVE_SIZE = 1024 * MIB;
const ROOT = join(import.meta.dir, "..");
const BUN = process.execPath;
const NQN = "nqn.2026-01.io.distort:bench-fabric-block";
const HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:6b1c9a52-0d3e-4f7a-9c11-3e5b2a7d8f40";
const PCI = "0000:5e:00.0";
const say = (s: string) => process.stdout.write(`${s}\n`);

async function until(what: string, ms: number, fn: () => Promise<boolean>): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn().catch(() => false)) return;
    if (Date.now() > end) throw new Error(`${what} not within ${ms} ms`);
    await Bun.sleep(100);
  }
}

/** The byte offset of the 4 KiB `marker` in `file` (searched at 4 KiB boundaries), or -1. */
function findMarker(file: string, marker: Buffer, length: number): number {
  const fd = openSync(file, "r");
  const chunk = Buffer.alloc(8 * MIB);
  try {
    for (let at = 0; at < length; at += chunk.length) {
      const n = readSync(fd, chunk, 0, chunk.length, at);
      for (
        let i = chunk.indexOf(marker.subarray(0, 64));
        i >= 0 && i < n;
        i = chunk.indexOf(marker.subarray(0, 64), i + 1)
      ) {
        if (i % 4096 === 0 && chunk.subarray(i, i + marker.length).equals(marker)) return at + i;
      }
    }
  } finally {
    closeSync(fd);
  }
  return -1;
}

/** Whether loop device `dev` does direct I/O on its file ("1"/"0"), or "?" when unknown. */
function dio(dev: string): string {
  try {
    return readFileSync(`/sys/block/${basename(dev)}/loop/dio`, "utf8").trim();
  } catch {
    return "?";
  }
}

/** mkfs.ext4 on `dev` (as staging formats a volume): wall seconds. */
async function mkfs(dev: string): Promise<number> {
  const t0 = performance.now();
  await sh(["mkfs.ext4", "-F", "-q", dev], 300_000);
  return (performance.now() - t0) / 1000;
}

async function main(): Promise<void> {
  const ids = [...JOBS.map((j) => j.id), "mkfs-ext4"];
  const failAll = (why: string) =>
    writeResult({
      bench: "fabric-block",
      figures: ids.map((id) => ({
        id,
        label: `lab block path: ${id}`,
        value: Number.NaN,
        unit: "",
        better: "higher" as const,
        failed: why,
      })),
    });
  if (process.getuid?.() !== 0 || !existsSync("/dev/fuse")) return failAll("needs root and /dev/fuse");
  if (!Bun.which("fio")) return failAll("fio is not installed (Debian: apt-get install fio)");

  const dir = mkdtempSync(join(tmpdir(), "dfb-"));
  const fabricDir = join(dir, "f");
  const dataDir = join(dir, "d");
  const rpcSocket = join(dir, "t.sock");
  const hostSocket = join(dir, "h.sock");
  mkdirSync(fabricDir);
  const drives = join(dir, "drives.json");
  writeFileSync(
    drives,
    JSON.stringify([{ pciAddress: PCI, serial: "BENCH0001", model: "DISTORT bench", sizeBytes: DRIVE_SIZE }]),
  );
  const quiet = { stdout: "ignore", stderr: "inherit" } as const;
  const target = Bun.spawn(
    [
      BUN,
      join(ROOT, "lab/sim/spdk/nvmf-tgt.ts"),
      "-m",
      "0x1",
      "-r",
      rpcSocket,
      `--sim-data-dir=${dataDir}`,
      `--sim-fabric-dir=${fabricDir}`,
      `--sim-drives=${drives}`,
    ],
    quiet,
  );
  const host = Bun.spawn(
    [
      "unshare",
      "--mount",
      "--propagation",
      "private",
      BUN,
      join(ROOT, "lab/sim/fabric/host-daemon.ts"),
      `--fabric-dir=${fabricDir}`,
      `--state-dir=${join(dir, "h")}`,
      `--socket=${hostSocket}`,
      "--log-level=warn",
    ],
    quiet,
  );
  const rpc = new SpdkClient({ socketPath: rpcSocket, logger: createLogger({ level: "error" }) });
  const initiator = new HostControlInitiator(hostSocket);
  let plainDev: string | undefined;
  try {
    await until("the emulated nvmf_tgt", 30_000, async () => {
      await rpc.call("spdk_get_version");
      return true;
    });
    await until("the NVMe host daemon", 30_000, async () => {
      await initiator.list();
      return true;
    });
    // The agent's way: drive attached, lvstore with 4 MiB clusters, a thick lvol exported as ns 1.
    await rpc.call("bdev_nvme_attach_controller", { name: "Nvme0", trtype: "PCIe", traddr: PCI });
    await rpc.call("bdev_lvol_create_lvstore", {
      bdev_name: "Nvme0n1",
      lvs_name: "lvs0",
      cluster_sz: 4 * MIB,
    });
    const bdev = (await rpc.call("bdev_lvol_create", {
      lvs_name: "lvs0",
      lvol_name: "bench",
      size_in_mib: SIZE / MIB,
      thin_provision: false,
      clear_method: "unmap",
    })) as string;
    await rpc.call("nvmf_create_transport", { trtype: "TCP" });
    await rpc.call("nvmf_create_subsystem", { nqn: NQN, serial_number: "DISTORT0001" });
    await rpc.call("nvmf_subsystem_add_ns", { nqn: NQN, namespace: { bdev_name: bdev, nsid: 1 } });
    await rpc.call("nvmf_subsystem_add_listener", {
      nqn: NQN,
      listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "10.9.0.1", trsvcid: "4420" },
    });
    await rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST_NQN });
    await initiator.connect({
      transport: "tcp",
      address: "10.9.0.1",
      port: 4420,
      nqn: NQN,
      hostNqn: HOST_NQN,
    });
    const labDev = await initiator.findNamespaceDevice(NQN);
    if (!labDev) throw new Error("the host daemon shows no device for the namespace");

    // Where the lvol lies in the drive's backing file: a marker written through the lab path.
    const marker = Buffer.alloc(4096);
    crypto.getRandomValues(marker);
    const markerFile = join(dir, "marker");
    writeFileSync(markerFile, marker);
    await sh(["dd", `if=${markerFile}`, `of=${labDev}`, "bs=4096", "count=1", "oflag=direct", "status=none"]);
    const backing = join(dataDir, "drives", `${PCI.replaceAll(":", "_")}.img`);
    const offset = findMarker(backing, marker, DRIVE_SIZE);
    if (offset < 0)
      throw new Error("the marker written on the lab device is not in the drive's backing file");
    plainDev = await sh([
      "losetup",
      "--find",
      "--show",
      "--direct-io=off",
      `--offset=${offset}`,
      `--sizelimit=${SIZE}`,
      backing,
    ]);
    say(`lab device ${labDev}, yardstick ${plainDev} on ${backing} at ${offset}`);

    const figures: Figure[] = [];
    const notes: string[] = [];
    const procs = () => cpuSeconds(target.pid) + cpuSeconds(host.pid);
    const waits = () => runDelaySeconds(target.pid) + runDelaySeconds(host.pid);
    const measure = async (
      id: string,
      label: string,
      unit: string,
      better: "higher" | "lower",
      run: (dev: string) => Promise<number>,
    ) => {
      const ours: number[] = [];
      const yard: number[] = [];
      const cpu: number[] = [];
      const wait: number[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        const c0 = procs();
        const w0 = waits();
        const t0 = performance.now();
        ours.push(await run(labDev));
        const s = (performance.now() - t0) / 1000;
        cpu.push((procs() - c0) / s);
        wait.push((waits() - w0) / s);
        yard.push(await run(plainDev as string));
      }
      const o = median(ours);
      const y = median(yard);
      const list = (xs: number[]) => xs.map(fmt).join(", ");
      // The lab path's work runs in two user processes (niced with the bench); the yardstick's in
      // the kernel's loop workers, which no nice reaches. On a loaded machine the first starve and
      // the second do not: the CPU the processes got, and the time their threads sat runnable
      // waiting for one, tell a starved run from a slow data path.
      const starved = ours.filter((_, r) => (wait[r] ?? 0) > (cpu[r] ?? 0)).length;
      const line = `${id}: lab path ${list(ours)} ${unit}; loop on the backing file ${list(yard)} ${unit}; host daemon + nvmf_tgt on a CPU ${list(cpu)} cores, waiting for one ${list(wait)} thread-seconds per second`;
      say(
        starved > 0
          ? `${line}; held back by the machine's load in ${starved} of ${ROUNDS} rounds (their threads waited for a CPU longer than they ran)`
          : line,
      );
      notes.push(
        `${id}: lab path ${list(ours)}, loop on the backing file ${list(yard)} ${unit}; host daemon + nvmf_tgt CPU ${fmt(median(cpu))} cores, run-queue wait ${fmt(median(wait))} thread-s/s${starved > 0 ? `, held back by load (waited longer than ran) in ${starved} of ${ROUNDS} rounds` : ""}${unit === "s" ? "" : `; ${fmt(o / Math.max(median(cpu), 1e-9))} ${unit} per core of host daemon + nvmf_tgt`}`,
      );
      figures.push({
        id,
        label: `lab block path: ${label}`,
        value: o,
        unit,
        better,
        yardstick: { label: "loop on the same backing file", value: y, unit },
        ratio: better === "higher" ? o / y : y / o,
        ratioLabel: better === "higher" ? "lab path / loop" : "loop time / lab path time",
      });
    };
    for (const j of JOBS as FioJob[]) {
      await measure(j.id, j.label, j.unit, "higher", (dev) => fio(dev, j, SECONDS, SIZE));
    }
    if (ONLY.length === 0 || ONLY.includes("mkfs-ext4")) {
      await measure("mkfs-ext4", `mkfs.ext4 of ${SIZE / MIB} MiB`, "s", "lower", mkfs);
    }
    writeResult({
      bench: "fabric-block",
      figures,
      notes: [
        `fio ${await sh(["fio", "--version"])}, O_DIRECT libaio, ${SECONDS} s per job after 1 s ramp, median of ${ROUNDS} rounds alternating the devices; a ${SIZE / MIB} MiB thick lvol (4 MiB clusters) on a ${DRIVE_SIZE / MIB} MiB simulated drive; loop direct I/O (/sys/block/*/loop/dio): lab path ${dio(labDev)}, yardstick ${dio(plainDev)}.`,
        "Lab path: loop -> FUSE file of host-daemon.ts (its own process, private mount namespace) -> NvmeHost -> unix-socket fabric -> nvmf-tgt.ts (its own process) -> lvol -> drive backing file in the page cache. Yardstick: loop directly on that file at the lvol's extent.",
        `Machine load average ${loadavg()
          .map((l) => l.toFixed(1))
          .join(" / ")} at the end.`,
        ...notes,
      ],
    });
  } finally {
    if (plainDev) await sh(["losetup", "-d", plainDev]).catch(() => {});
    await initiator.disconnect(NQN).catch(() => {});
    await rpc.close().catch(() => {});
    for (const p of [host, target]) p.kill("SIGTERM");
    await Promise.race([Promise.all([host.exited, target.exited]), Bun.sleep(10_000)]);
    for (const p of [host, target]) if (p.exitCode === null) p.kill("SIGKILL");
    await sh(["rm", "-rf", "--one-file-system", dir]).catch(() => {});
  }
}

if (import.meta.main) await main();
