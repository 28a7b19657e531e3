// How a Filesystem volume's SNAP bdev becomes a block device the DPU kernel can format and mount:
// a port, implemented in production by SPDK's NBD export inside SNAP (nbd_start_disk), so the
// volume keeps one NVMe-oF connection (SNAP's, with its host NQN, keys and multipath) in both modes.
import { StorageError } from "../../lib/errors.ts";
import type { SnapRpc } from "../snap/snap-rpc.ts";

/**
 * Kernel block devices showing SNAP bdevs. State lives where the export lives (SNAP, the kernel),
 * never in the implementation's memory, so a restarted plugin finds earlier exports. Calls for
 * different bdevs may run concurrently; callers serialise calls for one bdev.
 */
export interface BlockDevices {
  /** bdev name -> kernel device ("/dev/nbd0") for every bdev exported now. */
  list(): Promise<Map<string, string>>;
  /** Exports `bdev` unless it already is; resolves with its kernel device. Idempotent. */
  export(bdev: string): Promise<string>;
  /** Ends the export of `bdev`; one that is not exported counts as ended. */
  unexport(bdev: string): Promise<void>;
}

function isKind(err: unknown, kind: string): boolean {
  return err instanceof StorageError && err.kind === kind;
}

/**
 * BlockDevices on SNAP's NBD RPCs (nbd_get_disks / nbd_start_disk / nbd_stop_disk). A SNAP built
 * without NBD has nothing exported (list and unexport succeed, so Block volumes are unaffected)
 * and cannot export: "precondition", since only Filesystem volumes need it.
 */
export function snapNbdBlockDevices(snap: SnapRpc): BlockDevices {
  const list = async () => {
    try {
      return new Map((await snap.nbdGetDisks()).map((d) => [d.bdev_name, d.nbd_device]));
    } catch (err) {
      if (isKind(err, "unimplemented")) return new Map<string, string>();
      throw err;
    }
  };
  return {
    list,
    async export(bdev) {
      const have = (await list()).get(bdev);
      if (have !== undefined) return have;
      try {
        return await snap.nbdStartDisk(bdev);
      } catch (err) {
        if (!isKind(err, "unimplemented")) throw err;
        throw new StorageError(
          "precondition",
          "this SNAP cannot export a bdev to the DPU kernel (nbd_start_disk is missing), so Filesystem volumes cannot be mounted here",
          { cause: err },
        );
      }
    },
    async unexport(bdev) {
      const dev = (await list()).get(bdev);
      if (dev === undefined) return;
      try {
        await snap.nbdStopDisk(dev);
      } catch (err) {
        // Stopped by someone else between the list and the stop.
        if (isKind(err, "not-found")) return;
        throw err;
      }
    },
  };
}
