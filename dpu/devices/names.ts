// The SPDK and host names of one volume's device on the DPU, all derived from the volume id, so a
// retried CreateDevice, a DeleteDevice without any saved state and a restarted plugin agree on them.
import { createHash } from "node:crypto";
import { join } from "node:path";

/** Prefix of every object the plugin creates in SNAP; operators can tell DISTORT's apart by it. */
export const NAME_PREFIX = "distort_";

/** What one volume's device is called in SNAP's SPDK and on the DPU's filesystem. */
export interface DeviceNames {
  /** bdev_nvme controller name (and bdev prefix). */
  readonly controller: string;
  /** The bdev SPDK creates for namespace 1 of the controller: `<controller>n1`. */
  readonly bdev: string;
  /** The AIO fsdev over the mounted filesystem (Filesystem volume mode). */
  readonly fsdev: string;
  /** Keyring key name and key file name of the DH-HMAC-CHAP secret. */
  readonly key: string;
}

/**
 * The names for `volumeId`. Pure. 20 hex digits (80 bits) of SHA-256 keep names short and only
 * `[a-z0-9_]` (valid SPDK bdev, fsdev, controller and keyring names, and safe file names) while a
 * collision between two volumes stays out of reach.
 */
export function namesFor(volumeId: string): DeviceNames {
  const h = createHash("sha256").update(`storage.distort.io/dpu\0${volumeId}`).digest("hex").slice(0, 20);
  const controller = `${NAME_PREFIX}${h}`;
  return { controller, bdev: `${controller}n1`, fsdev: `${controller}_fs`, key: `${controller}_dhchap` };
}

/** The directory a Filesystem volume is mounted on, under the configured mount root. Pure. */
export function mountDirFor(mountRoot: string, names: DeviceNames): string {
  return join(mountRoot, names.controller);
}
