// Test support: an emulated nvmf_tgt on a fresh SimFabric, configured over its JSON-RPC socket the
// way the agent would, exporting sparse files as AIO-backed namespaces, or thick lvols on a
// simulated drive as the agent does (4 MiB clusters, namespace 1), to chosen hosts. In this
// process (startTestTarget), or as a process of its own with host daemons beside it
// (startTestTargetProcess) for tests that do synchronous I/O on what the target serves.
import { mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Clock } from "../../../lib/clock.ts";
import { silentLogger } from "../../../lib/log.ts";
import { SpdkClient } from "../../../lib/spdk/client.ts";
import { startHostProcess, startTargetProcess } from "../../harness/fabric-processes.ts";
import { ProcessTable } from "../../procs.ts";
import { type SimDrive, type SpdkEmulator, startSpdkEmulator } from "../spdk/emulator.ts";
import { createFabric, type UnixSimFabric } from "../spdk/fabric.ts";
import type { HostControlInitiator } from "./host-control.ts";

export interface ExportSpec {
  readonly nqn: string;
  readonly sizeBytes: number;
  readonly hosts: readonly string[];
  readonly uuid: string;
  readonly transport?: "tcp" | "rdma";
  readonly traddr?: string;
  readonly trsvcid?: string;
  /** The subsystem's first controller ID (nvmf_create_subsystem min_cntlid); SPDK's default 1. */
  readonly minCntlid?: number;
}

export interface TestTargetOptions {
  /** Simulated drives; exportLvol puts its lvstore on the first one. */
  readonly drives?: readonly SimDrive[];
  /** Passed to the emulator (default: the real clock); a ManualClock holds QoS timeslices still. */
  readonly clock?: Clock;
  /** Passed to the emulator: its RPC poll period (default SPDK's); 0 answers on arrival. */
  readonly rpcPollMs?: number;
  /** Join this fabric (another test target's) instead of making one: both serve one host. */
  readonly fabric?: UnixSimFabric;
}

/** The name of the lvstore exportLvol creates on the first drive. */
export const TEST_LVSTORE = "lvs0";

export interface TestTarget {
  readonly dir: string;
  readonly fabric: UnixSimFabric;
  readonly emulator: SpdkEmulator;
  /** A production SPDK client on the emulator's socket. */
  readonly rpc: SpdkClient;
  /** Creates the sparse file and exports it; returns the file path. */
  exportFile(spec: ExportSpec): Promise<string>;
  /**
   * Creates a thick lvol named `name` of spec.sizeBytes (rounded up to MiB) in TEST_LVSTORE (made
   * on the first drive on first use) and exports it as namespace 1; returns the lvol's bdev name.
   */
  exportLvol(spec: ExportSpec, name: string): Promise<string>;
  /**
   * Grows the backing file and re-registers the namespace at the new size (same nsid and UUID),
   * which the target announces to connected controllers like a namespace-attribute change.
   */
  growFile(spec: ExportSpec, newSizeBytes: number): Promise<void>;
  close(): Promise<void>;
}

const bdevName = (nqn: string) => `aio_${nqn.replace(/[^A-Za-z0-9]/g, "_")}`;
const MIB = 1024 * 1024;

/** Starts the target. Keep the returned directory short: fabric socket paths are limited. */
export async function startTestTarget(opts: TestTargetOptions = {}): Promise<TestTarget> {
  const dir = mkdtempSync(join(tmpdir(), "fab-"));
  const fabric = opts.fabric ?? createFabric(join(dir, "f"));
  const emulator = await startSpdkEmulator({
    socketPath: join(dir, "t.sock"),
    dataDir: join(dir, "d"),
    fabric,
    drives: opts.drives,
    clock: opts.clock,
    ...(opts.rpcPollMs === undefined ? {} : { rpcPollMs: opts.rpcPollMs }),
  });
  const rpc = new SpdkClient({ socketPath: emulator.socketPath, logger: silentLogger });
  return {
    dir,
    fabric,
    emulator,
    rpc,
    ...exportsOver(rpc, dir, opts.drives),
    async close() {
      await rpc.close();
      await emulator.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A test target running as its own process (lab/sim/spdk/nvmf-tgt.ts), and host daemons on its fabric. */
export interface TestTargetProcess
  extends Pick<TestTarget, "dir" | "rpc" | "exportFile" | "exportLvol" | "growFile"> {
  readonly fabricDir: string;
  /** The target ("nvmf_tgt") and every host started ("nvme-host/<name>"): kill, restart, logs. */
  readonly procs: ProcessTable;
  /**
   * Starts an NVMe-oF host daemon (FUSE namespace files under loop devices, every block a command
   * to the target) and returns the initiator that drives it. Needs root.
   */
  startHost(name: string): Promise<HostControlInitiator>;
  /** Stops the hosts, then the target; removes the directory. */
  close(): Promise<void>;
}

/** Starts the target as a child process; `drives` as for startTestTarget. */
export async function startTestTargetProcess(
  opts: { drives?: readonly SimDrive[] } = {},
): Promise<TestTargetProcess> {
  const dir = mkdtempSync(join(tmpdir(), "fab-"));
  const fabricDir = join(dir, "f");
  const procs = new ProcessTable(dir);
  const socketPath = join(dir, "t.sock");
  const drivesFile = join(dir, "drives.json");
  writeFileSync(drivesFile, JSON.stringify(opts.drives ?? []));
  let rpc: SpdkClient | undefined;
  const close = async () => {
    await rpc?.close();
    await procs.stopAll();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await startTargetProcess(procs, {
      name: "nvmf_tgt",
      socketPath,
      dataDir: join(dir, "d"),
      fabricDir,
      drivesFile,
    });
    rpc = new SpdkClient({ socketPath, logger: silentLogger });
  } catch (err) {
    await close();
    throw err;
  }
  return {
    dir,
    fabricDir,
    procs,
    rpc,
    ...exportsOver(rpc, dir, opts.drives),
    startHost: (name) =>
      startHostProcess(procs, {
        name: `nvme-host/${name}`,
        fabricDir,
        stateDir: join(dir, "h", name),
        socketPath: join(dir, "h", `${name}.sock`),
      }),
    close,
  };
}

/** exportFile, exportLvol and growFile over the target's RPC socket, files kept under `dir`. */
function exportsOver(
  rpc: SpdkClient,
  dir: string,
  drives: readonly SimDrive[] | undefined,
): Pick<TestTarget, "exportFile" | "exportLvol" | "growFile"> {
  const transports = new Set<string>();
  let lvstore: Promise<void> | undefined;
  const addNamespace = async (spec: ExportSpec, file: string) => {
    await rpc.call("bdev_aio_create", {
      name: bdevName(spec.nqn),
      filename: file,
      block_size: 4096,
      uuid: spec.uuid,
    });
    await rpc.call("nvmf_subsystem_add_ns", {
      nqn: spec.nqn,
      namespace: { bdev_name: bdevName(spec.nqn), nsid: 1, uuid: spec.uuid },
    });
  };
  /** Subsystem, namespace 1 (added by `addNs`), listener and hosts, in the agent's order. */
  const exportWith = async (spec: ExportSpec, addNs: () => Promise<void>) => {
    const trtype = (spec.transport ?? "tcp").toUpperCase();
    if (!transports.has(trtype)) {
      await rpc.call("nvmf_create_transport", { trtype });
      transports.add(trtype);
    }
    await rpc.call("nvmf_create_subsystem", {
      nqn: spec.nqn,
      serial_number: "DISTORT0001",
      ...(spec.minCntlid === undefined ? {} : { min_cntlid: spec.minCntlid }),
    });
    await addNs();
    await rpc.call("nvmf_subsystem_add_listener", {
      nqn: spec.nqn,
      listen_address: {
        trtype,
        adrfam: (spec.traddr ?? "127.0.0.1").includes(":") ? "IPv6" : "IPv4",
        traddr: spec.traddr ?? "127.0.0.1",
        trsvcid: spec.trsvcid ?? "4420",
      },
    });
    for (const host of spec.hosts) await rpc.call("nvmf_subsystem_add_host", { nqn: spec.nqn, host });
  };
  const ensureLvstore = async () => {
    const drive = drives?.[0];
    if (drive === undefined) throw new Error("exportLvol needs a drive in startTestTarget({ drives })");
    await rpc.call("bdev_nvme_attach_controller", {
      name: "Nvme0",
      trtype: "PCIe",
      traddr: drive.pciAddress,
    });
    await rpc.call("bdev_lvol_create_lvstore", {
      bdev_name: "Nvme0n1",
      lvs_name: TEST_LVSTORE,
      cluster_sz: 4 * MIB,
    });
  };
  return {
    async exportFile(spec) {
      const file = join(dir, `${bdevName(spec.nqn)}.img`);
      writeFileSync(file, "");
      truncateSync(file, spec.sizeBytes);
      await exportWith(spec, () => addNamespace(spec, file));
      return file;
    },
    async exportLvol(spec, name) {
      lvstore ??= ensureLvstore();
      await lvstore;
      const bdev = (await rpc.call("bdev_lvol_create", {
        lvs_name: TEST_LVSTORE,
        lvol_name: name,
        size_in_mib: Math.ceil(spec.sizeBytes / MIB),
        thin_provision: false,
        clear_method: "unmap",
      })) as string;
      await exportWith(spec, async () => {
        await rpc.call("nvmf_subsystem_add_ns", {
          nqn: spec.nqn,
          namespace: { bdev_name: bdev, nsid: 1, uuid: spec.uuid },
        });
      });
      return bdev;
    },
    async growFile(spec, newSizeBytes) {
      const file = join(dir, `${bdevName(spec.nqn)}.img`);
      await rpc.call("nvmf_subsystem_remove_ns", { nqn: spec.nqn, nsid: 1 });
      await rpc.call("bdev_aio_delete", { name: bdevName(spec.nqn) });
      truncateSync(file, newSizeBytes);
      await addNamespace(spec, file);
    },
  };
}
