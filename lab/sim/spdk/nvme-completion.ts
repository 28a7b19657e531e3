// How a failed bdev I/O reaches the initiator through the emulated nvmf target: SPDK's NVMe
// status for the bdev status, and the errno Linux's nvme driver makes of that status.

import { Errno, errnoOf } from "./rpc-error.ts";

/**
 * The errno the initiator sees for a bdev I/O that failed with `err`.
 *
 * A write to a thin lvol whose lvstore has no free cluster fails in lib/blob
 * (bs_allocate_cluster returns -ENOSPC, the user op is aborted with it); vbdev_lvol's
 * lvol_op_comp completes the bdev_io FAILED for any error but -ENOMEM; the nvmf layer
 * (nvmf_bdev_ctrlr_complete_cmd -> spdk_bdev_io_get_nvme_status) turns FAILED into Generic
 * Command Status / Internal Device Error (SCT 0h, SC 06h), not Capacity Exceeded; and the
 * kernel's nvme_error_status maps that to BLK_STS_IOERR, which the application reads as EIO.
 * So ENOSPC never reaches the host as itself. Other errnos of the emulator's bdevs keep their
 * existing meaning (each already stands for the status the real path gives).
 */
export function initiatorErrnoOf(err: unknown): number {
  const errno = errnoOf(err);
  return errno === Errno.ENOSPC ? Errno.EIO : errno;
}
