// The drives of a lab kernel-backend node: one sparse file per drive, attached as a loop device with
// partition scanning (so parted's partitions get /dev/loopNpM nodes, as an NVMe namespace gets
// /dev/nvme0n1pM), named nvme<i>n1 for the agent (lab/sim/nvmet/device-names.ts).
import { closeSync, ftruncateSync, openSync } from "node:fs";
import { join } from "node:path";
import { hostExec, runChecked } from "../../lib/exec.ts";
import type { DeviceNames } from "../sim/nvmet/device-names.ts";

/** Attached loop devices of one node, by the nvme name the node's sysfs gives each drive. */
export interface LoopDrives {
  names: DeviceNames;
  /** Detaches every loop device; idempotent, never throws (a busy one stays for sweepLab). */
  detach(): Promise<void>;
}

/**
 * Creates `<dir>/<serial>.img` of each size (sparse) and attaches it; drive i becomes nvme<i>n1, in
 * the order buildDriveSysfs numbers controllers. On failure, what was attached is detached again.
 */
export async function attachLoopDrives(
  dir: string,
  drives: readonly { serial: string; sizeBytes: number }[],
): Promise<LoopDrives> {
  const attached: string[] = [];
  const names: Record<string, string> = {};
  const detach = async () => {
    for (const dev of attached.splice(0)) await hostExec.run(["losetup", "--detach", dev]).catch(() => {});
  };
  try {
    for (const [i, d] of drives.entries()) {
      const img = join(dir, `${d.serial}.img`);
      const fd = openSync(img, "w");
      try {
        ftruncateSync(fd, d.sizeBytes);
      } finally {
        closeSync(fd);
      }
      const dev = (
        await runChecked(hostExec, ["losetup", "--find", "--show", "--partscan", img], { timeoutMs: 30_000 })
      ).trim();
      attached.push(dev);
      names[`nvme${i}n1`] = dev.replace(/^\/dev\//, "");
    }
  } catch (err) {
    await detach();
    throw err;
  }
  return { names, detach };
}
