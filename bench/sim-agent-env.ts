// The setting the agent benches run one agent process in: a simulated host with one NVMe drive
// (sysfs under a host root, the emulator's drive list) and the environment that points a real
// agent at it, supervising the lab's nvmf_tgt emulator on a real control plane.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildSysfs } from "../lab/sim/sysfs/build-sysfs.ts";

/** The one drive of the simulated host. */
export interface SimDrive {
  pciAddress: string;
  serial: string;
  sizeBytes: number;
}

const EMULATOR = join(import.meta.dir, "..", "lab", "sim", "spdk", "nvmf-tgt.ts");

/** The emulator's entry file (the benches find its process by it). */
export const EMULATOR_PATH = EMULATOR;

/**
 * Writes the host root and the emulator's data under `dir` and returns the agent's environment:
 * node "bench-node", the spdk backend only, TCP portal 127.0.0.1:4420, health on a free port,
 * production defaults otherwise. `socketPath` is where the supervised nvmf_tgt listens.
 */
export async function simAgentEnv(o: {
  dir: string;
  kubeconfigPath: string;
  namespace: string;
  drive: SimDrive;
  logLevel: string;
}): Promise<{ env: Record<string, string>; socketPath: string; dataDir: string }> {
  const hostRoot = join(o.dir, "host");
  await buildSysfs(hostRoot, {
    rootDisk: false,
    controllers: [
      {
        name: "nvme0",
        transport: "pcie",
        pciAddress: o.drive.pciAddress,
        serial: o.drive.serial,
        model: "DISTORT SIM NVMe",
        numaNode: 0,
        ns1Bytes: o.drive.sizeBytes,
      },
    ],
  });
  const dataDir = join(o.dir, "data");
  mkdirSync(dataDir, { recursive: true });
  const drivesFile = join(dataDir, "drives.json");
  writeFileSync(drivesFile, JSON.stringify([{ ...o.drive, model: "DISTORT SIM NVMe" }]));
  const socketPath = join(o.dir, "spdk.sock");
  const env = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    HOME: process.env.HOME ?? "/root",
    NODE_NAME: "bench-node",
    KUBECONFIG: o.kubeconfigPath,
    DISTORT_NAMESPACE: o.namespace,
    DISTORT_BACKENDS: "spdk",
    DISTORT_SPDK_SOCKET: socketPath,
    DISTORT_NVMF_TGT: `${process.execPath} ${EMULATOR} --sim-data-dir ${dataDir} --sim-drives ${drivesFile}`,
    DISTORT_HOST_ROOT: hostRoot,
    DISTORT_KEY_DIR: join(o.dir, "keys"),
    DISTORT_PORTAL_ADDRESS: "127.0.0.1",
    DISTORT_PORTAL_PORT: "4420",
    DISTORT_HEALTH_PORT: "0",
    DISTORT_LOG_LEVEL: o.logLevel,
  };
  return { env, socketPath, dataDir };
}
