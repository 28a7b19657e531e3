// nbd_start_disk / nbd_stop_disk / nbd_get_disks (lib/nbd/nbd_rpc.c) over the emulator's NBD
// stand-in (../nbd.ts): the device paths are loop devices, the replies and errors SPDK's.
import * as v from "valibot";
import type { App } from "../app.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import type { NbdExports } from "../nbd.ts";
import { DECODE_FAILED_INTERNAL, decode, decodeOptional, str } from "../params.ts";
import { Errno, ErrnoError, RpcError } from "../rpc-error.ts";

/** The nbd methods of `app`, served by `nbd`. */
export function nbdMethods(app: App, nbd: NbdExports): MethodSpec[] {
  return [
    {
      name: "nbd_get_disks",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ nbd_device: v.optional(str) }),
          DECODE_FAILED_INTERNAL,
        );
        let disks = nbd.list();
        if (p.nbd_device !== undefined) {
          const one = nbd.find(p.nbd_device);
          if (!one) throw RpcError.errno(Errno.ENODEV);
          disks = [one];
        }
        return disks.map((d) => ({ nbd_device: d.device, bdev_name: d.bdevName }));
      },
    },
    {
      name: "nbd_stop_disk",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ nbd_device: str }), DECODE_FAILED_INTERNAL);
        if (!nbd.find(p.nbd_device)) throw RpcError.errno(Errno.ENODEV);
        // SPDK replies from the thread that ran the disconnect ioctl, once data is flushed.
        await ctx.defer();
        await nbd.stop(p.nbd_device);
        return true;
      },
    },
    {
      name: "nbd_start_disk",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ bdev_name: str, nbd_device: v.optional(str) }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.nbd_device !== undefined) {
          if (nbd.find(p.nbd_device)) throw RpcError.errno(Errno.EBUSY);
          // SPDK opens the /dev/nbdN asked for; a loop device cannot be chosen (losetup --find
          // picks it), so a named device is one this stand-in does not have, as SPDK says of a
          // path that is not /dev/nbd<N>.
          throw new RpcError(-Errno.ENODEV, `illegal nbd device ${p.nbd_device}`);
        }
        // spdk_bdev_open_ext of an unknown bdev: -ENODEV.
        const bdev = app.registry.get(p.bdev_name);
        if (!bdev) throw RpcError.errno(Errno.ENODEV);
        await ctx.defer();
        try {
          return await nbd.start(bdev);
        } catch (err) {
          if (err instanceof ErrnoError) throw RpcError.errno(err.errno);
          throw err;
        }
      },
    },
  ];
}
