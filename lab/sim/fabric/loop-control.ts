// Changing what an attached loop device shows: its offset and size limit in the backing file, via
// LOOP_SET_STATUS64 (util-linux losetup sets them only when attaching, and --set-capacity never
// grows a device past its size limit). The lab initiator uses it to follow a namespace the target
// grew, as the kernel revalidates an NVMe namespace after a capacity change.
import { closeSync, openSync } from "node:fs";
import { StorageError } from "../../../lib/errors.ts";
import { ioctl } from "../spdk/libc.ts";

/** The loop device operations losetup has no command for. */
export interface LoopControl {
  /**
   * Makes `device` show `sizeLimit` bytes from `offset` of its backing file, at once and also while
   * it is open or mounted (the kernel writes back and drains the device first). Idempotent.
   * Rejects with StorageError "invalid" for a name that is not a loop device and "internal" when
   * the kernel refuses.
   */
  setExtent(device: string, offset: number, sizeLimit: number): Promise<void>;
}

// <linux/loop.h>
const LOOP_SET_STATUS64 = 0x4c04;
const LOOP_GET_STATUS64 = 0x4c05;
// struct loop_info64: lo_device, lo_inode, lo_rdevice, lo_offset, lo_sizelimit (__u64 each), four
// __u32, lo_file_name[64], lo_crypt_name[64], lo_encrypt_key[32], lo_init[2] (__u64).
const LOOP_INFO64_SIZE = 232;
const LO_OFFSET = 24;
const LO_SIZELIMIT = 32;

/** LoopControl on this host's kernel (needs CAP_SYS_ADMIN, like losetup). */
export const kernelLoopControl: LoopControl = {
  async setExtent(device, offset, sizeLimit) {
    if (!/^\/dev\/loop\d+$/.test(device)) throw new StorageError("invalid", `${device} is not a loop device`);
    let fd: number | undefined;
    try {
      fd = openSync(device, "r");
      // Read-modify-write, so flags and the recorded file name stay as losetup set them.
      const info = Buffer.alloc(LOOP_INFO64_SIZE);
      ioctl(fd, LOOP_GET_STATUS64, info);
      info.writeBigUInt64LE(BigInt(offset), LO_OFFSET);
      info.writeBigUInt64LE(BigInt(sizeLimit), LO_SIZELIMIT);
      ioctl(fd, LOOP_SET_STATUS64, info);
    } catch (err) {
      throw new StorageError(
        "internal",
        `cannot make ${device} show ${sizeLimit} bytes at ${offset}: ${(err as Error).message}`,
        { cause: err },
      );
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  },
};
