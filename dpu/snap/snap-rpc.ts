// SNAP RPCs the plugin needs beyond lib/spdk's SpdkMethods: listing fsdevs (fsdev_get_fsdevs, an
// addition of SNAP's SPDK fork) and SPDK's NBD export of a bdev as a DPU kernel block device.
// Params are SPDK's own names; replies are parsed with valibot.
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";
import type { CallOptions, SpdkRpc } from "../../lib/spdk/client.ts";

const FsdevListSchema = v.array(
  v.looseObject({
    name: v.pipe(v.string(), v.minLength(1)),
    module_name: v.optional(v.string()),
    module_specific: v.optional(v.looseObject({ root_path: v.optional(v.string()) })),
  }),
);
export type SnapFsdev = v.InferOutput<typeof FsdevListSchema>[number];

const NbdDiskListSchema = v.array(
  v.looseObject({
    nbd_device: v.pipe(v.string(), v.startsWith("/dev/")),
    bdev_name: v.pipe(v.string(), v.minLength(1)),
  }),
);
export type NbdDisk = v.InferOutput<typeof NbdDiskListSchema>[number];

function parse<T extends v.GenericSchema>(method: string, schema: T, raw: unknown): v.InferOutput<T> {
  const r = v.safeParse(schema, raw);
  if (r.success) return r.output;
  const i = r.issues[0];
  throw new StorageError(
    "internal",
    `${method}: unexpected reply from SNAP at ${v.getDotPath(i) ?? "<result>"}: ${i.message}`,
  );
}

function isUnimplemented(err: unknown): boolean {
  return err instanceof StorageError && err.kind === "unimplemented";
}

/**
 * The extra SNAP calls, over the plugin's one SpdkRpc connection. Errors are the client's
 * (SpdkError with a kind, "timeout", "unavailable"); a reply of the wrong shape is "internal".
 */
export class SnapRpc {
  constructor(private readonly rpc: SpdkRpc) {}

  /**
   * fsdev_get_fsdevs, or undefined when this SNAP has no such method (upstream SPDK lacks it):
   * callers then cannot see fsdevs and rely on fsdev_aio_create's "exists" answer. Not cached:
   * SNAP may be upgraded under a running plugin, and the refusal costs one round trip.
   */
  async fsdevGetFsdevs(opts?: CallOptions): Promise<SnapFsdev[] | undefined> {
    try {
      return parse(
        "fsdev_get_fsdevs",
        FsdevListSchema,
        await this.rpc.call("fsdev_get_fsdevs", undefined, opts),
      );
    } catch (err) {
      if (!isUnimplemented(err)) throw err;
      return undefined;
    }
  }

  /** nbd_get_disks: every bdev exported through NBD and its /dev/nbdN. */
  async nbdGetDisks(opts?: CallOptions): Promise<NbdDisk[]> {
    return parse("nbd_get_disks", NbdDiskListSchema, await this.rpc.call("nbd_get_disks", undefined, opts));
  }

  /** nbd_start_disk: exports `bdevName` on a free /dev/nbdN chosen by SPDK; resolves with it. */
  async nbdStartDisk(bdevName: string, opts?: CallOptions): Promise<string> {
    const raw = await this.rpc.call("nbd_start_disk", { bdev_name: bdevName }, opts);
    return parse("nbd_start_disk", v.pipe(v.string(), v.startsWith("/dev/")), raw);
  }

  /** nbd_stop_disk: ends the export; the kernel device goes away. */
  async nbdStopDisk(nbdDevice: string, opts?: CallOptions): Promise<void> {
    parse(
      "nbd_stop_disk",
      v.literal(true),
      await this.rpc.call("nbd_stop_disk", { nbd_device: nbdDevice }, opts),
    );
  }
}
