// The two ends of the simulated fabric as processes of their own, for harnesses that run DISTORT's
// services inside the test process: an emulated nvmf_tgt per storage node and an NVMe-oF host
// daemon per consumer node. Every block then travels loop device -> FUSE -> host -> fabric ->
// target, answered by processes a test's synchronous I/O on a mounted volume cannot block.
import { join } from "node:path";
import { createLogger } from "../../lib/log.ts";
import { SpdkClient } from "../../lib/spdk/client.ts";
import { socketAnswers } from "../../lib/unix-socket.ts";
import type { ProcessTable } from "../procs.ts";
import { HostControlInitiator } from "../sim/fabric/host-control.ts";

const BUN = process.execPath;
const ROOT = join(import.meta.dir, "..", "..");

export interface TargetProcessOptions {
  /** Unique process name in the table, e.g. "nvmf_tgt/storage-a". */
  name: string;
  /** The RPC socket the agent and tests dial. */
  socketPath: string;
  /** Drive files and lvol metadata. */
  dataDir: string;
  /** The unix-socket fabric's directory, shared with the host daemons. */
  fabricDir: string;
  /** A JSON file of drives (lab/sim/spdk/sim-drive.ts); none for a target without drives. */
  drivesFile?: string;
  /** The node's IP addresses; a listener elsewhere is refused as on a real node. */
  hostAddresses?: string[];
}

/** The emulated nvmf_tgt's command line for `o`, on one core. */
export function targetArgv(o: Omit<TargetProcessOptions, "name">): string[] {
  return [
    BUN,
    join(ROOT, "lab/sim/spdk/nvmf-tgt.ts"),
    "-m",
    "0x1",
    "-r",
    o.socketPath,
    `--sim-data-dir=${o.dataDir}`,
    `--sim-fabric-dir=${o.fabricDir}`,
    ...(o.drivesFile ? [`--sim-drives=${o.drivesFile}`] : []),
    ...(o.hostAddresses ? [`--sim-host-addresses=${o.hostAddresses.join(",")}`] : []),
  ];
}

/** True when an SPDK RPC socket answers spdk_get_version within a second. */
export async function spdkAnswers(socketPath: string): Promise<boolean> {
  const c = new SpdkClient({ socketPath, logger: createLogger({ level: "error" }), callTimeoutMs: 1000 });
  try {
    await c.call("spdk_get_version");
    return true;
  } finally {
    await c.close();
  }
}

/**
 * Starts the emulated nvmf_tgt in `procs` and resolves once its RPC socket answers. It is
 * restarted like a container if it dies (its lvol metadata persists on the drive files); the
 * table's stop ends it. Throws with the log's tail when it does not come up.
 */
export async function startTargetProcess(procs: ProcessTable, o: TargetProcessOptions): Promise<void> {
  await procs.start({ name: o.name, argv: targetArgv(o), ready: () => spdkAnswers(o.socketPath) });
}

export interface HostProcessOptions {
  /** Unique process name in the table, e.g. "nvme-host/worker-a". */
  name: string;
  fabricDir: string;
  /** The host's state: its host ID and the FUSE mountpoint of its namespace files. */
  stateDir: string;
  /** The control socket the CSI node's initiator dials. */
  socketPath: string;
  logLevel?: "debug" | "info" | "warn" | "error";
}

/** The host daemon's command line: in a private mount namespace, so its FUSE mount stays its own. */
export function hostDaemonArgv(o: Omit<HostProcessOptions, "name">): string[] {
  return [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    BUN,
    join(ROOT, "lab/sim/fabric/host-daemon.ts"),
    `--fabric-dir=${o.fabricDir}`,
    `--state-dir=${o.stateDir}`,
    `--socket=${o.socketPath}`,
    `--log-level=${o.logLevel ?? "warn"}`,
  ];
}

/**
 * Starts a consumer node's NVMe-oF host daemon in `procs` and returns the NvmeInitiator that
 * drives it (stateless: the daemon keeps controllers and loop devices, so the CSI node using it
 * may restart). Needs root (FUSE mount, losetup). Throws with the log's tail when it does not
 * come up.
 */
export async function startHostProcess(
  procs: ProcessTable,
  o: HostProcessOptions,
): Promise<HostControlInitiator> {
  await procs.start({
    name: o.name,
    argv: hostDaemonArgv(o),
    ready: () => socketAnswers(o.socketPath),
  });
  return new HostControlInitiator(o.socketPath);
}
