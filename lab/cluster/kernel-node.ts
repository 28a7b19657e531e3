// The real-cluster lab's kernel-backend storage node, below what the chart installs: its drives as
// loop devices (real parted acts on them) shown in a simulated sysfs tree, configfs with nvmet
// loaded, and the simulated nvmet as a node-level process (the node's kernel target, not a DISTORT
// component) serving the fabric over TCP on the node's address. The chart's kernel agent variant
// (helm/distort/examples/lab-cluster.yaml, agent.variants.kernel) finds them under NODE_PATHS.storage.
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { hostExec } from "../../lib/exec.ts";
import { socketAnswers } from "../../lib/unix-socket.ts";
import { attachLoopDrives } from "../harness/loop-drives.ts";
import { buildDriveSysfs } from "../harness/storage-node.ts";
import { simConfigfs } from "../sim/configfs/sim-configfs.ts";
import { loopDevices } from "../sweep.ts";
import { inNode, type LabNode } from "./nodes.ts";
import { hostPathOf, LAB_DRIVE_MODEL, type LabDrive, NODE_PATHS } from "./storage-prep.ts";

const ROOT = join(import.meta.dir, "..", "..");

/** Paths inside a kernel node, as the lab values' kernel agent variant names them. */
export const KERNEL_NODE_PATHS = {
  /** The agent's DISTORT_HOST_ROOT: sys/class/nvme (simulated), sys/kernel/config/nvmet, sys/kernel/debug/nvmet. */
  hostRoot: `${NODE_PATHS.storage}/host`,
  /** Where the agent's configfs writes wait for nvmet (--sim-notice-socket). */
  noticeSocket: `${NODE_PATHS.storage}/nvmet.sock`,
  /** nvme name -> loop device name of each drive (--sim-device-map). */
  deviceMap: `${NODE_PATHS.storage}/device-map.json`,
} as const;

/** What prepareKernelNode made, as host paths. */
export interface KernelNodeLayout {
  /** The simulated host root (holds sys/). */
  hostRoot: string;
  /** nvmet's configfs directory. */
  nvmetDir: string;
  /** nvme name -> loop device name. */
  loops: Readonly<Record<string, string>>;
}

/** The record of a kernel node's loop devices, under the node's directory, for `lab down` after a crash. */
const LOOPS_FILE = "kernel-loops.json";
const NVMET_PID_FILE = "nvmet.pid";

/**
 * Prepares kernel node `nodeDir` (`<lab dir>/nodes/<node>`) before the install: the drives'
 * sysfs tree, each drive a sparse file attached as a loop device with partition scanning (recorded
 * for teardown), the device map, and configfs with nvmet loaded (the node boots with the module).
 * The drive files start empty (attachLoopDrives makes them anew).
 */
export async function prepareKernelNode(
  nodeDir: string,
  drives: readonly LabDrive[],
): Promise<KernelNodeLayout> {
  if (drives.length === 0) throw new Error("a kernel storage node needs at least one drive");
  const dir = hostPathOf(nodeDir, NODE_PATHS.storage);
  const hostRoot = hostPathOf(nodeDir, KERNEL_NODE_PATHS.hostRoot);
  await buildDriveSysfs(
    hostRoot,
    drives.map((d) => ({ ...d, model: LAB_DRIVE_MODEL })),
  );
  const loops = await attachLoopDrives(dir, drives);
  writeFileSync(join(nodeDir, LOOPS_FILE), JSON.stringify(Object.values(loops.names)));
  writeFileSync(hostPathOf(nodeDir, KERNEL_NODE_PATHS.deviceMap), JSON.stringify(loops.names));
  await simConfigfs(hostRoot).loadNvmet();
  return { hostRoot, nvmetDir: join(hostRoot, "sys/kernel/config/nvmet"), loops: loops.names };
}

/**
 * Starts the node's simulated nvmet in the node's network and mount namespaces (as the kernel is
 * there before any Pod), listening where the agent's ports say, on the node's address. Tied to this
 * process by a parent-death signal; its pid is recorded under the node. Resolves once its notice
 * socket answers.
 */
export async function startKernelTarget(n: LabNode): Promise<Subprocess> {
  const log = join(n.paths.logs, "nvmet.log");
  const argv = inNode(n, [
    process.execPath,
    join(ROOT, "lab/sim/nvmet/main.ts"),
    `--root=${KERNEL_NODE_PATHS.hostRoot}`,
    "--fabric=tcp",
    `--notice-socket=${KERNEL_NODE_PATHS.noticeSocket}`,
    `--device-map=${KERNEL_NODE_PATHS.deviceMap}`,
    // Every agent write sends a notice; the rescan is only the backstop for one that timed out.
    "--watch-ms=5000",
  ]);
  const p = Bun.spawn(argv, { cwd: ROOT, stdout: Bun.file(log), stderr: Bun.file(log), stdin: "ignore" });
  writeFileSync(join(n.paths.root, NVMET_PID_FILE), String(p.pid));
  const socket = hostPathOf(n.paths.root, KERNEL_NODE_PATHS.noticeSocket);
  const deadline = Date.now() + 30_000;
  while (!(await socketAnswers(socket).catch(() => false))) {
    if (p.exitCode !== null) throw new Error(`nvmet of ${n.name} exited with ${p.exitCode}; see ${log}`);
    if (Date.now() > deadline) throw new Error(`nvmet of ${n.name} not ready after 30 s; see ${log}`);
    await Bun.sleep(100);
  }
  return p;
}

/** Stops a node's nvmet (TERM, KILL after 10 s). */
export async function stopKernelTarget(p: Subprocess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  p.kill("SIGTERM");
  const done = await Promise.race([p.exited.then(() => true), Bun.sleep(10_000).then(() => false)]);
  if (!done) {
    p.kill("SIGKILL");
    await p.exited;
  }
}

/**
 * Kills the nvmet recorded under `nodeDir` (after a crash of the lab process); idempotent. Run
 * before the node is torn down.
 */
export function killRecordedKernelTarget(nodeDir: string): void {
  const pidFile = join(nodeDir, NVMET_PID_FILE);
  if (!existsSync(pidFile)) return;
  const pid = Number(readFileSync(pidFile, "utf8"));
  if (Number.isInteger(pid) && pid > 0) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // Already gone.
    }
  }
  rmSync(pidFile, { force: true });
}

/**
 * Detaches the kernel node's loop devices (those recorded under `nodeDir` whose backing file is
 * still the node's, so a reused loop number is left alone); run once nothing of the node holds
 * them (after its containers are gone). Idempotent.
 */
export async function detachKernelLoops(nodeDir: string): Promise<void> {
  const file = join(nodeDir, LOOPS_FILE);
  if (!existsSync(file)) return;
  const recorded = new Set(JSON.parse(readFileSync(file, "utf8")) as string[]);
  for (const l of loopDevices()) {
    const name = l.name.replace(/^\/dev\//, "");
    if (recorded.has(name) && l.backFile.startsWith(nodeDir)) {
      await hostExec.run(["losetup", "--detach", l.name]).catch(() => {});
    }
  }
  rmSync(file, { force: true });
}
