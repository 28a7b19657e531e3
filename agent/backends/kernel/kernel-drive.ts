// Finds the kernel's block device for a claimed drive: the PCIe NVMe controller in
// /sys/class/nvme whose serial matches, and its namespace 1 block device under /dev.

import { StorageError } from "../../../lib/errors.ts";
import type { HostFs } from "../../../lib/fs.ts";
import type { DeviceRef } from "../types.ts";
import { ConfigfsIo } from "./configfs-io.ts";

const SYS_NVME = "/sys/class/nvme";
// A controller directory lists its namespaces as nvme<ctrl>n1 or, with native multipath,
// nvme<subsys>c<ctrl>n1; the block device users open is then the head nvme<subsys>n1.
const NAMESPACE_1 = /^nvme(\d+)(?:c\d+)?n1$/;

/** The kernel objects behind a drive the nvme driver owns. */
export interface KernelDrive {
  /** Controller name in /sys/class/nvme ("nvme0"). */
  controller: string;
  /** Block device of namespace 1 ("/dev/nvme0n1"). */
  blockDevice: string;
}

/**
 * Looks the drive up by serial (its stable identity; PCI addresses move between slots) among PCIe
 * controllers only, so a fabrics controller showing the same serial is never mistaken for it.
 * Read-only. Throws StorageError("precondition") when no kernel controller has the serial (the
 * drive is bound to vfio-pci/uio for SPDK, or absent) or it has no namespace 1, and
 * StorageError("unavailable") when sysfs knows the namespace but /dev has no node for it yet.
 */
export async function findKernelDrive(fs: HostFs, device: DeviceRef): Promise<KernelDrive> {
  const io = new ConfigfsIo(fs);
  const wanted = device.serial.trim();
  if (wanted === "") throw new StorageError("invalid", `device ${device.name} has no serial number`);
  for (const ctrl of await io.list(SYS_NVME)) {
    const base = `${SYS_NVME}/${ctrl}`;
    if ((await io.readAttr(`${base}/transport`)) !== "pcie") continue;
    if ((await io.readAttr(`${base}/serial`))?.trim() !== wanted) continue;
    const ns = (await io.list(base)).map((e) => NAMESPACE_1.exec(e)).find((m) => m !== null);
    if (!ns) {
      throw new StorageError(
        "precondition",
        `drive ${device.name} (serial ${wanted}, ${ctrl}) has no namespace 1`,
        {
          details: { device: device.name, controller: ctrl },
        },
      );
    }
    const blockDevice = `/dev/nvme${ns[1]}n1`;
    if (!(await fs.exists(blockDevice))) {
      throw new StorageError("unavailable", `drive ${device.name}: ${blockDevice} has no device node yet`, {
        details: { device: device.name, controller: ctrl, blockDevice },
      });
    }
    return { controller: ctrl, blockDevice };
  }
  throw new StorageError(
    "precondition",
    `drive ${device.name} (serial ${wanted}, PCI ${device.pciAddress}) is not owned by the kernel nvme driver`,
    { details: { device: device.name, serial: wanted, pciAddress: device.pciAddress } },
  );
}
