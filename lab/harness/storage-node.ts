// One simulated storage node for integration tests and the lab: a sysfs tree with NVMe drives,
// an emulated nvmf_tgt that can attach the same drives over PCIe, and the environment an agent
// process needs to serve them. Also stands in for the manager's claim binding when a test runs
// the agent without a manager.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kinds, type NVMeDevice, type NVMeDeviceClaim, type NVMePartition } from "../../api/index.ts";
import type { KubeConnection } from "../../lib/kube/connection.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { roundUpToUnit } from "../../lib/units.ts";
import { type SimFabric, type SpdkEmulator, startSpdkEmulator } from "../sim/spdk/emulator.ts";
import { buildSysfs } from "../sim/sysfs/build-sysfs.ts";

export interface SimNodeDrive {
  serial: string;
  pciAddress: string;
  sizeBytes: number;
  model?: string;
}

export interface SimStorageNode {
  nodeName: string;
  dir: string;
  hostRoot: string;
  spdkSocket: string;
  emulator: SpdkEmulator;
  drives: SimNodeDrive[];
  /** Environment for `bun agent/main.ts` serving this node. */
  agentEnv(kubeconfig: string, namespace: string, extra?: Record<string, string>): Record<string, string>;
  close(): Promise<void>;
}

/** The sysfs tree of a storage node whose NVMe drives are `drives` (nvme0, nvme1... over PCIe). */
export async function buildDriveSysfs(hostRoot: string, drives: readonly SimNodeDrive[]): Promise<void> {
  await buildSysfs(hostRoot, {
    rootDisk: false,
    controllers: drives.map((d, i) => ({
      name: `nvme${i}`,
      transport: "pcie" as const,
      pciAddress: d.pciAddress,
      serial: d.serial,
      model: d.model ?? "DISTORT SIM NVMe",
      numaNode: 0,
      ns1Bytes: d.sizeBytes,
    })),
  });
}

export async function startSimStorageNode(opts: {
  nodeName: string;
  drives: SimNodeDrive[];
  /** The fabric its listeners join, so initiators (the lab's nodes, SNAP) can reach its exports. */
  fabric?: SimFabric;
  /** The IP addresses the node has: a listener elsewhere fails (-32602); any address when absent. */
  hostAddresses?: readonly string[];
}): Promise<SimStorageNode> {
  const dir = mkdtempSync(join(tmpdir(), `distort-node-${opts.nodeName}-`));
  const hostRoot = join(dir, "host");
  await buildDriveSysfs(hostRoot, opts.drives);
  const spdkSocket = join(dir, "spdk.sock");
  const emulator = await startSpdkEmulator({
    socketPath: spdkSocket,
    dataDir: join(dir, "drives"),
    drives: opts.drives.map((d) => ({
      pciAddress: d.pciAddress,
      serial: d.serial,
      model: d.model ?? "DISTORT SIM NVMe",
      sizeBytes: d.sizeBytes,
    })),
    fabric: opts.fabric,
    ...(opts.hostAddresses ? { hostAddresses: opts.hostAddresses } : {}),
  });
  return {
    nodeName: opts.nodeName,
    dir,
    hostRoot,
    spdkSocket,
    emulator,
    drives: opts.drives,
    agentEnv: (kubeconfig, namespace, extra = {}) => ({
      PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
      HOME: process.env.HOME ?? "/root",
      NODE_NAME: opts.nodeName,
      KUBECONFIG: kubeconfig,
      DISTORT_NAMESPACE: namespace,
      DISTORT_BACKENDS: "spdk",
      DISTORT_SPDK_SOCKET: spdkSocket,
      DISTORT_HOST_ROOT: hostRoot,
      DISTORT_KEY_DIR: join(dir, "keys"),
      DISTORT_PORTAL_ADDRESS: "127.0.0.1",
      DISTORT_PORTAL_PORT: "4420",
      DISTORT_HEALTH_PORT: "0",
      DISTORT_REPORT_PERIOD_MS: "1000",
      DISTORT_VERIFY_PERIOD_MS: "1000",
      DISTORT_LOG_LEVEL: "warn",
      // These agents run without a manager (the tests play its part): rebuilds start without its
      // cluster-wide grant unless a test runs one and turns this back on.
      DISTORT_REBUILD_NEEDS_GRANT: "false",
      ...extra,
    }),
    async close() {
      await emulator.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Plays the manager's claim binding for one reported drive: creates an NVMeDeviceClaim and marks
 * the device Claimed by it. Returns the claim (with its UID).
 */
export async function claimDevice(
  conn: KubeConnection,
  device: NVMeDevice,
  namespace: string,
): Promise<NVMeDeviceClaim> {
  const claims = new ResourceClient(conn, kinds.NVMeDeviceClaim);
  const claim = await claims.create({
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMeDeviceClaim",
    metadata: { name: `claim-${device.metadata.name}`.slice(0, 63), namespace },
    spec: { serial: device.spec.serial, nodeName: device.spec.nodeName },
  } as NVMeDeviceClaim);
  const ref = { namespace, name: claim.metadata.name, uid: claim.metadata.uid as string };
  await updateStatus(
    new ResourceClient(conn, kinds.NVMeDevice),
    device.metadata.name,
    undefined,
    (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      phase: "Claimed" as const,
      claimRef: ref,
      freeBytes: latest.spec.allocatableBytes,
    }),
    // The agent's reporter writes this status too while it starts; on a loaded machine five
    // back-to-back conflicts happen.
    20,
  );
  return claim;
}

/** A partition already placed on `device` (what the manager's placement would write). */
export function placedPartition(
  name: string,
  namespace: string,
  device: NVMeDevice,
  claim: NVMeDeviceClaim,
  sizeBytes: number,
): NVMePartition {
  return {
    apiVersion: "storage.distort.io/v1alpha1",
    kind: "NVMePartition",
    metadata: { name, namespace },
    spec: {
      sizeBytes,
      nodeName: device.spec.nodeName,
      deviceSerial: device.spec.serial,
      claimRef: {
        namespace: claim.metadata.namespace as string,
        name: claim.metadata.name,
        uid: claim.metadata.uid as string,
      },
      backend: "spdk",
      volumeManager: "partition",
      targetOptions: { transport: "tcp" },
    },
  } as NVMePartition;
}

/**
 * Creates partitions already placed on `device` the way the manager places them: each created
 * unplaced, their ledger entries written into the device status in one write, then the placement
 * patched on. One ledger write for the lot, so a bench creating hundreds does not race itself.
 */
export async function createPlacedMany(
  conn: KubeConnection,
  ps: readonly NVMePartition[],
  device: NVMeDevice,
  inFlight = 16,
): Promise<NVMePartition[]> {
  const parts = new ResourceClient(conn, kinds.NVMePartition);
  const created: NVMePartition[] = new Array(ps.length);
  const run = async (from: number, step: number) => {
    for (let i = from; i < ps.length; i += step) {
      const { nodeName, deviceSerial, claimRef, ...unplaced } = (ps[i] as NVMePartition).spec;
      created[i] = await parts.create({ ...(ps[i] as NVMePartition), spec: unplaced } as NVMePartition);
    }
  };
  await Promise.all([...Array(Math.min(inFlight, ps.length)).keys()].map((k) => run(k, inFlight)));
  const uids = new Set(created.map((c) => c.metadata.uid as string));
  await updateStatus(
    new ResourceClient(conn, kinds.NVMeDevice),
    device.metadata.name,
    undefined,
    (latest) => {
      const status: NonNullable<NVMeDevice["status"]> = latest.status ?? {
        phase: "Available",
        reservations: [],
        conditions: [],
      };
      const reservations = (status.reservations ?? []).filter((r) => !uids.has(r.uid));
      created.forEach((c, i) => {
        reservations.push({
          uid: c.metadata.uid as string,
          namespace: c.metadata.namespace as string,
          name: c.metadata.name,
          bytes: roundUpToUnit((ps[i] as NVMePartition).spec.sizeBytes),
        });
      });
      return { ...status, reservations };
    },
    20,
  );
  const placed: NVMePartition[] = new Array(ps.length);
  const patch = async (from: number, step: number) => {
    for (let i = from; i < ps.length; i += step) {
      const c = created[i] as NVMePartition;
      const { nodeName, deviceSerial, claimRef } = (ps[i] as NVMePartition).spec;
      placed[i] = await parts.mergePatch(c.metadata.name, c.metadata.namespace, {
        metadata: { uid: c.metadata.uid },
        spec: { nodeName, deviceSerial, claimRef },
      });
    }
  };
  await Promise.all([...Array(Math.min(inFlight, ps.length)).keys()].map((k) => patch(k, inFlight)));
  return placed;
}

/** createPlacedMany of one partition. */
export async function createPlaced(
  conn: KubeConnection,
  p: NVMePartition,
  device: NVMeDevice,
): Promise<NVMePartition> {
  const [placed] = await createPlacedMany(conn, [p], device);
  return placed as NVMePartition;
}

/**
 * Waits (up to 30 s) for the agent to report the drive with serial `serial`, claims it into
 * `namespace`, and creates placed partitions `names` of `bytes` each on it, `edit` applied to
 * each before it is created (e.g. a spec.qos). Resolves with the drive.
 */
export async function placeOnReportedDrive(
  conn: KubeConnection,
  namespace: string,
  serial: string,
  names: readonly string[],
  bytes: number,
  edit: (p: NVMePartition) => void = () => {},
): Promise<NVMeDevice> {
  const devices = new ResourceClient(conn, kinds.NVMeDevice);
  const deadline = Date.now() + 30_000;
  let device = (await devices.list()).items.find((d) => d.spec.serial === serial);
  while (!device) {
    if (Date.now() > deadline) throw new Error(`no NVMeDevice with serial ${serial} reported within 30 s`);
    await Bun.sleep(200);
    device = (await devices.list()).items.find((d) => d.spec.serial === serial);
  }
  const claim = await claimDevice(conn, device, namespace);
  for (const name of names) {
    const p = placedPartition(name, namespace, device, claim, bytes);
    edit(p);
    await createPlaced(conn, p, device);
  }
  return device;
}

/** One drive the nvmf_tgt emulator serves from a file (its --sim-drives entry). */
export interface EmulatedDrive {
  pciAddress: string;
  serial: string;
  model: string;
  sizeBytes: number;
}

/**
 * A node's drive for an agent and an emulator process the test starts itself, under `dir`: the
 * sysfs tree the agent discovers it in (`hostRoot`), and the emulator's --sim-data-dir and
 * --sim-drives file.
 */
export async function emulatedDriveFiles(
  dir: string,
  drive: EmulatedDrive,
): Promise<{ hostRoot: string; dataDir: string; drivesFile: string }> {
  const hostRoot = join(dir, "host");
  await buildSysfs(hostRoot, {
    rootDisk: false,
    controllers: [{ name: "nvme0", transport: "pcie", numaNode: 0, ns1Bytes: drive.sizeBytes, ...drive }],
  });
  const dataDir = join(dir, "data");
  mkdirSync(dataDir, { recursive: true });
  const drivesFile = join(dataDir, "drives.json");
  writeFileSync(drivesFile, JSON.stringify([drive]));
  return { hostRoot, dataDir, drivesFile };
}
