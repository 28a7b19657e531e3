// What a real-cluster lab node's host paths hold before `helm install`: a storage node's drive
// files, drives.json and simulated sysfs tree, and on every node the directories and host NQN the
// chart's hostPath volumes (helm/distort/examples/lab-cluster.yaml) name.
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { isAbsolute, join, relative } from "node:path";
import { buildDriveSysfs, type SimNodeDrive } from "../harness/storage-node.ts";
import { prepareDrives } from "../sim/spdk/sim-drive.ts";

/**
 * Paths inside a node (its mount namespace), exactly as lab-cluster.yaml names them;
 * helm/lab-cluster.int.test.ts checks the two agree.
 */
export const NODE_PATHS = {
  /** A storage node's drives: `host/` (sysfs tree), `drives.json`, `drives/` (emulator data). */
  storage: "/var/lib/distort-lab/storage",
  /** The node's simulated NVMe host (the node-level host daemon) serves its control socket here. */
  nvmeHostDir: "/run/distort-lab/nvme-host",
  nvmeHostSocket: "/run/distort-lab/nvme-host/control.sock",
  /** The node's NVMe host NQN (`hostnqn`), which the CSI node plugin sees at /etc/nvme. */
  nvmeConfigDir: "/var/lib/distort-lab/nvme",
} as const;

/** The model every lab drive reports. */
export const LAB_DRIVE_MODEL = "DISTORT LAB NVMe";

/** A drive of a lab storage node. */
export type LabDrive = Omit<SimNodeDrive, "model">;

/** Where one storage node's pieces live, all under its storage directory. */
export interface StorageLayout {
  dir: string;
  /** DISTORT_HOST_ROOT of the agent: holds `sys/`. */
  hostRoot: string;
  /** The emulator's --sim-drives. */
  drivesFile: string;
  /** The emulator's --sim-data-dir (backing files under `drives/`, lvol metadata under `lvols/`). */
  dataDir: string;
}

/** The layout under `dir` (a node's storage directory, seen from wherever `dir` is). */
export function storageLayout(dir: string): StorageLayout {
  return {
    dir,
    hostRoot: join(dir, "host"),
    drivesFile: join(dir, "drives.json"),
    dataDir: join(dir, "drives"),
  };
}

// The node directories the lab bind-mounts over the node's /run, /var/lib and /var/log.
const NODE_MOUNTS: [inNode: string, under: string][] = [
  ["/run", "run"],
  ["/var/lib", "var-lib"],
  ["/var/log", "var-log"],
];

/**
 * The host path of `inNode` (absolute, inside the node) for the node whose directory is `nodeDir`
 * (`<lab dir>/nodes/<node>`). Throws for a path outside /run, /var/lib and /var/log: those are the
 * machine's own, shared by every node.
 */
export function hostPathOf(nodeDir: string, inNode: string): string {
  if (!isAbsolute(inNode)) throw new Error(`${inNode}: not an absolute path`);
  for (const [mount, under] of NODE_MOUNTS) {
    const rel = relative(mount, inNode);
    if (rel === "" || (!rel.startsWith("..") && !isAbsolute(rel))) return join(nodeDir, under, rel);
  }
  throw new Error(`${inNode} is not below a node's own /run, /var/lib or /var/log`);
}

/**
 * Writes a storage node's drives under `dir`: the sysfs tree (rebuilt), drives.json and each
 * drive's sparse backing file (created at its size, or kept with its bytes, as the emulator itself
 * would). Idempotent, so a lab restart keeps the data of existing drives.
 */
export async function prepareStorageNode(dir: string, drives: readonly LabDrive[]): Promise<StorageLayout> {
  if (drives.length === 0) throw new Error("a storage node needs at least one drive");
  const layout = storageLayout(dir);
  const full = drives.map((d) => ({ ...d, model: LAB_DRIVE_MODEL }));
  await buildDriveSysfs(layout.hostRoot, full);
  mkdirSync(layout.dataDir, { recursive: true });
  writeFileSync(layout.drivesFile, `${JSON.stringify(full, null, 2)}\n`);
  prepareDrives(layout.dataDir, full);
  return layout;
}

/** What every node needs, as host paths, and its host NQN. */
export interface PreparedNode {
  hostNqn: string;
  /** Host path of the NVMe host daemon's directory (its socket goes there). */
  nvmeHostDir: string;
  /** Host path of the directory holding `hostnqn`. */
  nvmeConfigDir: string;
  /** The storage layout (host paths), for a storage node. */
  storage?: StorageLayout;
}

/**
 * Prepares node `nodeDir` (`<lab dir>/nodes/<node>`, whose run/ and var-lib/ the node mounts) for
 * the chart: the NVMe host daemon's directory, the node's host NQN (kept when one exists, so the
 * node keeps its fabric identity across lab restarts), and for a storage node its drives.
 */
export async function prepareLabNode(
  nodeDir: string,
  opts: { drives?: readonly LabDrive[] } = {},
): Promise<PreparedNode> {
  const nvmeHostDir = hostPathOf(nodeDir, NODE_PATHS.nvmeHostDir);
  const nvmeConfigDir = hostPathOf(nodeDir, NODE_PATHS.nvmeConfigDir);
  mkdirSync(nvmeHostDir, { recursive: true });
  mkdirSync(nvmeConfigDir, { recursive: true });
  const nqnFile = join(nvmeConfigDir, "hostnqn");
  if (!existsSync(nqnFile) || readFileSync(nqnFile, "utf8").trim() === "")
    writeFileSync(nqnFile, `nqn.2014-08.org.nvmexpress:uuid:${randomUUID()}\n`);
  const hostNqn = readFileSync(nqnFile, "utf8").trim();
  const storage =
    opts.drives === undefined
      ? undefined
      : await prepareStorageNode(hostPathOf(nodeDir, NODE_PATHS.storage), opts.drives);
  return { hostNqn, nvmeHostDir, nvmeConfigDir, ...(storage ? { storage } : {}) };
}
