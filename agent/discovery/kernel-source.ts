// Kernel-bound NVMe controllers, read from sysfs under a HostFs root: /sys/class/nvme/nvmeX for the
// controller (transport, address, serial, model, numa_node, state) and /sys/class/block/<disk> for
// its namespaces (nsid, size in 512-byte sectors). Only PCIe controllers are local hardware; those
// with a mounted namespace are left to the host.
import { errorMessage } from "../../lib/errors.ts";
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import { normalizePciAddress } from "../../lib/pci-address.ts";
import type { InventoryProblem, SkippedController, SourceController, SourceScan } from "./inventory.ts";
import { mountedDisks } from "./lsblk.ts";
import { checkSerial, isProblem, validateController } from "./validate-controller.ts";

export const SYS_CLASS_NVME = "/sys/class/nvme";
export const SYS_CLASS_BLOCK = "/sys/class/block";
/** sysfs `size` of a block device counts 512-byte sectors whatever the logical block size. */
const SECTOR_BYTES = 512;

const CONTROLLER_DIR = /^nvme(\d+)$/;
// nvme<ctrl>n<head> when the disk is the controller's own; nvme<subsys>c<ctrl>n<head> for the
// hidden per-path disk under native multipath, whose visible disk is nvme<subsys>n<head>.
const NAMESPACE_DISK = /^nvme(\d+)(?:c\d+)?n(\d+)$/;

/** A namespace as sysfs shows it. The disk name's last number is an instance, not the NSID. */
export interface KernelNamespace {
  /** Entry under the controller directory (nvme0n1 or nvme0c0n1). */
  readonly disk: string;
  /** The name lsblk and /dev use (the multipath head for a path disk). */
  readonly visibleDisk: string;
  readonly nsid: number;
  readonly bytes: number;
}

/** One controller's attributes, unvalidated; strings keep the kernel's padding. */
export interface KernelController {
  readonly name: string;
  readonly transport: string;
  readonly address?: string;
  readonly serial?: string;
  readonly model?: string;
  readonly numaNode?: number;
  readonly state?: string;
  readonly namespaces: readonly KernelNamespace[];
}

function isEnoent(err: unknown): boolean {
  return (err as { code?: unknown })?.code === "ENOENT";
}

async function attr(fs: HostFs, path: string): Promise<string> {
  // sysfs ends every value with one newline; padding before it is data and stays.
  return (await fs.readFile(path)).replace(/\n$/, "");
}

async function optionalAttr(fs: HostFs, path: string): Promise<string | undefined> {
  try {
    return await attr(fs, path);
  } catch (err) {
    if (isEnoent(err)) return undefined;
    throw err;
  }
}

function parseInteger(text: string, what: string): number {
  const t = text.trim();
  if (!/^-?\d+$/.test(t)) throw new Error(`${what} is ${JSON.stringify(text)}, not an integer`);
  const n = Number(t);
  if (!Number.isSafeInteger(n)) throw new Error(`${what} ${t} is out of range`);
  return n;
}

/** The visible disk of a namespace entry: nvme2c5n1 -> nvme2n1; nvme0n1 stays. Pure. */
export function visibleDiskName(disk: string): string {
  const m = NAMESPACE_DISK.exec(disk);
  return m ? `nvme${m[1]}n${m[2]}` : disk;
}

/** Controller directory names under /sys/class/nvme, in numeric order; none when the class is absent. */
export async function listKernelControllers(fs: HostFs): Promise<string[]> {
  let entries: string[];
  try {
    entries = await fs.readdir(SYS_CLASS_NVME);
  } catch (err) {
    // No nvme driver loaded: no kernel-bound controllers, which is a complete answer.
    if (isEnoent(err)) return [];
    throw err;
  }
  return entries
    .filter((e) => CONTROLLER_DIR.test(e))
    .sort((a, b) => Number(a.slice(4)) - Number(b.slice(4)));
}

/**
 * Reads one controller. Fabrics controllers stop after `transport` (nothing else about them is
 * needed). Rejects when an attribute that must exist cannot be read.
 */
export async function readKernelController(fs: HostFs, name: string): Promise<KernelController> {
  const dir = `${SYS_CLASS_NVME}/${name}`;
  const transport = (await attr(fs, `${dir}/transport`)).trim();
  if (transport !== "pcie") return { name, transport, namespaces: [] };
  const [address, serial, model, numa, state, entries] = await Promise.all([
    attr(fs, `${dir}/address`),
    attr(fs, `${dir}/serial`),
    optionalAttr(fs, `${dir}/model`),
    optionalAttr(fs, `${dir}/numa_node`),
    optionalAttr(fs, `${dir}/state`),
    fs.readdir(dir),
  ]);
  const disks = entries.filter((e) => NAMESPACE_DISK.test(e)).sort();
  const namespaces = await Promise.all(
    disks.map(async (disk): Promise<KernelNamespace> => {
      const base = `${SYS_CLASS_BLOCK}/${disk}`;
      const [nsid, sectors] = await Promise.all([attr(fs, `${base}/nsid`), attr(fs, `${base}/size`)]);
      const bytes = parseInteger(sectors, `${disk} size`) * SECTOR_BYTES;
      if (!Number.isSafeInteger(bytes))
        throw new Error(`${disk} size ${sectors.trim()} sectors is out of range`);
      return { disk, visibleDisk: visibleDiskName(disk), nsid: parseInteger(nsid, `${disk} nsid`), bytes };
    }),
  );
  return {
    name,
    transport,
    address,
    serial,
    ...(model === undefined ? {} : { model }),
    ...(numa === undefined ? {} : { numaNode: parseInteger(numa, `${name} numa_node`) }),
    ...(state === undefined ? {} : { state: state.trim() }),
    namespaces,
  };
}

/** Controller states in which the namespaces are being torn down: the picture is in flux. */
const TRANSITIONAL = new Set(["deleting", "deleting (no IO)"]);

/**
 * Turns read controllers into the kernel source's scan, given the mounted disks. Pure: the
 * decision table of kernel discovery (fabrics ignored, dead skipped, mounted skipped, the rest
 * validated).
 */
export function classifyKernelControllers(
  controllers: readonly KernelController[],
  mounted: ReadonlySet<string>,
): Pick<SourceScan, "controllers" | "problems" | "skipped" | "found"> {
  const out: SourceController[] = [];
  const problems: InventoryProblem[] = [];
  const skipped: SkippedController[] = [];
  let found = 0;
  for (const c of controllers) {
    // NVMe-oF controllers (tcp, rdma, fc, loop) reach remote storage: never local drives.
    if (c.transport !== "pcie") continue;
    found++;
    // Skipped drives carry their serial so the reporter can say why a known device went away.
    const s = checkSerial(c.serial);
    const serial = "serial" in s ? { serial: s.serial } : {};
    if (c.state === "dead") {
      skipped.push({ source: "kernel", controller: c.name, reason: "ControllerDead", ...serial });
      continue;
    }
    if (c.state !== undefined && TRANSITIONAL.has(c.state)) {
      const pci = c.address === undefined ? undefined : normalizePciAddress(c.address);
      problems.push({
        source: "kernel",
        controller: c.name,
        reason: "ControllerInTransition",
        message: `controller ${c.name} is ${c.state}`,
        ...serial,
        ...(pci === undefined ? {} : { pciAddress: pci }),
      });
      continue;
    }
    if (c.namespaces.some((ns) => mounted.has(ns.visibleDisk))) {
      skipped.push({ source: "kernel", controller: c.name, reason: "Mounted", ...serial });
      continue;
    }
    const ns1 = c.namespaces.find((ns) => ns.nsid === 1);
    const v = validateController({
      source: "kernel",
      controller: c.name,
      serial: c.serial,
      pciAddress: c.address,
      model: c.model,
      numaNode: c.numaNode,
      namespace1Bytes: ns1?.bytes,
      ...(ns1 ? { blockDevice: ns1.visibleDisk } : {}),
    });
    if (isProblem(v)) problems.push(v);
    else out.push(v);
  }
  return { controllers: out, problems, skipped, found };
}

/**
 * Scans the kernel source. Never rejects: an unreadable /sys/class/nvme or a failing lsblk makes
 * the whole source failed (without mount information no kernel drive is safe to offer); an
 * unreadable controller is a problem while the others are still reported.
 */
export async function scanKernel(
  fs: HostFs,
  exec: Exec,
  opts: { lsblkTimeoutMs?: number } = {},
): Promise<SourceScan> {
  const empty = { found: 0, controllers: [], problems: [], skipped: [] };
  let names: string[];
  try {
    names = await listKernelControllers(fs);
  } catch (err) {
    return {
      source: "kernel",
      ...empty,
      failure: { reason: "SysfsUnreadable", message: `${SYS_CLASS_NVME}: ${errorMessage(err)}` },
    };
  }
  const unreadable: InventoryProblem[] = [];
  const read: KernelController[] = [];
  await Promise.all(
    names.map(async (name) => {
      try {
        read.push(await readKernelController(fs, name));
      } catch (err) {
        // Best effort: with its address an operator can still exclude a drive that reads badly.
        const address = await attr(fs, `${SYS_CLASS_NVME}/${name}/address`).catch(() => undefined);
        const pci = address === undefined ? undefined : normalizePciAddress(address);
        unreadable.push({
          source: "kernel",
          controller: name,
          reason: "AttributeUnreadable",
          message: `${name}: ${errorMessage(err)}`,
          ...(pci === undefined ? {} : { pciAddress: pci }),
        });
      }
    }),
  );
  read.sort((a, b) => Number(a.name.slice(4)) - Number(b.name.slice(4)));
  unreadable.sort((a, b) => a.controller.localeCompare(b.controller));
  let mounted: Set<string> = new Set();
  if (read.some((c) => c.transport === "pcie")) {
    try {
      mounted = await mountedDisks(exec, opts.lsblkTimeoutMs);
    } catch (err) {
      return {
        source: "kernel",
        ...empty,
        found: read.length + unreadable.length,
        problems: unreadable,
        failure: {
          reason: "MountCheckFailed",
          message: `cannot tell which disks are mounted: ${errorMessage(err)}`,
        },
      };
    }
  }
  const classified = classifyKernelControllers(read, mounted);
  return {
    source: "kernel",
    ...classified,
    found: classified.found + unreadable.length,
    problems: [...unreadable, ...classified.problems],
  };
}
